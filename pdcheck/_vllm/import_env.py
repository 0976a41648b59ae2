"""`python -m pdcheck._vllm.import_env`: which environment variables importing vLLM reads and sets.

The fork server (`pdcheck._vllm.forkserver`) imports vLLM's CLI once and forks servers whose
environments differ only in variables that import never reads (`pdcheck.contracts.environment
.read_after_fork`). This program runs the fork server's own `preload()` with `os.environ`
recording every read, and prints `{"read": [...], "set": {...}, "removed": [...], "error"}` as
one JSON line after `IMPORT_ENV_PREFIX` (pdcheck.contracts.vllm_programs), so a vLLM release that starts reading a per-server
variable at import is caught before a fork server hands a server a stale value.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

from pdcheck.contracts.vllm_programs import IMPORT_ENV_PREFIX


class EnvironRecorder(os._Environ):
    """`os.environ` over the same data, remembering every name looked up by name.

    A walk over the whole environment (`dict(os.environ)`, `.items()`, `.copy()`) looks every
    name up; counting those would flag whatever variables the probing shell happens to have
    (CI's PDCHECK_GSM8K_DIR) rather than what vLLM reads. A walk iterates the names and then
    looks each up in the order it was given them (CPython's dict() takes the whole list first),
    so a lookup of the next name a walk yielded is the walk's, not a read; any other lookup ends
    the walk. Such walks at import are snapshots nobody serving uses (wsgiref's handler
    defaults), and pdcheck's own diff of the environment around the import is one.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(
            inner._data, inner.encodekey, inner.decodekey, inner.encodevalue, inner.decodevalue
        )
        self.read: set[str] = set()
        self._walked: deque[str] = deque()

    def __iter__(self) -> Iterator[str]:
        for key in super().__iter__():
            self._walked.append(key)
            yield key

    def __getitem__(self, key: str) -> str:
        if self._walked and self._walked[0] == key:
            self._walked.popleft()
        else:
            self._walked.clear()
            self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def probe() -> dict[str, Any]:
    from pdcheck._vllm.forkserver import preload

    original = os.environ
    recording = EnvironRecorder(original)
    os.environ = recording  # noqa: B003  (the same data, read through a recorder)
    try:
        error, imported = preload()
    finally:
        os.environ = original  # noqa: B003
    return {
        "read": sorted(k for k in recording.read if isinstance(k, str)),
        "set": imported.set,
        "removed": list(imported.removed),
        "error": error,
    }


def main() -> None:
    print(IMPORT_ENV_PREFIX + json.dumps(probe()), flush=True)


if __name__ == "__main__":
    main()
