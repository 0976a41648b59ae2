"""A stand-in for a `vllm serve` process, for lifecycle tests: it takes any argv and reads `--port`.

Run as `python stub_server.py <anything> --port P ...`, so it can replace the vLLM launcher in
a planned topology. What it does comes from `STUB_MODE`:
  ok            answer /health, /metrics and /v1/completions (with kv_transfer_params)
  crash         print a message and exit 3 at once
  never-healthy listen, but answer /health with 503 forever
  ignore-term   like ok, but ignore SIGTERM (teardown must escalate to SIGKILL)
  stops-child   like ok, but its child is a python process that records who sent it SIGTERM
                (in `<port>.term-sender`), and on SIGTERM the stub stops the child itself and
                exits, as vLLM's API server stops its engine core
It forks a child (`sleep`) first, like vLLM's engine process, and writes both pids to
`$STUB_PID_DIR/<port>.pids`, so tests can check that teardown leaves no process behind, and
its environment to `$STUB_PID_DIR/<port>.env.json`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _port(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1])


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, payload: dict | str) -> None:
        body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/plain" if isinstance(payload, str) else "application/json"
        )
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(503 if self.mode == "never-healthy" else 200, {})
        elif self.path == "/metrics":
            self._send(
                200, 'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 0.0\n'
            )
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        params = body.get("kv_transfer_params") or {}
        answer = {
            "choices": [{"index": 0, "text": f"stub {os.getpid()}", "finish_reason": "length"}],
            "kv_transfer_params": {"remote_engine_id": str(os.getpid())}
            if params.get("do_remote_decode")
            else None,
        }
        self._send(200, answer)


# Waits for SIGTERM with sigwaitinfo, which says which process sent it.
_SENDER_RECORDING_CHILD = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("blocked", flush=True)
info = signal.sigwaitinfo({signal.SIGTERM})
with open(sys.argv[1], "w") as f:
    f.write(str(info.si_pid))
"""


def main() -> None:
    mode = os.environ.get("STUB_MODE", "ok")
    port = _port(sys.argv)
    print(f"stub server mode={mode} port={port}", flush=True)
    if mode == "crash":
        print("RuntimeError: the stub was told to crash at start", flush=True)
        sys.exit(3)
    pid_dir = os.environ.get("STUB_PID_DIR")
    if mode == "stops-child":
        child = subprocess.Popen(
            [sys.executable, "-c", _SENDER_RECORDING_CHILD, f"{pid_dir}/{port}.term-sender"],
            stdout=subprocess.PIPE,
        )
        assert child.stdout is not None
        child.stdout.readline()  # SIGTERM is blocked in the child from here on

        def stop_child(_signum: int, _frame: object) -> None:
            child.terminate()
            child.wait()
            os._exit(0)

        signal.signal(signal.SIGTERM, stop_child)
    else:
        child = subprocess.Popen(["sleep", "600"])
    if pid_dir:
        with open(os.path.join(pid_dir, f"{port}.env.json"), "w") as f:
            json.dump(dict(os.environ), f)
        with open(os.path.join(pid_dir, f"{port}.pids"), "w") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _Handler.mode = mode
    ThreadingHTTPServer(("127.0.0.1", port), _Handler).serve_forever()


if __name__ == "__main__":
    main()
