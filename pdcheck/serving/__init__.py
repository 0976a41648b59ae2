"""Serving: vLLM server processes, ports, GPUs, the PD proxy, KV evidence and attach mode.

Nothing here imports vLLM: servers are subprocesses, and vLLM's own argument parser runs in
a subprocess of the arm's python (`check_serve_argv`).
"""

from pdcheck.contracts.server_records import KvTransferMetrics, ServerRecord, TopologyRecord
from pdcheck.serving.argcheck import check_serve_argv
from pdcheck.serving.argv import build_env, build_serve_argv, cell_python
from pdcheck.serving.endpoints import (
    AttachNames,
    Endpoints,
    attach,
    attach_options,
)
from pdcheck.serving.metrics import scrape_kv_metrics
from pdcheck.serving.plan import TopologyPlan, plan_topology
from pdcheck.serving.proxy import PdProxy, ProxyServer
from pdcheck.serving.topology import (
    RunningServer,
    serve_baseline,
    serve_pd,
    serve_prefills,
    serve_topology,
)

__all__ = [
    "AttachNames",
    "Endpoints",
    "KvTransferMetrics",
    "PdProxy",
    "ProxyServer",
    "RunningServer",
    "ServerRecord",
    "TopologyPlan",
    "TopologyRecord",
    "attach",
    "attach_options",
    "build_env",
    "build_serve_argv",
    "cell_python",
    "check_serve_argv",
    "plan_topology",
    "scrape_kv_metrics",
    "serve_baseline",
    "serve_pd",
    "serve_prefills",
    "serve_topology",
]
