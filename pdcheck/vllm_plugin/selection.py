"""Which requests get a fault: a seeded hash of the client's X-Request-Id.

Why a hash of the id and not a random draw: the choice must not depend on arrival order,
concurrency or TP rank. Every TP rank's worker sees the same receive and must corrupt the
same requests, and a question must be injected at concurrency 1 exactly when it is at 8, so
the analysis can check that the flagged questions are exactly the injected ones. pdcheck's
eval client sends `X-Request-Id: <run_tag>-q<index:05d>` and the run tag names the concurrency
and repeat (`pd-c8-r0-q00042`), so only the `q<index>` part is hashed when it is there: the same
questions are corrupted in every run of a cell.

vLLM rewrites the client's `X-Request-Id: <id>` into a worker request id
`cmpl-<id>-<prompt index>-<8 random hex chars>` (chat: `chatcmpl-<id>-<8 hex>`); the random
part would make the choice differ run to run, so it is stripped first. Pure functions.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["client_request_id", "is_selected"]

_QUESTION_SUFFIX = re.compile(r"-(q\d+)$")

# Tried in order. The random suffix is `random_uuid()[:8]` (hex, and all digits about 2% of
# the time, so the suffixed shapes go first); it is absent only with the deprecated
# VLLM_DISABLE_REQUEST_ID_RANDOMIZATION.
_WORKER_ID_SHAPES = (
    re.compile(r"^cmpl-(?P<client>.+)-\d+-[0-9a-f]{8}$"),
    re.compile(r"^chatcmpl-(?P<client>.+)-[0-9a-f]{8}$"),
    re.compile(r"^cmpl-(?P<client>.+)-\d+$"),
    re.compile(r"^chatcmpl-(?P<client>.+)$"),
)


def client_request_id(worker_request_id: str) -> str:
    """The X-Request-Id the client sent, recovered from a vLLM worker request id.

    An id of another shape is returned unchanged: it is still a stable key for selection.
    """
    for pattern in _WORKER_ID_SHAPES:
        if match := pattern.match(worker_request_id):
            return match.group("client")
    return worker_request_id


def is_selected(client_id: str, *, fraction: float, seed: int) -> bool:
    """True for a seeded, order-free fraction of ids: hash(seed, key) mapped to [0, 1) is below `fraction`.

    The key is the trailing `q<index>` of the id when it has one (any run of that question),
    else the whole id.
    """
    match = _QUESTION_SUFFIX.search(client_id)
    key = match.group(1) if match else client_id
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction
