"""KV evidence: Prometheus parsing, before/after deltas, and 'no KV received' as an infra error."""

from __future__ import annotations

import math

import pytest

from pdcheck.contracts.server_records import KvTransferMetrics
from pdcheck.serving.metrics import (
    parse_prometheus,
    read_kv_metrics,
    scrape_kv_metrics,
)
from tests.fakes.openai_server import FakeOpenAIServer

EXPOSITION = """\
# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 1200.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 34.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 20.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 7.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 20.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.5
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 5.24288e+06
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1.0
vllm:other{path="a\\"b,c=d}",x="y"} +Inf 1700000000000
"""


def test_parse_handles_labels_escapes_specials_and_timestamps():
    """Label values with escaped quotes, commas and braces parse; +Inf and trailing timestamps too."""
    samples = parse_prometheus(EXPOSITION)
    other = next(s for s in samples if s[0] == "vllm:other")
    assert other[1] == {"path": 'a"b,c=d}', "x": "y"} and math.isinf(other[2])
    assert len(samples) == 9


def test_malformed_line_is_an_error_not_zero():
    """A garbled exposition raises instead of reading as 'no KV transferred'."""
    with pytest.raises(ValueError, match="line 1"):
        parse_prometheus("vllm:x{source=unquoted} 1\n")


def test_kv_metrics_sum_over_engines_and_delta():
    """External-KV tokens sum over engines; `minus` gives what one run added, and keeps how many
    engines export NIXL's counters (not a counter)."""
    after = read_kv_metrics(EXPOSITION)
    engines = float(EXPOSITION.count("vllm:nixl_xfer_time_seconds_count"))
    assert after == KvTransferMetrics(1234.0, 20.0, 20.0, 5242880.0, 1.0, 7.0, engines)
    before = KvTransferMetrics(1000.0, 10.0, 15.0, 4194304.0, 1.0, 3.0, engines)
    assert after.minus(before) == KvTransferMetrics(234.0, 10.0, 5.0, 1048576.0, 0.0, 4.0, engines)
    assert KvTransferMetrics.from_dict(after.to_dict()) == after


def test_scrape_reads_a_live_metrics_endpoint():
    """scrape_kv_metrics accepts the server root or its /metrics URL."""
    with FakeOpenAIServer() as server:
        server.metrics_text = EXPOSITION
        assert scrape_kv_metrics(server.url).external_kv_tokens == 1234.0
        assert scrape_kv_metrics(server.url + "/metrics/").transfers == 20.0
