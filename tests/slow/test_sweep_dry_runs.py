"""What `pdcheck sweep --dry-run` prints for a cell's servers. (Moved from tests/unit: a dry run
probes the vLLM a python reaches in a child python.)"""

from __future__ import annotations

from pdcheck.cli import main
from pdcheck.contracts import batch_invariance

VAR = batch_invariance.VARIABLE


def test_dry_run_shows_the_variable_on_every_server_of_an_exact_gpu_cell(
    tmp_path, capsys, monkeypatch
):
    """`--dry-run --gpus N`: the exact cell's prefill, decode and baseline lines all carry
    VLLM_BATCH_INVARIANT=1 and its decision line; the hybrid's carry none and say why."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nmodels:\n  - {name: dense, path: /models/dense}\n"
        "  - {name: hyb, path: /models/hyb, kind: hybrid}\n"
        "serving: {platform: gpu, bit_exact: true}\n"
    )
    out = tmp_path / "never"
    assert (
        main(["sweep", str(path), "--dry-run", "--gpus", "6", "--no-check-argv", "--out", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    dense, hybrid = text.split("## hyb-")
    servers = [line for line in dense.splitlines() if " serve /models/dense" in line]
    assert len(servers) == 3 and all(f"{VAR}=1 " in line for line in servers)
    assert "# bit-exact: judged exactly" in dense
    assert VAR + "=1" not in hybrid and "no Mamba/GDN backend" in hybrid


def test_dry_run_shows_each_jobs_placement_group(capsys):
    """`--dry-run --backend ray` prints the placement group every job would ask for, with no
    cluster and without Ray's import."""
    assert main(["sweep", "cpu-smoke", "--backend", "ray", "--dry-run", "--no-check-argv"]) == 0
    text = capsys.readouterr().out
    assert "# backend: ray" in text
    assert "STRICT_SPREAD [prefill-0" in text and "STRICT_PACK [baseline-0" in text
    assert text.count("# ray placement group (pd ") == 6  # one per cell: cpu-smoke has 6
