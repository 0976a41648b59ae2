"""Finish a run folder: junit.xml and report.md from the store, then summary.json last.

The one way a run is finished, whether the engine ran it, `pdcheck merge` joined shards into
it, or a pytest session filled it cell by cell.
"""

from __future__ import annotations

import dataclasses

from pdcheck.report import render_junit, render_markdown
from pdcheck.results.store import RunResults, RunStore, load_run
from pdcheck.results.summary import summarize
from pdcheck.sweep.judging import apply_family


def finish_run(store: RunStore) -> RunResults:
    """Summarize the folder once (attribution included), render junit and the report from that,
    stamp run.json finished and write summary.json, last: its presence means finished.

    Before that, the run's decision: Holm across its clean tests (`apply_family`), which may
    re-judge levels that were judged alone while the run went on.

    Returns the finished folder as it now reads.
    """
    apply_family(store)
    results = load_run(store.root)
    summary = summarize(results)
    results = dataclasses.replace(results, summary=summary)
    store.write_junit(render_junit(results))
    store.write_report(render_markdown(results))
    store.finish(summary)
    return load_run(store.root)
