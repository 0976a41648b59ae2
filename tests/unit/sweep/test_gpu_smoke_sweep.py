"""The GPU smoke's embedded sweep is a valid sweep of the shape docs/gpu-smoke.md promises."""

from __future__ import annotations

from pdcheck.config import expand_cells, load_sweep
from pdcheck.sweep.gpu_smoke import BATCH_INVARIANT, SMOKE_SWEEP


def test_the_embedded_sweep_is_two_arms_with_and_without_batch_invariance(tmp_path):
    path = tmp_path / "gpu-smoke.yaml"
    path.write_text(SMOKE_SWEEP)
    cells = expand_cells(load_sweep(path))
    assert sorted((c.arm.name, c.env.get(BATCH_INVARIANT, "")) for c in cells) == [
        ("fixes-on", ""),
        ("fixes-on", "1"),
        ("inject-zero", ""),
        ("inject-zero", "1"),
    ]
    assert {c.serving.platform for c in cells} == {"gpu"}
