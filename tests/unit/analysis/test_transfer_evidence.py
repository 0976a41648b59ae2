"""Transfer evidence: vLLM's prefiller log lines counted, and when the counters say a load was
taken as finished with no read done."""

from __future__ import annotations

from pdcheck.analysis.transfer_evidence import (
    PrefillerLogEvents,
    count_prefiller_log_events,
    transfer_evidence,
)
from pdcheck.contracts.kv_lease import DEFAULT_LEASE_S, KvLease, kv_lease
from pdcheck.contracts.server_records import KvTransferMetrics

# As vLLM 0.32's NIXL worker logs them (base_worker.py, pull_worker.py), with the logger prefix.
LOG = """\
WARNING 12-03 00:10:01 [base_worker.py:3033] Releasing expired KV blocks for request cmpl-a-0-1f2e3d4c which were retrieved by 0 remote worker(s) before lease expired.
WARNING 12-03 00:10:02 [base_worker.py:3033] Releasing expired KV blocks for request cmpl-b-0-1f2e3d4c which were retrieved by 1 remote worker(s) before lease expired.
ERROR 12-03 00:10:03 [pull_worker.py:668] Potentially invalid KV blocks for unrecognized request cmpl-c-0-1f2e3d4c were retrieved by a decode worker. They may have expired.
ERROR 12-03 00:10:04 [pull_worker.py:668] Potentially invalid KV blocks for unrecognized request cmpl-d-0-1f2e3d4c were retrieved by a decode worker. They may have expired.
INFO 12-03 00:10:05 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s
"""


def test_prefiller_log_events_are_counted_by_kind():
    """Expired releases are counted, those no decoder read apart; reads of released blocks too."""
    assert count_prefiller_log_events(LOG) == PrefillerLogEvents(
        released_unread=1, released_expired=2, read_after_release=2
    )
    assert count_prefiller_log_events("") == PrefillerLogEvents()


def test_loaded_tokens_with_no_completed_read_is_a_regression_only_with_nixl_counters():
    """Tokens loaded with 0 reads completed is a regression when the decoder exports NIXL's
    counters; without them (another connector, a stand-in server) 0 reads proves nothing."""
    loaded = KvTransferMetrics(external_kv_tokens=58692.0, nixl_engines=1.0)
    evidence = transfer_evidence([loaded], None)
    assert evidence.loaded_without_transfer
    assert "58692 KV tokens loaded by transfer but 0 NIXL reads" in str(
        evidence.regression_reason()
    )
    other = transfer_evidence([KvTransferMetrics(external_kv_tokens=58692.0)], None)
    assert other.regression_reason() is None
    read = KvTransferMetrics(external_kv_tokens=58692.0, transfers=50.0, nixl_engines=1.0)
    assert transfer_evidence([read], None).regression_reason() is None


def test_prefiller_events_make_a_suspect_reason_with_the_counts_and_the_lease():
    """Released-unread and read-after-release each name their count and say what the prefiller
    did (freed the blocks or let the lease expire before the read), with the lease it ran
    with; none, no reason."""
    lease = kv_lease(None)
    evidence = transfer_evidence([], count_prefiller_log_events(LOG), lease=lease)
    reason = str(evidence.suspect_reason())
    assert (
        "2 decoder reads finished for KV blocks the prefiller had already freed, or whose lease "
        "it had let expire"
    ) in reason
    assert "the prefiller let 1 requests' leases expire and freed their KV blocks" in reason
    assert (
        "lease 30 s (vLLM's default), renewed by the decoder's heartbeat every 5 s for 20 s"
    ) in reason
    assert "renewed by" not in str(transfer_evidence([], PrefillerLogEvents(1)).suspect_reason())
    assert transfer_evidence([], PrefillerLogEvents(), lease=lease).suspect_reason() is None


def test_the_lease_is_read_from_the_prefillers_connector_config():
    """kv_lease_duration in --kv-transfer-config's extra config sets it; anything else is
    vLLM's default, never an error (judging must not fail on a config it does not know). The
    value is the flag's in the server's argv as vLLM reads it: the last one given."""
    from pdcheck.serving.argv import flag_value

    def lease(argv: list[str]) -> KvLease:
        return kv_lease(flag_value(argv, "--kv-transfer-config"))

    config = (
        '{"kv_connector":"NixlConnector","kv_connector_extra_config":{"kv_lease_duration":120}}'
    )
    set_ = lease(["vllm", "serve", "m", "--kv-transfer-config", config])
    assert (set_.duration_s, set_.heartbeat_s, set_.extension_s) == (120, 20, 80)
    assert lease([f"--kv-transfer-config={config}"]).duration_s == 120
    assert lease(["--kv-transfer-config", "{}", "--kv-transfer-config", config]).duration_s == 120
    for argv in (["--kv-transfer-config", "not json"], ["--kv-transfer-config", "[1]"], []):
        assert lease(argv) == KvLease(DEFAULT_LEASE_S, "vLLM's default")
