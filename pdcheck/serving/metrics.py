"""Evidence that PD really happened: KV-transfer counters from a decoder's Prometheus /metrics.

A decoder that quietly recomputed the prompt would produce the same text as the baseline,
so output equality proves nothing about the PD path. The decoder's own counters do: prompt
tokens that arrived by KV transfer, NIXL transfer count and bytes, and failed transfers.
Counters are read before and after a run and subtracted.
"""

from __future__ import annotations

import math
import re
import urllib.request
from collections.abc import Iterable

from pdcheck.contracts.server_records import KvTransferMetrics
from pdcheck.errors import InfraError

PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
NIXL_XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"

Sample = tuple[str, dict[str, str], float]

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus(text: str) -> list[Sample]:
    """Samples (name, labels, value) of a Prometheus text exposition; comments and blanks skipped."""
    samples = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"line {lineno} is not a Prometheus sample: {raw!r}")
        samples.append(
            (
                match["name"],
                _parse_labels(match["labels"] or "", lineno),
                _parse_value(match["value"], lineno),
            )
        )
    return samples


def _parse_labels(text: str, lineno: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise ValueError(f"line {lineno}: bad label set {{{text}}}")
        labels[match[1]] = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m[0]], match[2])
        pos = match.end()
    return labels


def _parse_value(text: str, lineno: int) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"line {lineno}: bad sample value {text!r}") from None


def _total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    return sum(
        v
        for n, lab, v in samples
        if n == name and all(lab.get(k) == want for k, want in labels.items())
    )


def read_kv_metrics(text: str) -> KvTransferMetrics:
    """The KV-transfer counters of a decoder's Prometheus exposition."""
    samples = parse_prometheus(text)
    return KvTransferMetrics(
        external_kv_tokens=_total(samples, PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer"),
        local_compute_tokens=_total(samples, PROMPT_TOKENS_BY_SOURCE, source="local_compute"),
        transfers=_total(samples, NIXL_XFER_COUNT),
        bytes_transferred=_total(samples, NIXL_BYTES),
        failed_transfers=_total(samples, NIXL_FAILED),
        local_cache_hit_tokens=_total(samples, PROMPT_TOKENS_BY_SOURCE, source="local_cache_hit"),
        nixl_engines=float(sum(1 for n, _, _ in samples if n == NIXL_XFER_COUNT)),
    )


def metrics_url(url: str) -> str:
    """`url` itself if it already ends in /metrics, else the server's /metrics."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else f"{url}/metrics"


def scrape_kv_metrics(url: str, *, timeout_s: float = 10.0) -> KvTransferMetrics:
    """Read one decoder's /metrics (base URL or the /metrics URL itself)."""
    target = metrics_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", "replace")
    except OSError as exc:
        raise InfraError(f"could not read decoder metrics at {target}: {exc}") from exc
    return read_kv_metrics(text)
