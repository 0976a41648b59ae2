"""What the vLLM plugin leaves in a server's `PDCHECK_PLUGIN_DIR`, as both sides name it.

The plugin writes an activation marker per vLLM process (`activation-<pid>.json`) and adds to
its `did` list what that process did; serving reads the markers to trust an arm that needs the
plugin. Injected requests are logged one `InjectionRecord` line each in the injections file,
which the engine copies into the results store and `pdcheck compare --injections` reads. With
digests on, each worker writes one `DigestRecord` line per request and side to the digests file,
which the engine joins (`pdcheck.analysis.kv_digest`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec

ACTIVATION_GLOB = "activation-*.json"
INJECTIONS_FILE = "injections.jsonl"
# One line per request, side and TP rank with the digests of its transferred KV blocks.
DIGESTS_FILE = "kv-digests.jsonl"
# A vLLM scheduler was built in this process, after every fix switch was installed.
SCHEDULER_BUILT = "scheduler-built"
# This process registered NIXL KV caches with the KV-load hook (fault injection) installed.
KV_LOAD_HOOK_WITH_KV_CACHES = "kv-load-hook-with-kv-caches"


def activation_marker_name(pid: int) -> str:
    return f"activation-{pid}.json"


class ActivationMarker(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the plugin did in one vLLM process: an `activation-<pid>.json` file.

    Written whole and atomically by the process itself, whenever `did` grows; serving reads
    the markers to trust an arm (a hooked injection, a switched-off fix, the async scheduling
    vLLM resolved).
    """

    schema_version: int
    pid: int
    # For people reading it, never trusted: multiprocessing names a forked child after the fork.
    process_name: str
    switches: list[str]  # the fix and fault switches installed, e.g. "inject=zero-loaded-kv:…"
    did: list[str]  # SCHEDULER_BUILT, KV_LOAD_HOOK_WITH_KV_CACHES
    fixes_present: dict[str, bool] | None = None  # None: the vLLM was not inspected
    vllm_version: str | None = None
    # Each environment variable's name and a digest of its value (no secrets written).
    environ: dict[str, str] = {}
    forked_from: int | None = None  # the parent's pid, in a child forked after activation
    async_scheduling: bool | None = None  # as the scheduler resolved it (SCHEDULER_BUILT)
    tp_rank: int | None = None  # of the worker that registered its KV caches
    t: float | None = None


def read_activation_markers(plugin_dir: Path) -> list[ActivationMarker]:
    """The markers in `plugin_dir`, by file name; a file that is not a marker (a foreign or
    hand-edited one) is left out, so the arm's check then says which marker is missing."""
    decoder = msgspec.json.Decoder(ActivationMarker)
    markers = []
    for path in sorted(plugin_dir.glob(ACTIVATION_GLOB)):
        try:
            markers.append(decoder.decode(path.read_bytes()))
        except (OSError, msgspec.DecodeError):
            continue
    return markers


class InjectionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One injected request on one worker (TP rank): which request, which fault, which blocks.

    A line of the injections file, and an entry of a results folder's `kv/c<N>-r<k>.json`.
    """

    schema_version: int = 1
    # The client's X-Request-Id (`<run_tag>-q<index:05d>`): analysis maps it to the question.
    x_request_id: str
    request_id: str  # vLLM's internal request id on the worker
    kind: str
    fraction: float
    seed: int
    blocks: list[list[int]]  # per transfer group, the block ids overwritten (empty: untouched)
    pid: int
    tp_rank: int
    t: float


class DigestGroup(msgspec.Struct, frozen=True, kw_only=True):
    """The digests of one transfer group's blocks, in block order from `first_position`."""

    group: int  # transfer group: an attention group, or a Mamba/GDN state group
    first_position: int  # the first block's position from the start of the prompt
    digests: list[str]  # one 16-hex-digit keyed hash per block
    state: bool = False  # a Mamba/GDN state block, digested whole
    # Prefiller, attention groups: for each block it advertised, in the order advertised, the
    # position that block holds in the request's own block table (-1: not in the table). The
    # list is right when block k holds position `first_position + k`; the digests are of the
    # block table's blocks by position, so a decoder that loads a block into another position
    # than the one it holds mismatches there. None: not recorded (a state group, a decoder, or
    # a vLLM the hook cannot read the block table from).
    held_positions: list[int] | None = None
    block_size: int | None = None  # token slots per block: position p holds tokens p*size ...


class DigestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One request's transferred KV blocks on one side and TP rank: a line of the digests file.

    The two sides join on `prefill_request_id` (the decoder knows it as vLLM's
    `remote_request_id`) and `tp_rank`.
    """

    side: Literal["prefill", "decode"]
    prefill_request_id: str
    x_request_id: str  # the client's X-Request-Id: analysis maps it to the question
    tp_rank: int
    tp_size: int
    groups: list[DigestGroup]
    num_tokens: int | None = None  # prompt tokens the prefiller computed (both sides name it)
    remote_tp_size: int | None = None  # decoder: the prefiller's TP size
    load_tokens: int | None = None  # decoder: the tokens its scheduler takes the load to hold
    schema_version: int = 1
    request_id: str | None = None  # vLLM's id on this side, for people reading the file
    pid: int | None = None
    t: float | None = None


def decode_digest_lines(lines: Iterable[str | bytes]) -> list[DigestRecord]:
    """The records of a digests file's lines; a line of another shape raises msgspec's
    ValidationError naming the field."""
    decoder = msgspec.json.Decoder(DigestRecord)
    return [decoder.decode(line) for line in lines]
