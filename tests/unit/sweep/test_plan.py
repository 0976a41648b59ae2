"""The sweep plan: one server start per distinct configuration, shared baselines, GPU packing."""

from __future__ import annotations

import pytest

from pdcheck.config import expand_cells, parse_sweep
from pdcheck.errors import GpuInventoryError
from pdcheck.sweep.plan import distinct_server_configs, pack, plan_jobs


def _cells(**matrix):
    data = {
        "name": "t",
        "models": [{"name": "a", "path": "/m/a"}, {"name": "b", "path": "/m/b"}],
        "matrix": {"concurrency": [1, 8], **matrix},
    }
    return expand_cells(parse_sweep(data))


def test_each_distinct_server_config_starts_once_and_runs_every_unit():
    """2 models × 3 arms: 2 baseline jobs (arms do not touch the baseline), 6 PD jobs, all units covered."""
    cells = _cells(arms=["fixes-on", "inject-zero", "fixes-off"])
    jobs = plan_jobs(cells)
    assert [j.side for j in jobs].count("baseline") == 2
    assert [j.side for j in jobs].count("pd") == 6
    assert len(jobs) == distinct_server_configs(cells)
    units = {u for j in jobs for u in j.units}
    assert len(units) == 2 * 2 + 6 * 2  # owner baselines 2×2, PD 6×2
    baseline = jobs[0]
    assert baseline.side == "baseline" and len(baseline.shares) == 2


def test_restart_per_unit_plan_has_one_job_per_unit():
    """reuse=False (the benchmark's comparison runner) starts servers for every unit."""
    cells = _cells()
    jobs = plan_jobs(cells, reuse=False)
    assert len(jobs) == 2 * 2 * 2  # cells × sides × concurrency
    assert all(len(j.units) == 1 and not j.shares for j in jobs)


def test_build_fingerprint_splits_baselines():
    """Two vLLM builds never share a baseline, even with an identical configuration."""
    cells = _cells(arms=["fixes-on", "inject-zero"])
    jobs = plan_jobs(cells, build_fingerprint=lambda c: c.arm.name)
    assert [j.side for j in jobs].count("baseline") == 4


def test_decoder_only_arms_sit_next_to_each_other():
    """Arms that only change the decoder share a prefill key and are adjacent, so a prefiller can stay up."""
    cells = _cells(arms=["fixes-on", "fixes-off", "inject-zero"])
    pd = [j for j in plan_jobs(cells) if j.side == "pd" and j.cell.model.name == "a"]
    assert [j.cell.arm.name for j in pd] == ["fixes-on", "inject-zero", "fixes-off"]
    assert pd[0].prefill_key == pd[1].prefill_key != pd[2].prefill_key


def test_run_tags_are_unique_per_unit():
    """X-Request-Id run tags differ across side, concurrency, repeat and cell."""
    jobs = plan_jobs(_cells(arms=["fixes-on", "inject-zero"]))
    tags = [u.run_tag for j in jobs for u in j.units]
    assert len(tags) == len(set(tags))


def _topo(p, d):
    return dict(prefill_instances=[p], decode_instances=[d])


@pytest.mark.parametrize(
    ("gpus", "topo", "max_per_wave"),
    [
        (2, _topo(1, 1), 2),  # PD needs 2: one PD per wave, or baselines together
        (4, _topo(2, 2), 4),  # PD needs 4: alone, but baselines pack 4 to a wave
        (4, _topo(1, 2), 4),
        (8, _topo(2, 2), 8),
        (8, _topo(1, 2), 8),
        (8, _topo(2, 1), 8),
        (1, _topo(1, 1), 1),  # PD needs 2: alone on the one GPU, its servers sharing it
        (2, _topo(1, 2), 2),  # PD needs 3: alone on both
    ],
)
def test_pack_uses_disjoint_gpus_and_never_overfills(gpus, topo, max_per_wave):
    """In every wave the jobs' GPU sets are disjoint and within the inventory; all jobs are placed
    once; a job that needs more GPUs than exist has a wave and every GPU to itself."""
    cells = _cells(arms=["fixes-on", "inject-zero"], **topo)
    jobs = plan_jobs(cells)
    waves = pack(jobs, gpu_indices=list(range(gpus)))
    placed = [p.job for w in waves for p in w]
    assert sorted(map(id, placed)) == sorted(map(id, jobs))
    for wave in waves:
        used = [g for p in wave for g in p.gpus]
        assert len(used) == len(set(used)) and set(used) <= set(range(gpus))
        assert all(len(p.gpus) == min(p.job.gpus_needed, gpus) for p in wave)
        assert len(wave) == 1 or all(p.job.gpus_needed <= gpus for p in wave)
        assert len(wave) <= max_per_wave
    if gpus > 1:
        assert len(waves) < len(jobs), "several jobs must share a wave when GPUs allow"


def test_pack_refuses_a_server_wider_than_the_gpus():
    """Servers may share a GPU, TP ranks may not: a baseline at TP 2 on one GPU is refused before
    anything starts, naming the job and its TP."""
    jobs = plan_jobs(_cells(decode_tp=[2]))
    with pytest.raises(
        GpuInventoryError, match=r"baseline a-p1x1-d1x2-.* TP 2, which needs 2 GPUs"
    ):
        pack(jobs, gpu_indices=[0])


def test_pack_on_eight_gpus_runs_two_p2d2_topologies_at_once():
    """8 GPUs and P2/D2 TP1 cells: two PD topologies (4 GPUs each) fit in one wave."""
    cells = _cells(arms=["fixes-on", "inject-zero"], **_topo(2, 2))
    pd_jobs = [j for j in plan_jobs(cells) if j.side == "pd"]
    waves = pack(pd_jobs, gpu_indices=range(8))
    assert [len(w) for w in waves] == [2, 2]


def test_pack_on_cpu_starts_a_baseline_with_two_pd_jobs_that_share_a_prefiller():
    """No GPUs: no devices. A wave is a baseline and up to two PD jobs after it with one prefill
    key (a lone start leaves the second core idle); a third such job, or another prefill key,
    starts a new wave."""
    arms = ["fixes-on", "inject-zero", "inject-stale", "fixes-off"]
    waves = pack(plan_jobs(_cells(arms=arms)), gpu_indices=[])
    assert all(p.gpus == () for w in waves for p in w)
    assert [[(p.job.side, p.job.cell.arm.name) for p in w] for w in waves] == [
        [("baseline", "fixes-on"), ("pd", "fixes-on"), ("pd", "inject-zero")],
        [("pd", "inject-stale")],
        [("pd", "fixes-off")],
    ] * 2
    canary_first = plan_jobs(_cells(arms=["inject-zero"]))
    assert [len(w) for w in pack(canary_first, gpu_indices=[])] == [2, 2]
    one_per_unit = plan_jobs(_cells(arms=["fixes-on", "inject-zero"]), reuse=False)
    assert {len(w) for w in pack(one_per_unit, gpu_indices=[])} <= {1, 2}, (
        "jobs without a prefill key never share a wave beyond a baseline's"
    )
