"""`sweeps/one-gpu.yaml` planned for one GPU, as `--gpus 1` and as a simulated one- and two-GPU
machine (a fake nvidia-smi on PATH): what `pdcheck sweep --dry-run` prints for each server.
(Moved from tests/unit/sweep: a dry run probes the vLLM a python reaches in a child python.)"""

from __future__ import annotations

import re
from pathlib import Path

import huggingface_hub
import pytest

from pdcheck.cli import main
from tests.fakes.hub import FakeHub
from tests.fakes.nvidia_smi import fake_nvidia_smi

# Autouse here as in tests/unit/sweep: the dry run sizes the hub model's weights from the Hub.
from tests.unit.sweep.conftest import unreachable_hub  # noqa: F401

SERVER_LINE = re.compile(r"^# (prefill|decode|baseline)-0: http://\S+  (.*?)  log: ", re.M)


def _dry_run(capsys, tmp_path, *args: str) -> str:
    out = tmp_path / "never"
    assert main(["sweep", "one-gpu", "--dry-run", "--no-check-argv", "--out", str(out), *args]) == 0
    assert not out.exists()
    return capsys.readouterr().out


def _on_path(monkeypatch, tmp_path, gpus: int) -> None:
    """A fake nvidia-smi reporting `gpus` H100s, alone on PATH."""
    bin_dir = tmp_path / f"bin-{gpus}"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(Path(fake_nvidia_smi(tmp_path, gpus)))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_one_gpu_plans_every_server_on_gpu_0_with_its_memory_share(capsys, tmp_path):
    """`--gpus 1`: every server on GPU 0; a PD job's prefill and decode with 0.45 of its memory
    each, the decoder starting second; a baseline with the GPU to itself (vLLM's default)."""
    text = _dry_run(capsys, tmp_path, "--gpus", "1")
    servers = SERVER_LINE.findall(text)
    assert len(servers) == 3 + 6 * 2  # 3 shared baselines, 6 PD jobs
    for role, where in servers:
        expected = {
            "prefill": "GPU 0 shared, memory share 0.45",
            "decode": "GPU 0 shared, memory share 0.45, start stage 1",
            "baseline": "GPU 0 (its own)",
        }[role]
        assert where == expected, role
    assert "CUDA_VISIBLE_DEVICES=1" not in text
    assert text.count("--gpu-memory-utilization 0.45") == 12


def test_the_dry_run_says_what_the_weights_fetch_would_download(capsys, tmp_path, monkeypatch):
    """The one hub model is sized from the Hub's metadata (the tiny fixtures need nothing); with
    the Hub unreachable the dry run says it cannot tell, and exits 0 all the same."""
    hub = FakeHub()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    text = _dry_run(capsys, tmp_path, "--gpus", "1")
    weights = text[text.index("# weights a run fetches") :].splitlines()[1:]
    assert weights == [
        "# Qwen/Qwen3-0.6B (qwen3-0.6b): 1.51 GB to download (2 of 3 files not in the cache)"
    ]
    assert hub.downloads == []
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", FakeHub(reachable=False).snapshot_download
    )
    text = _dry_run(capsys, tmp_path, "--gpus", "1")
    assert (
        "# cannot tell: model Qwen/Qwen3-0.6B (qwen3-0.6b): the Hugging Face Hub could not" in text
    )


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_simulated_machine_plans_by_its_own_gpu_count(capsys, tmp_path, monkeypatch, gpus):
    """Without --gpus the dry run plans for the GPUs nvidia-smi reports: on one the PD servers
    share GPU 0, on two they run on GPUs of their own (no share flag at all)."""
    _on_path(monkeypatch, tmp_path, gpus)
    text = _dry_run(capsys, tmp_path)
    roles = {role: where for role, where in SERVER_LINE.findall(text)}
    if gpus == 1:
        assert roles["decode"] == "GPU 0 shared, memory share 0.45, start stage 1"
        return
    assert (roles["prefill"], roles["decode"]) == ("GPU 0 (its own)", "GPU 1 (its own)")
    assert "--gpu-memory-utilization" not in text
