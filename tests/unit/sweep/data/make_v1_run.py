"""How v1-run/ was made: a results folder written by pdcheck at main c0809ea (schema version 1).

One clean cell against a PD that answers every question wrong, with --early-stop: c1 stops
early, c4 carries its verdict. Run with main's checkout first on the path:

    PYTHONPATH=<main checkout> PDCHECK_GSM8K_DIR=... python tests/unit/sweep/data/make_v1_run.py OUT
"""

import re
import sys
import textwrap
from pathlib import Path

from pdcheck.cli import main
from pdcheck.config import EvalSettings
from pdcheck.evals import load_task
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion

out = Path(sys.argv[1])
task = load_task(EvalSettings(task="gsm8k-synth"))
gold = {ex.question.strip(): ex.final_answer for ex in task.test[:16]}
LAST = re.compile(r"Question: ([^\n]*)\nAnswer:\s*$")


def answering(wrong):
    def respond(body):
        q = LAST.search(body.get("prompt", "")).group(1).strip()
        a = int(gold[q]) + (1 if wrong else 0)
        return echo_completion(body, f" It is {a}.\n#### {a}")

    return respond


sweep = out.parent / "v1.yaml"
sweep.write_text(
    textwrap.dedent("""\
    schema_version: 1
    name: v1
    models:
      - name: fake
        path: /nonexistent/fake-model
    matrix:
      arms: [fixes-on]
      concurrency: [1, 4]
    eval:
      task: gsm8k-synth
      limit: 16
      max_tokens: 16
    analysis:
      margin_pts: 40
    """)
)
with FakeOpenAIServer(answering(False)) as base, FakeOpenAIServer(answering(True)) as bad:
    code = main(
        [
            "sweep",
            str(sweep),
            "--out",
            str(out),
            "--baseline-url",
            base.url,
            "--pd-url",
            bad.url,
            "--early-stop",
        ]
    )
print("exit", code)
