"""`pdcheck up` and `pdcheck proxy` command lines: dry runs, refusals and their exit codes."""

from __future__ import annotations

import socket

from pdcheck.cli import main
from pdcheck.errors import ExitCode


def test_up_dry_run_prints_every_server_and_the_proxy(capsys, tmp_path):
    """--dry-run prints each server's env + argv and the proxy command, and starts nothing (exit 0)."""
    rc = main(
        [
            "up",
            "--model",
            "fixture:tiny-llama-random",
            "--platform",
            "cpu",
            "--serve-arg=--max-model-len",
            "--serve-arg=2048",
            "--run-dir",
            str(tmp_path),
            "--dry-run",
            "--no-check-argv",  # vLLM's parser runs in a child; tests/unit/test_cli_dialect.py
        ]
    )
    out = capsys.readouterr().out
    assert rc == ExitCode.OK
    assert out.count("pdcheck._vllm.launch serve") == 3 and "--max-model-len 2048" in out
    assert (
        '"kv_role":"kv_producer","kv_buffer_device":"cpu"' in out
        and "pdcheck proxy --prefill http://127.0.0.1:" in out
    )
    # The CPU-only idle back-off and the in-EngineCore model (TP 1), forked, show in a dry run, on every server.
    assert out.count("PDCHECK_IDLE_BACKOFF_MS=16") == 3 and "PDCHECK_SHM_SPIN_SLEEP_US" not in out
    assert (
        out.count("VLLM_ENABLE_V1_MULTIPROCESSING=0") == 3
        and out.count("--distributed-executor-backend uni") == 3
        and out.count("PDCHECK_ENGINE_CORE_START=fork") == 3
    )
    assert not (tmp_path / "logs").exists()


def test_up_needs_exactly_one_source(capsys):
    """Neither a sweep nor --model (or both) is a usage error, exit 3."""
    assert main(["up"]) == ExitCode.CONFIG
    assert main(["up", "sweeps/cpu-smoke.yaml", "--model", "x", "--dry-run"]) == ExitCode.CONFIG


def test_up_with_a_multi_cell_sweep_lists_the_cells(capsys):
    """A sweep with several cells and no --only is refused with the cell names (exit 3)."""
    assert main(["up", "cpu-smoke", "--dry-run"]) == ExitCode.CONFIG
    assert "tiny-llama-p1x1-d1x1-sync-fixes-on" in capsys.readouterr().err


def test_up_refuses_a_gpu_topology_without_gpus(capsys):
    """A GPU topology on a machine with no GPUs is refused before anything starts, naming the counts."""
    rc = main(
        ["up", "--model", "Qwen/Qwen3-0.6B", "--platform", "gpu", "--prefill-tp", "2", "--dry-run"]
    )
    assert rc == ExitCode.CONFIG
    assert "needs 4 GPUs" in capsys.readouterr().err


def test_proxy_on_a_taken_port_is_an_infra_error(capsys):
    """`pdcheck proxy --port P` with P taken fails at once with PortUnavailable (exit 2)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        rc = main(
            [
                "proxy",
                "--prefill",
                "http://127.0.0.1:1",
                "--decode",
                "http://127.0.0.1:2",
                "--port",
                str(port),
            ]
        )
    assert rc == ExitCode.INFRA
    assert f"127.0.0.1:{port} is already in use" in capsys.readouterr().err
