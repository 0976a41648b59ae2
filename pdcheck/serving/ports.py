"""Port allocation: HTTP, NIXL side-channel and VLLM_PORT ranges that never collide.

Each server takes a *slot*. A slot maps to one HTTP port, a block of side-channel ports
(vLLM listens on the base + the engine's data-parallel index, one listener per engine that
serves every TP rank; pdcheck runs one engine per server, so it uses the base alone and the
rest of the block is spare) and a block of VLLM_PORT ports (vLLM scans upward from the base
for its internal sockets). The three ranges are disjoint, sit below Linux's
ephemeral range (32768+), and are split per pytest-xdist worker, so parallel workers never
pick the same ports. Inside one process a shared counter hands out slots, so several
topologies at once never collide either. Across processes (two pdcheck runs, or a test and a
sweep, on one machine) a slot is claimed with an exclusive `flock` on a file in
`$TMPDIR/pdcheck-ports/`, held until its server stops (`release_claims`) or the process exits:
a bind check alone is not enough, because vLLM binds its port only after a minute of imports,
and another process checking in that minute would see the port free. Every candidate is also
checked free by binding 127.0.0.1; a taken or claimed slot is skipped. Claims of stopped
servers are given up so that a long sweep, which cycles through its bucket, does not end up
holding every slot of it while a second pdcheck on the machine needs one.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pdcheck.errors import PortUnavailable
from pdcheck.serving.argv import ServerPorts

SLOTS_PER_WORKER = 100
WORKER_BUCKETS = 8  # xdist workers gw0..gw7 get disjoint ranges; gw8 shares gw0's (and so on)
HTTP_BASE = 20000  # 20000-20799
SIDE_CHANNEL_BASE = (
    21000  # 21000-27399: 8 ports per slot, the first one used (one engine per server)
)
SIDE_CHANNEL_STRIDE = 8
VLLM_PORT_BASE = 10000  # 10000-17999: 10 ports per slot
VLLM_PORT_STRIDE = 10


def worker_bucket(env: dict[str, str] | None = None) -> int:
    """0 outside xdist or for gw0; N mod 8 for gwN."""
    worker = (os.environ if env is None else env).get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker.removeprefix("gw")
    return int(digits) % WORKER_BUCKETS if digits.isdigit() else 0


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when `port` can be bound on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free_port(port: int, host: str = "127.0.0.1", *, what: str = "port") -> int:
    """`port` if it is free, else `PortUnavailable` naming it (for ports the user fixed)."""
    if not is_port_free(port, host):
        raise PortUnavailable(
            f"{what} {host}:{port} is already in use; pick another port or stop what holds it"
        )
    return port


# eq=False: allocators are compared (and kept in `_ALLOCATORS`) by identity.
@dataclass(eq=False)
class PortAllocator:
    """Hands out slots from this worker's ranges; thread-safe, one shared per process by default."""

    bucket: int
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()
        self._claims: dict[int, int] = {}  # slot -> fd holding its flock while this allocator lives
        weakref.finalize(self, _release, self._claims)
        _ALLOCATORS.add(self)

    def server_ports(self, *, tp: int = 1) -> ServerPorts:
        """Ports for one vLLM server with `tp` ranks, all checked free."""
        if not 1 <= tp <= SIDE_CHANNEL_STRIDE:
            raise ValueError(f"tensor-parallel size {tp} is outside 1..{SIDE_CHANNEL_STRIDE}")
        return self._take(
            lambda p: all(is_port_free(x, self.host) for x in (p.http, p.vllm_port, p.side_channel))
        )

    def http_port(self) -> int:
        """One HTTP port (for a proxy)."""
        return self._take(lambda p: is_port_free(p.http, self.host)).http

    def _take(self, usable) -> ServerPorts:
        with self._lock:
            for _ in range(SLOTS_PER_WORKER):
                slot = self._next
                self._next = (self._next + 1) % SLOTS_PER_WORKER
                ports = self.slot_ports(slot)
                if self._claim(slot, ports.http) and usable(ports):
                    return ports
        raise PortUnavailable(
            f"all {SLOTS_PER_WORKER} port slots of range bucket {self.bucket} are in use "
            f"(HTTP {self.slot_ports(0).http}-{self.slot_ports(SLOTS_PER_WORKER - 1).http}); stop leftover servers"
        )

    def _claim(self, slot: int, http_port: int) -> bool:
        """True if this process holds (or now takes) the slot's cross-process claim."""
        if slot in self._claims:
            return True
        claims = Path(tempfile.gettempdir()) / "pdcheck-ports"
        claims.mkdir(exist_ok=True)
        fd = os.open(claims / f"{http_port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._claims[slot] = fd
        return True

    def release(self, http_ports: Iterable[int]) -> None:
        """Give up the claims on the slots of `http_ports`, if this allocator holds them."""
        wanted = set(http_ports)
        with self._lock:
            for slot in [s for s in self._claims if self.slot_ports(s).http in wanted]:
                os.close(self._claims.pop(slot))

    def slot_ports(self, slot: int) -> ServerPorts:
        index = self.bucket * SLOTS_PER_WORKER + slot
        return ServerPorts(
            http=HTTP_BASE + index,
            side_channel=SIDE_CHANNEL_BASE + index * SIDE_CHANNEL_STRIDE,
            vllm_port=VLLM_PORT_BASE + index * VLLM_PORT_STRIDE,
        )


def _release(claims: dict[int, int]) -> None:
    for fd in claims.values():
        os.close(fd)
    claims.clear()


_ALLOCATORS: weakref.WeakSet[PortAllocator] = weakref.WeakSet()


def release_claims(http_ports: Iterable[int]) -> None:
    """Give up this process's claims on the slots of `http_ports`, whichever allocator took them:
    their servers (or proxy) have stopped. The slots stay usable here and become usable to other
    processes; a port still bound is skipped by the bind check, as any taken port is."""
    ports = list(http_ports)
    for allocator in list(_ALLOCATORS):
        allocator.release(ports)


_default: PortAllocator | None = None
_default_lock = threading.Lock()


def default_allocator() -> PortAllocator:
    """The process-wide allocator for this xdist worker (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PortAllocator(bucket=worker_bucket())
        return _default
