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
from typing import Any

from pdcheck.contracts.vllm_programs import IMPORT_ENV_PREFIX


class _RecordingEnviron(os._Environ):
    """`os.environ` over the same data, remembering every name looked up."""

    def __init__(self, inner: Any) -> None:
        super().__init__(
            inner._data, inner.encodekey, inner.decodekey, inner.encodevalue, inner.decodevalue
        )
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def probe() -> dict[str, Any]:
    from pdcheck._vllm.forkserver import preload

    original = os.environ
    recording = _RecordingEnviron(original)
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
