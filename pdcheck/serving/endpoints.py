"""Endpoints: where a sweep sends traffic and reads KV evidence, and a record of what served them.

One type whether pdcheck started the servers (`serve_*` fill in `started`, the exact argv,
env, ports, devices and pid of each process) or the user runs them (`attach`, the one set
of rules every entry point applies to user URLs: the CLI, the library and the pytest plugin).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

from pdcheck.contracts.server_records import TopologyRecord
from pdcheck.errors import ConfigError, InfraError
from pdcheck.serving.metrics import metrics_url
from pdcheck.serving.process import ServerProcess


@dataclass(frozen=True)
class Endpoints:
    """Where to send traffic and read evidence; the same shape whether pdcheck started it or not."""

    baseline_url: str | None = None
    pd_url: str | None = None
    decoder_metrics_urls: tuple[str, ...] = ()
    started: TopologyRecord | None = None  # None: the user's servers (attach mode)
    processes: tuple[ServerProcess, ...] = field(default=(), repr=False, compare=False)

    @property
    def attached(self) -> bool:
        return self.started is None

    @property
    def log_paths(self) -> dict[str, str]:
        servers = self.started.servers if self.started else ()
        return {s.name: s.log_path for s in servers}

    @property
    def plugin_dirs(self) -> tuple[str, ...]:
        """The decoders' plugin folders, where injections.jsonl is written (none when attached)."""
        servers = self.started.servers if self.started else ()
        return tuple(s.plugin_dir for s in servers if s.role == "decode")

    def url(self, side: Literal["baseline", "pd"]) -> str:
        """The URL a side's requests go to."""
        url = self.baseline_url if side == "baseline" else self.pd_url
        if url is None:
            raise InfraError(f"these endpoints have no {side} server")
        return url

    def check_alive(self) -> None:
        """`ServerCrashed` if any server pdcheck started has exited (e.g. a decoder died mid-run)."""
        for process in self.processes:
            process.check_alive()


@dataclass(frozen=True)
class AttachNames:
    """How a caller spells the attach inputs, so an error names what the user typed."""

    baseline_url: str = "baseline_url"
    pd_url: str = "pd_url"
    decoder_metrics_url: str = "decoder_metrics_urls"


def attach(
    *,
    baseline_url: str | None,
    pd_url: str | None,
    decoder_metrics_urls: Sequence[str] = (),
    names: AttachNames = AttachNames(),
) -> Endpoints:
    """Endpoints of a deployment that is already up (Kubernetes, llm-d, Dynamo, a manual setup).

    Both URLs are needed (PD is compared with the no-PD baseline); each must be http(s) with
    a host. A trailing /v1 is dropped, and a decoder's URL is completed with /metrics.
    Raises `ConfigError` naming the wrong value and what is allowed.
    """
    if baseline_url is None or pd_url is None:
        if baseline_url is None and pd_url is None and decoder_metrics_urls:
            raise ConfigError(
                f"{names.decoder_metrics_url} is for attach mode; give {names.baseline_url} and "
                f"{names.pd_url} too"
            )
        given = names.baseline_url if baseline_url is not None else names.pd_url
        raise ConfigError(
            f"attach mode needs both {names.baseline_url} (your no-PD baseline server) and "
            f"{names.pd_url} (your PD endpoint)"
            + ("" if baseline_url is None and pd_url is None else f"; only {given} was given")
        )
    for option, url in [
        (names.baseline_url, baseline_url),
        (names.pd_url, pd_url),
        *((names.decoder_metrics_url, u) for u in decoder_metrics_urls),
    ]:
        _check_url(option, url)
    return Endpoints(
        baseline_url=_base(baseline_url),
        pd_url=_base(pd_url),
        decoder_metrics_urls=tuple(metrics_url(u) for u in decoder_metrics_urls),
    )


def attach_options(
    *,
    baseline_url: str | None,
    pd_url: str | None,
    decoder_metrics_urls: Sequence[str],
    names: AttachNames,
) -> Endpoints | None:
    """From command-line options: None when none is given (pdcheck starts servers), else `attach`."""
    if baseline_url is None and pd_url is None and not decoder_metrics_urls:
        return None
    return attach(
        baseline_url=baseline_url,
        pd_url=pd_url,
        decoder_metrics_urls=decoder_metrics_urls,
        names=names,
    )


def _check_url(option: str, url: str) -> None:
    parsed = urlparse(url)
    try:
        port_ok = parsed.port != 0  # None: the scheme's default
    except ValueError:  # not a number, or outside 0-65535
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise ConfigError(
            f"{option} {url!r} is not an http(s) URL with a host and a valid port; "
            "give e.g. http://10.0.0.5:8000"
        )


def _base(url: str) -> str:
    """The server root: a trailing /v1 or slash is dropped, because clients add the API paths."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url
