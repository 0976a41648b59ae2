"""The GitHub workflows parse, have the jobs and steps CI relies on, and call only real commands.

Every `pdcheck ...` command line in a `run:` script must name a command in `pdcheck.cli.COMMANDS`
and use only options that command declares; every `make X` must be a Makefile target (and
`make sweep SWEEP="..."` passes its arguments to `pdcheck sweep`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import yaml

from pdcheck.cli import COMMANDS, cli
from pdcheck.report import REPORT_MARKER

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def _steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def _runs(workflow: dict) -> list[str]:
    return [
        step["run"]
        for job in workflow["jobs"].values()
        for step in job.get("steps", [])
        if "run" in step
    ]


def _command_lines(script: str) -> list[list[str]]:
    """Shell words of each pdcheck/make command in a script (expressions and variables made inert)."""
    script = re.sub(r"\$\{\{[^}]*\}\}", "X", script)
    script = re.sub(
        r"<<'?(\w+)'?\n.*?\n\s*\1\n", "\n", script, flags=re.S
    )  # heredocs are not commands
    script = script.replace("\\\n", " ")
    found = []
    for line in script.splitlines():
        for part in re.split(r"&&|\|\||;|\|", line):
            words = shlex.split(part, comments=True)
            if words and (words[0].endswith("pdcheck") or words[0] == "make"):
                found.append(words)
    return found


def _pdcheck_invocations(workflow: dict) -> list[list[str]]:
    """`pdcheck` argv lists, including the ones `make sweep SWEEP=...` and `make race` run."""
    makefile = (ROOT / "Makefile").read_text()
    out = []
    for script in _runs(workflow):
        for words in _command_lines(script):
            if words[0] != "make":
                out.append(words[1:])
                continue
            target = words[1] if len(words) > 1 else "all"
            assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), (
                f"make {target}: no such target"
            )
            variables = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            if target == "sweep":
                out.append(["sweep", *shlex.split(variables.get("SWEEP", ""))])
    return out


def _check_invocation(argv: list[str]) -> None:
    name = argv[0]
    assert name in COMMANDS, f"pdcheck {name}: not a command (have {', '.join(COMMANDS)})"
    command = cli.get_command(click.Context(cli), name)
    declared = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for word in argv[1:]:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            assert option in declared, (
                f"pdcheck {name} has no option {option} (has {sorted(declared)})"
            )


@pytest.mark.parametrize("name", ["ci.yml", "pd-accuracy.yml"])
def test_workflow_calls_only_real_commands_and_options(name):
    """A renamed command or option breaks this test before it breaks CI."""
    invocations = _pdcheck_invocations(_load(name))
    assert invocations, "the workflow runs no pdcheck command"
    for argv in invocations:
        _check_invocation(argv)


def test_cpu_workflow_runs_tests_race_and_smoke_sweep_and_uploads_results():
    """ci.yml: ubuntu runner; make test, pdcheck race, the CPU smoke sweep, and the results artifact."""
    workflow = _load("ci.yml")
    assert {"push", "pull_request"} <= set(workflow["on"])
    job = workflow["jobs"]["cpu"]
    assert job["runs-on"].startswith("ubuntu")
    scripts = [s.get("run", "") for s in job["steps"]]
    order = [
        next(i for i, s in enumerate(scripts) if pattern in s)
        for pattern in ("make setup", "make test", "pdcheck race", "make sweep")
    ]
    assert order == sorted(order)
    assert "sweeps/cpu-smoke.yaml" in scripts[order[-1]]
    upload = next(
        s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")
    )
    assert upload["if"] == "always()" and upload["with"]["path"].startswith("results")


def test_gpu_workflow_shards_merges_reports_and_keeps_one_comment():
    """pd-accuracy.yml: configurable self-hosted labels, a shard matrix, merge, step summary, one PR comment."""
    workflow = _load("pd-accuracy.yml")
    assert {"plan", "shard", "report"} == set(workflow["jobs"])
    inputs = workflow["on"]["workflow_dispatch"]["inputs"]
    assert {"sweep", "shards", "runner_labels"} <= set(inputs)
    shard = workflow["jobs"]["shard"]
    assert "fromJSON(needs.plan.outputs.runner_labels)" in shard["runs-on"]
    assert shard["strategy"]["matrix"]["shard"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    labels_step = next(s for s in _steps(workflow, "plan") if s.get("id") == "labels")
    assert "vars.PDCHECK_GPU_RUNNER_LABELS" in labels_step["env"]["LABELS"]
    gate = next(s for s in shard["steps"] if s.get("uses") == "./")
    assert gate["with"]["shard"] == "${{ matrix.shard }}/${{ needs.plan.outputs.count }}"
    assert gate["with"]["sweep"] == "${{ env.SWEEP_FILE }}" and gate["with"]["gate"] == "false"
    assert "'pr'" in workflow["env"]["SWEEP_FILE"]

    report = workflow["jobs"]["report"]
    assert report["needs"] == ["plan", "shard"] and report["if"].startswith("always()")
    assert report["permissions"]["pull-requests"] == "write"
    scripts = "\n".join(s.get("run", "") for s in report["steps"])
    assert "pdcheck merge" in scripts and "GITHUB_STEP_SUMMARY" in scripts
    comment = next(
        s for s in report["steps"] if str(s.get("uses", "")).startswith("actions/github-script")
    )
    script = comment["with"]["script"]
    assert f"'{REPORT_MARKER}'" in script, (
        "the comment is found by the marker the report starts with"
    )
    assert "updateComment" in script and "createComment" in script
    assert any(
        str(s.get("uses", "")).startswith("actions/upload-artifact") for s in report["steps"]
    )
    gate = report["steps"][-1]
    assert gate["env"]["CODE"] == "${{ steps.report.outputs.exit_code }}"
    assert gate["run"] == 'exit "${CODE:-2}"', "no exit code is an infra error, not a pass"


def test_shipped_pr_sweep_exists():
    """The GPU workflow's default sweep file is in the repo."""
    assert (ROOT / "sweeps" / "pr.yaml").is_file()


