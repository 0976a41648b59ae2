"""The dry run's queueing lines: from the argv pdcheck builds for a cell's baseline and decoder."""

from __future__ import annotations

from pdcheck.config import expand_cells, parse_sweep
from pdcheck.serving.queueing import queueing_lines


def _cell(**matrix):
    spec = parse_sweep(
        {
            "name": "q",
            "models": [
                {"name": "m", "path": "/models/m", "serve_args": ["--max-num-seqs", "32"]},
            ],
            "matrix": {"concurrency": [1, 32, 64], **matrix},
        }
    )
    return expand_cells(spec)[0]


def test_a_level_above_the_model_serve_args_max_num_seqs_is_named():
    lines = queueing_lines(_cell(), platform="gpu")
    assert lines == [
        "c64: concurrency 64 > baseline max-num-seqs 32 (--max-num-seqs 32): the extra requests "
        "queue; this level measures queueing",
        "c64: concurrency 64 > decoder max-num-seqs 32 (--max-num-seqs 32): the extra requests "
        "queue; this level measures queueing",
    ]


def test_two_decoders_take_half_each_and_the_baseline_all():
    lines = queueing_lines(_cell(decode_instances=[2]), platform="gpu")
    assert [line[:40] for line in lines] == ["c64: concurrency 64 > baseline max-num-s"]


def test_no_flag_uses_vllms_cpu_default():
    spec = parse_sweep(
        {
            "name": "q",
            "models": [{"name": "m", "path": "/models/m"}],
            "matrix": {"concurrency": [128, 200]},
        }
    )
    lines = queueing_lines(expand_cells(spec)[0], platform="cpu")
    assert len(lines) == 2 and all("max-num-seqs 128 (vLLM's CPU default" in x for x in lines)
