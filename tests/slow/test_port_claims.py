"""Port slots are claimed across processes. (Moved from tests/unit/serving: it starts a process.)"""

from __future__ import annotations

import subprocess
import sys

from pdcheck.serving.ports import PortAllocator


def test_a_slot_claimed_by_another_process_is_skipped(tmp_path):
    """Two processes with the same bucket never get the same slot, even before any server binds it."""
    code = (
        "from pdcheck.serving.ports import PortAllocator\n"
        "alloc = PortAllocator(bucket=4)  # claims last as long as the allocator\n"
        "p = alloc.server_ports()\n"
        "print(p.http, flush=True)\n"
        "import sys; sys.stdin.read()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = int(other.stdout.readline())
        mine = PortAllocator(bucket=4).server_ports().http
        assert mine != theirs
    finally:
        other.stdin.close()
        other.wait(10)