def _module_invocations(scripts: list[str]) -> list[list[str]]:
    """`pdcheck` argv lists run as `"$PYTHON" -m pdcheck ...` (how action.yml calls the installed package)."""
    found = []
    for script in scripts:
        script = re.sub(
            r"\$\{[A-Z_]+:\+[^}]*\}", "", script
        )  # ${SHARD:+--shard "$SHARD"}: optional words
        for line in script.splitlines():
            for part in re.split(r"&&|\|\||;|\|", line):
                if "-m pdcheck" not in part:
                    continue
                words = shlex.split(part, comments=True)
                if (
                    words[1:3] == ["-m", "pdcheck"]
                    and len(words) > 3
                    and not words[3].startswith("-")
                ):
                    found.append(words[3:])
    return found


def test_action_has_its_inputs_outputs_and_calls_real_commands():
    """action.yml: composite; sweep, vLLM, shard and output in; exit code and report path out; report to the summary."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert {"sweep", "vllm", "shard", "output"} <= set(action["inputs"])
    assert set(action["outputs"]) == {"exit-code", "report"}
    scripts = [step["run"] for step in action["runs"]["steps"] if "run" in step]
    assert any("GITHUB_STEP_SUMMARY" in script for script in scripts)
    assert all("${{" not in script for script in scripts), (
        "inputs reach scripts through env, never spliced into code"
    )
    invocations = _module_invocations(scripts)
    assert {argv[0] for argv in invocations} >= {"sweep", "report"}
    for argv in invocations:
        _check_invocation(argv)


def test_release_builds_tests_and_publishes_on_tags_and_never_on_forks():
    """release.yml: tags only; every job guarded against forks (itself or through `needs`); the install
    test runs on the built archives before PyPI trusted publishing."""
    workflow = _load("release.yml")
    assert set(workflow["on"]) == {"push"} and set(workflow["on"]["push"]) == {"tags"}
    jobs = workflow["jobs"]

    def guarded(name: str) -> bool:
        job = jobs[name]
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        return "!github.event.repository.fork" in str(job.get("if", "")) or any(
            guarded(n) for n in needs
        )

    assert all(guarded(name) for name in jobs)
    test = jobs["install-test"]
    step = next(s for s in test["steps"] if "tests/install" in s.get("run", ""))
    assert "PDCHECK_DIST_DIR" in step["env"]
    publish = jobs["publish"]
    assert "install-test" in publish["needs"] and publish["permissions"] == {"id-token": "write"}
    assert any(
        str(s.get("uses", "")).startswith("pypa/gh-action-pypi-publish") for s in publish["steps"]
    )
    assert not any("password" in str(s.get("with", {})) for s in publish["steps"]), (
        "trusted publishing: no token"
    )


def test_dependabot_keeps_every_action_pin_current():
    """Dependabot watches the actions of the workflows and action.yml (directory /), weekly, in one group."""
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    (actions,) = [u for u in config["updates"] if u["package-ecosystem"] == "github-actions"]
    assert actions["directory"] == "/" and actions["schedule"]["interval"] == "weekly"
    assert [group["patterns"] for group in actions["groups"].values()] == [["*"]]
