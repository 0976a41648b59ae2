"""`pdcheck validate default-gpu` prints the sweep-level pass points of the true discordance
(issue 42), beside the per-level cut rounded from the middle of its bracket. About a second of
exact lattice arithmetic, so here rather than in the unit tier."""

from __future__ import annotations

from pdcheck.cli import main


def test_validate_default_gpu_prints_the_sweep_pass_points(capsys):
    """The cut (8.4%) and the true d at which a clean default-gpu sweep passes 95% and 50% of
    the time (6.4%, 7.3%: an independent audit's simulation found the same)."""
    assert main(["validate", "default-gpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "at most d = 8.4% of their pairs (observed)" in out
    assert "passes the gate 95% of the time up to a true d = 6.4%" in out
    assert "50% of the time up to a true d = 7.3%" in out


def test_validate_prints_qwen35_cut_rounded_to_its_true_value(capsys):
    """The true cut is 10.62%: the print says 10.6%, not the 10.5% a truncated low end gave."""
    assert main(["validate", "qwen35-moe-repro"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "at most d = 10.6% of their pairs" in out
