"""The report says which levels ran above what a server runs at once (its max-num-seqs), from
the argv each server ran with as cell.json records it."""

from __future__ import annotations

from pathlib import Path

from pdcheck.contracts.server_records import ServerPorts, ServerRecord, TopologyRecord
from pdcheck.report import render_markdown
from pdcheck.results import load_run
from pdcheck.results.store import open_run

from .conftest import CellPlan


def _server(role: str, index: int, *extra: str) -> ServerRecord:
    return ServerRecord(
        name=f"{role}-{index}",
        role=role,  # type: ignore[arg-type]
        pid=1,
        argv=("vllm", "serve", "m", "--tensor-parallel-size", "1", *extra),
        env={},
        url="http://127.0.0.1:1",
        ports=ServerPorts(http=1, side_channel=2, vllm_port=3),
        gpus=(),
        cpu_bind=None,
        log_path="x.log",
        plugin_dir="p",
    )


def _record(root: Path, *topologies: TopologyRecord) -> None:
    store = open_run(root)
    assert store is not None
    run = load_run(root)
    for cell in run.cells:
        for topology in topologies:
            store.cell(cell.dirname).record_started(topology)


def test_levels_above_the_decoders_max_num_seqs_are_listed(make_run):
    """c8 over a decoder that runs 4 at once queues; c1 does not; the baseline (vLLM's CPU
    default, 128) never does here."""
    root = make_run([CellPlan("fixes-on")], n=40, concurrency=(1, 8))
    _record(
        root,
        TopologyRecord(platform="cpu", servers=(_server("baseline", 0),)),
        TopologyRecord(
            platform="cpu",
            servers=(_server("prefill", 0), _server("decode", 0, "--max-num-seqs", "4")),
        ),
    )
    text = render_markdown(load_run(root))
    assert "## Concurrency above what the servers run at once" in text
    assert (
        "- `tiny-llama-p1x1-d1x1-async-fixes-on` c8: concurrency 8 > decoder max-num-seqs 4 "
        "(--max-num-seqs 4): the extra requests queue; this level measures queueing"
    ) in text, text
    assert "c1: concurrency" not in text and "baseline max-num-seqs" not in text


def test_no_section_when_every_level_fits(make_run):
    root = make_run([CellPlan("fixes-on")], n=40, concurrency=(1, 8))
    _record(root, TopologyRecord(platform="cpu", servers=(_server("decode", 0),)))
    assert "Concurrency above" not in render_markdown(load_run(root))
