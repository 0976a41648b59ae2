"""GPU leases across processes: pytest-xdist workers take disjoint GPU sets through a file lock.

The lease table is a JSON file {gpu index: {pid, holder}} guarded by a FileLock. A lease whose
process is gone (a killed worker) is dropped, so a crash never strands GPUs. On a machine
without GPUs a lease is one exclusive token: CPU topologies run one at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from filelock import FileLock

CPU_TOKEN = "cpu"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class GpuLeases:
    def __init__(
        self,
        path: Path,
        indices: Sequence[int],
        *,
        poll_s: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.path = Path(path)
        self.indices = tuple(indices)
        self.poll_s = poll_s
        self._sleep = sleep
        self._lock = FileLock(str(self.path) + ".lock")

    def _read(self) -> dict[str, dict]:
        if not self.path.is_file():
            return {}
        table = json.loads(self.path.read_text() or "{}")
        return {k: v for k, v in table.items() if _alive(int(v["pid"]))}

    def _try_take(self, n: int, holder: str) -> tuple[int, ...] | None:
        with self._lock:
            table = self._read()
            if not self.indices:
                keys = [CPU_TOKEN] if CPU_TOKEN not in table else []
                taken: tuple[int, ...] | None = () if keys else None
            else:
                free = [i for i in self.indices if str(i) not in table]
                keys = [str(i) for i in free[:n]] if len(free) >= n else []
                taken = tuple(free[:n]) if len(free) >= n else None
            if taken is None:
                return None
            for key in keys:
                table[key] = {"pid": os.getpid(), "holder": holder}
            self.path.write_text(json.dumps(table))
            return taken

    def _release(self, taken: tuple[int, ...]) -> None:
        with self._lock:
            table = self._read()
            for key in [str(i) for i in taken] or [CPU_TOKEN]:
                table.pop(key, None)
            self.path.write_text(json.dumps(table))

    @contextlib.contextmanager
    def lease(self, n: int, *, holder: str) -> Iterator[tuple[int, ...]]:
        """Wait until `n` GPUs (or, without GPUs, the CPU token) are free; hold them for the block.

        A holder that needs more GPUs than exist waits for all of them: its servers share them
        (co-location, `pdcheck.serving.devices`).
        """
        n = min(n, len(self.indices))
        while (taken := self._try_take(n, holder)) is None:
            self._sleep(self.poll_s)
        try:
            yield taken
        finally:
            self._release(taken)
