"""The sweep's race harness runs in the background, beside the servers: started on entry, waited
for by `outcome()`, stopped when the sweep leaves early, and judged infra when it overruns."""

from __future__ import annotations

import os
import stat
import textwrap
import time

import pytest

from pdcheck.analysis.verdict import Status
from pdcheck.config.schema import RaceSettings
from pdcheck.sweep.race import RaceRun


def _stand_in(tmp_path, body: str) -> str:
    """A stand-in interpreter running `body` (sh) after moving its arguments to the --json path."""
    script = tmp_path / "python"
    script.write_text(
        '#!/bin/sh\nwhile [ "$1" != "--out" ]; do shift; done\n' + textwrap.dedent(body)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _wait_for(path, deadline_s: float = 30.0) -> str:
    end = time.monotonic() + deadline_s
    while not path.is_file() or not path.read_text().strip():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text().strip()


def test_the_harness_runs_while_the_sweep_goes_on(tmp_path):
    """It passes only if it sees a file the sweep writes after starting it: a harness run to
    the end on entry would wait 30 s for that file and exit 2 (infra)."""
    go = tmp_path / "go"
    python = _stand_in(
        tmp_path,
        f"""
        for i in $(seq 1 600); do
          if [ -f {go} ]; then echo '{{"variants": []}}' > $2; exit 0; fi
          sleep 0.05
        done
        exit 2
        """,
    )
    with RaceRun(RaceSettings(), python=python, out_dir=tmp_path) as harness:
        go.write_text("servers started")
        outcome = harness.outcome()
    assert (outcome.status, outcome.exit_code, outcome.result) == (Status.PASS, 0, {"variants": []})


def test_the_harness_yields_the_cpu_to_the_servers(tmp_path):
    """It runs niced, so it takes only the CPU the servers' starts and evals leave idle."""
    pid_file = tmp_path / "pid"
    python = _stand_in(tmp_path, f"echo $$ > {pid_file}\nexec sleep 600\n")
    with RaceRun(RaceSettings(), python=python, out_dir=tmp_path):
        pid = int(_wait_for(pid_file))
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(
            19, os.getpriority(os.PRIO_PROCESS, 0) + 10
        )


def test_leaving_the_sweep_early_stops_the_harness(tmp_path):
    pid_file = tmp_path / "pid"
    python = _stand_in(tmp_path, f"echo $$ > {pid_file}\nexec sleep 600\n")
    with pytest.raises(KeyboardInterrupt), RaceRun(RaceSettings(), python=python, out_dir=tmp_path):
        pid = int(_wait_for(pid_file))
        raise KeyboardInterrupt
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left running


def test_a_harness_past_its_timeout_is_stopped_and_judged_infra(tmp_path):
    python = _stand_in(tmp_path, "exec sleep 600\n")
    with RaceRun(RaceSettings(), python=python, out_dir=tmp_path, timeout_s=1) as harness:
        outcome = harness.outcome()
    assert outcome.status is Status.INFRA and outcome.exit_code is None
    assert "did not finish within 1 s" in outcome.reason
