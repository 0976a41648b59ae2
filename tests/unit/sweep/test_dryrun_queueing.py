"""`pdcheck sweep --dry-run` says which levels exceed what the baseline or decoder runs at once."""

from __future__ import annotations

from pdcheck.results.schema import Provenance
from pdcheck.sweep.dryrun import dry_run
from pdcheck.sweep.run import SweepRequest, prepare
from pdcheck.sweep.serving_backend import ServingBackend

SWEEP = """\
name: q
models:
  - {name: m, path: /models/m, serve_args: [--max-num-seqs, "16"]}
matrix:
  concurrency: [1, 16, 64]
serving: {platform: gpu}
"""


def test_the_dry_run_names_each_level_that_only_queues(tmp_path, monkeypatch):
    # The build fingerprint would ask the arm's python about vLLM: a child process.
    monkeypatch.setattr(ServingBackend, "provenance", lambda self, cell: Provenance())
    path = tmp_path / "q.yaml"
    path.write_text(SWEEP)
    prepared = prepare(SweepRequest(file=str(path), out=tmp_path / "run"))
    text = dry_run(prepared, check_argv=False, gpus=3).text
    assert (
        "# c64: concurrency 64 > decoder max-num-seqs 16 (--max-num-seqs 16): the extra requests "
        "queue; this level measures queueing"
    ) in text, text
    assert "# c64: concurrency 64 > baseline max-num-seqs 16" in text
    assert "# c16: concurrency" not in text
