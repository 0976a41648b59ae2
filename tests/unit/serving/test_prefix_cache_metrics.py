"""A decoder's own prefix-cache hits, read from vLLM's prompt-tokens-by-source counter."""

from __future__ import annotations

from pdcheck.contracts.server_records import KvTransferMetrics
from pdcheck.serving.metrics import read_kv_metrics

EXPOSITION = """\
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 12.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 640.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 900.0
"""


def test_local_cache_hits_are_read_apart_from_transferred_tokens():
    """local_cache_hit tokens are the decoder's own prefix-cache hits, counted apart from the
    tokens it read from the prefiller and those it computed."""
    m = read_kv_metrics(EXPOSITION)
    assert (m.local_cache_hit_tokens, m.external_kv_tokens, m.local_compute_tokens) == (
        640.0,
        900.0,
        12.0,
    )


def test_a_reading_stored_before_the_counter_existed_reads_zero():
    """KV evidence written before pdcheck read local hits still loads, with 0 hits."""
    old = {
        "external_kv_tokens": 5,
        "local_compute_tokens": 1,
        "transfers": 2,
        "bytes_transferred": 9,
        "failed_transfers": 0,
    }
    assert KvTransferMetrics.from_dict(old).local_cache_hit_tokens == 0.0
