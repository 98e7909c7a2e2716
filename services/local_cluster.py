"""Local cluster launcher: one OS process per node on this machine, file epoch store or
ZooKeeper (``with_zookeeper`` starts a real local server in ``DIR/zookeeper``).

``up`` writes one ``config.json`` per node (``shared.config.to_dict(ProcessConfig)``), starts
``python -m services.node --config ...`` for each in its own session with output in
``node.log``, waits until every ``/readyz`` answers 200 and writes ``DIR/cluster.json``.
``down`` and ``restart`` find the processes again through ``cluster.json``. A pid is only
signalled after its command line was checked to be that node's, so a reused pid is never hit.
A local ZooKeeper is started before the nodes and stopped after them; its data survives
``down``, so a later ``up`` on the same directory continues the epochs.

``secure`` (``local up --secure``) generates a CA, a node certificate and a cluster secret in
``DIR/secure`` (kept across ``down``/``up``) and turns on TLS and node authentication on every
node; ``cluster.json`` then names the CA, and the CLI's ``--dir`` uses it (docs/SECURITY.md).

Everything here blocks (subprocess, files, urllib polling): it is meant for the CLI and for
test fixtures; async callers must use ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from epoch_store import zk_server
from epoch_store.zk_server import ServerHandle
from services import token_cli
from shared.config import (
    AuthConfig,
    ClusterConfig,
    FsyncMode,
    GossipConfig,
    LimitsConfig,
    LogBacklog,
    NodeConfig,
    ProcessConfig,
    Role,
    SequencerConfig,
    StorageConfig,
    TlsConfig,
    TransportConfig,
    to_dict,
)
from shared.net.local_ports import busy_ports, free_port_block
from shared.tls import client_context
from shared.types import NodeId

DEFAULT_BASE_PORT = 7400
STATE_FILE = "cluster.json"
_STARTING_FILE = "cluster.starting.json"
"""Written as soon as processes exist, so ``down`` can clean up an interrupted ``up``."""
_LOG_TAIL_LINES = 30
_POLL_S = 0.05
_REPO_ROOT = Path(__file__).resolve().parent.parent
ZOOKEEPER_DIR = "zookeeper"
SECURE_DIR = "secure"
"""Under the cluster directory: the CA, node certificate and cluster secret of ``--secure``."""
ZOOKEEPER_ROOT = "/seqlog"
NODE_MODULE = "services.node"
"""What ``python -m`` runs for each node; tests point it at a stand-in."""
# Popen objects of nodes started by this process, so their exit is reaped (no zombies
# mistaken for live nodes, no ResourceWarning).
_children: dict[int, subprocess.Popen[bytes]] = {}


class LocalClusterError(Exception):
    """The local cluster could not be started, found or stopped; the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalClusterSpec:
    dir: Path
    storage_nodes: int = 3
    sequencers: int = 2
    replication: int = 3
    base_port: int = DEFAULT_BASE_PORT
    epoch_store: str = "file"
    """``file`` or a ``zk://host:port/path`` URL, passed through to the nodes."""
    with_zookeeper: bool = False
    """Start a local ZooKeeper server in ``DIR/zookeeper`` and use it (``epoch_store`` must
    then be ``file``, the default)."""
    fsync: FsyncMode = "always"
    host: str = "127.0.0.1"
    log_backlog_ms: int = 0
    """Retention of every log (``cluster.log_backlog_ms``); 0 keeps records forever."""
    log_backlogs: tuple[LogBacklog, ...] = ()
    """Per log-id range retention (``cluster.log_backlogs``)."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Storage-role settings for every node; ``fsync`` above wins over its ``fsync``."""
    sequencer: SequencerConfig = field(default_factory=SequencerConfig)
    """Sequencer-role settings for every node (tests shrink the window with it)."""
    gossip: GossipConfig = field(default_factory=GossipConfig)
    """Failure-detector timing for every node (tests shorten it)."""
    peer_addresses: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per node id, its ``transport.peer_addresses``: where it connects to some peers instead
    of their data ports (the chaos tests put a proxy on every link this way)."""
    secure: bool = False
    """TLS everywhere and node authentication, with files made in ``DIR/secure``."""
    tls: TlsConfig | None = None
    """``tls`` settings for every node instead of ``secure``'s (tests: a cluster secret
    without TLS)."""
    auth: AuthConfig = field(default_factory=AuthConfig)
    """Client authentication for every node (``local up --auth``: ``DIR/auth``)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEntry:
    node_id: NodeId
    pid: int
    roles: tuple[Role, ...]
    http: str
    data_dir: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterState:
    nodes: tuple[NodeEntry, ...]
    epoch_store: str
    zookeeper: ServerHandle | None = None
    """The local ZooKeeper server started with the cluster, if any."""
    ca_file: str = ""
    """The CA of a secure cluster (its nodes serve https); empty: plain http."""

    @property
    def scheme(self) -> str:
        return "https" if self.ca_file else "http"

    @property
    def sequencer_urls(self) -> list[str]:
        return [f"{self.scheme}://{n.http}" for n in self.nodes if "sequencer" in n.roles]

    def to_json(self) -> dict[str, Any]:
        nodes = [
            {"node_id": n.node_id, "pid": n.pid, "roles": list(n.roles), "http": n.http,
             "data_dir": n.data_dir}
            for n in self.nodes
        ]
        zk = self.zookeeper
        return {"nodes": nodes, "epoch_store": self.epoch_store, "zookeeper": None if zk is None
                else {"pid": zk.pid, "client_port": zk.client_port, "dir": str(zk.dir)},
                "ca_file": self.ca_file}


# -- plan -------------------------------------------------------------------------------


def plan(spec: LocalClusterSpec) -> list[ProcessConfig]:
    """Node configs for ``spec``; raises ``LocalClusterError`` on impossible settings."""
    if spec.sequencers < 1 or spec.storage_nodes < 1:
        raise LocalClusterError("need at least one sequencer and one storage node")
    count = spec.sequencers + spec.storage_nodes
    if spec.base_port < 1 or spec.base_port + 2 * count - 1 > 65535:
        raise LocalClusterError(f"ports {spec.base_port}..+{2 * count - 1} do not fit")
    root = spec.dir.resolve()
    ids = [f"seq{i + 1}" for i in range(spec.sequencers)]
    ids += [f"st{i + 1}" for i in range(spec.storage_nodes)]
    nodes = tuple(
        NodeConfig(
            node_id=NodeId(node_id),
            roles=("sequencer",) if node_id.startswith("seq") else ("storage",),
            host=spec.host,
            http_port=spec.base_port + 2 * index,
            data_port=spec.base_port + 2 * index + 1,
        )
        for index, node_id in enumerate(ids)
    )
    try:
        cluster = ClusterConfig(
            cluster_name="seqlog-local", nodes=nodes, replication_factor=spec.replication,
            log_backlog_ms=spec.log_backlog_ms, log_backlogs=spec.log_backlogs,
        )
        file_store = spec.epoch_store == "file"
        tls = _tls_of(spec)
        return [
            ProcessConfig(
                node_id=node.node_id,
                cluster=cluster,
                data_dir=str(root / node.node_id),
                epoch_store=spec.epoch_store,
                epoch_store_dir=str(root / "epochs") if file_store else "",
                storage=replace(spec.storage, fsync=spec.fsync),
                sequencer=spec.sequencer,
                gossip=spec.gossip,
                transport=TransportConfig(
                    peer_addresses=dict(spec.peer_addresses.get(node.node_id, {}))),
                tls=tls,
                auth=spec.auth,
                limits=spec.limits,
            )
            for node in nodes
        ]
    except ValueError as exc:
        raise LocalClusterError(str(exc)) from None


def secure_tls(root: Path) -> TlsConfig:
    """The ``tls`` settings of every node of a secure local cluster in ``root``."""
    secure = root / SECURE_DIR
    return TlsConfig(cert_file=str(secure / "node.pem"), key_file=str(secure / "node-key.pem"),
                     ca_file=str(secure / "ca.pem"),
                     cluster_secret_file=str(secure / "cluster-secret"))


def make_secure_files(root: Path) -> None:
    """The CA, node certificate and secret of ``secure_tls(root)``, made once: a later ``up``
    keeps them, so clients that trust the CA keep working."""
    tls = secure_tls(root)
    if all(Path(f).exists() for f in (tls.cert_file, tls.key_file, tls.ca_file,
                                      tls.cluster_secret_file)):
        return
    from services.certs import make_secure_dir  # cryptography only when asked for
    make_secure_dir(root / SECURE_DIR)


def local_ssl(root: Path) -> ssl.SSLContext | None:
    """How tooling reaches the nodes of the cluster in ``root``: its CA if it has TLS."""
    state = load_state(root.resolve())
    if state is None or not state.ca_file:
        return None
    return client_context(state.ca_file)


def _tls_of(spec: LocalClusterSpec) -> TlsConfig:
    return spec.tls or (secure_tls(spec.dir.resolve()) if spec.secure else TlsConfig())


def epoch_store_url(spec: LocalClusterSpec) -> str:
    if spec.epoch_store == "file":
        return f"file://{spec.dir.resolve() / 'epochs'}"
    return spec.epoch_store


def config_path(root: Path, node_id: str) -> Path:
    return root.resolve() / node_id / "config.json"


def write_configs(spec: LocalClusterSpec, configs: list[ProcessConfig]) -> None:
    if spec.epoch_store == "file":
        (spec.dir / "epochs").mkdir(parents=True, exist_ok=True)
    for config in configs:
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        path = config_path(spec.dir, config.node_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(to_dict(config), indent=2) + "\n")
        tmp.replace(path)


# -- state file -------------------------------------------------------------------------


def load_state(root: Path) -> ClusterState | None:
    """The cluster recorded in ``root`` (or the one an interrupted ``up`` left), if any."""
    for name in (STATE_FILE, _STARTING_FILE):
        path = root / name
        if path.exists():
            try:
                return _state_from_json(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError) as exc:
                raise LocalClusterError(f"{path} is unreadable: {exc}") from None
    return None


def _state_from_json(data: dict[str, Any]) -> ClusterState:
    nodes = tuple(
        NodeEntry(
            node_id=NodeId(str(n["node_id"])),
            pid=int(n["pid"]),
            roles=tuple(n["roles"]),
            http=str(n["http"]),
            data_dir=str(n["data_dir"]),
        )
        for n in data["nodes"]
    )
    zk = data.get("zookeeper")
    zookeeper = None if zk is None else ServerHandle(
        dir=Path(str(zk["dir"])), client_port=int(zk["client_port"]), pid=int(zk["pid"]))
    return ClusterState(nodes=nodes, epoch_store=str(data["epoch_store"]), zookeeper=zookeeper,
                        ca_file=str(data.get("ca_file") or ""))


def save_state(root: Path, state: ClusterState, name: str = STATE_FILE) -> None:
    tmp = root / (name + ".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.replace(root / name)


# -- processes --------------------------------------------------------------------------


def node_alive(root: Path, node: NodeEntry) -> bool:
    """True if ``node.pid`` is still that node's process (not a zombie, not a reused pid)."""
    child = _children.get(node.pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[node.pid]
        return False
    try:
        cmdline = Path(f"/proc/{node.pid}/cmdline").read_bytes()
        if not cmdline:
            # Empty for a zombie, and for a moment right after exec.
            state = Path(f"/proc/{node.pid}/stat").read_text().rpartition(")")[2].split()[0]
            return state not in ("Z", "X")
    except (OSError, IndexError):
        return False
    return str(config_path(root, node.node_id)).encode() in cmdline


def start_node(root: Path, node_id: str, extra_env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ)
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", NODE_MODULE, "--config", str(config_path(root, node_id))]
    with open(root / node_id / "node.log", "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
    _children[process.pid] = process
    return process.pid


def _signal(root: Path, node: NodeEntry, signum: signal.Signals) -> None:
    if node_alive(root, node):
        # The node leads its own session and process group, so this also reaches any
        # helper process it started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signum)


def _wait_gone(root: Path, nodes: list[NodeEntry], timeout_ms: int) -> list[NodeEntry]:
    deadline_s = time.monotonic() + timeout_ms / 1000
    remaining = [n for n in nodes if node_alive(root, n)]
    while remaining and time.monotonic() < deadline_s:
        time.sleep(_POLL_S)
        remaining = [n for n in remaining if node_alive(root, n)]
    return remaining


def stop_nodes(root: Path, nodes: list[NodeEntry], *, stop_timeout_ms: int = 10_000) -> None:
    """SIGTERM, wait up to ``stop_timeout_ms``, then SIGKILL whatever is left."""
    for node in nodes:
        _signal(root, node, signal.SIGTERM)
    stubborn = _wait_gone(root, nodes, stop_timeout_ms)
    for node in stubborn:
        _signal(root, node, signal.SIGKILL)
    left = _wait_gone(root, stubborn, 5_000)
    if left:
        raise LocalClusterError(f"could not stop {[n.node_id for n in left]}")


def _ready(http: str, context: ssl.SSLContext | None = None) -> bool:
    scheme = "http" if context is None else "https"
    try:
        with urllib.request.urlopen(f"{scheme}://{http}/readyz", timeout=1.0,
                                    context=context) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(root: Path, nodes: list[NodeEntry], *, ready_timeout_ms: int) -> None:
    """Poll every node's ``/readyz``; raise with the failing node's log tail on timeout or
    early exit."""
    deadline_s = time.monotonic() + ready_timeout_ms / 1000
    pending = list(nodes)
    context = local_ssl(root)
    while pending:
        for node in list(pending):
            if not node_alive(root, node):
                raise LocalClusterError(f"{node.node_id} exited\n{log_tail(root, node.node_id)}")
            if _ready(node.http, context):
                pending.remove(node)
        if pending and time.monotonic() >= deadline_s:
            first = pending[0].node_id
            raise LocalClusterError(
                f"not ready after {ready_timeout_ms} ms: {[n.node_id for n in pending]}\n"
                f"{log_tail(root, first)}"
            )
        if pending:
            time.sleep(_POLL_S * 2)


def log_tail(root: Path, node_id: str, lines: int = _LOG_TAIL_LINES) -> str:
    path = root / node_id / "node.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = "\n".join(text.splitlines()[-lines:])
    return f"--- last lines of {path} ---\n{tail}"


def free_base_port(nodes_count: int, *, host: str = "127.0.0.1", seed: int | None = None) -> int:
    """A base port whose ``2 * nodes_count`` ports are free right now (for tests)."""
    try:
        return free_port_block(2 * nodes_count, host=host, seed=seed)
    except OSError as exc:
        raise LocalClusterError(str(exc)) from exc


# -- commands ---------------------------------------------------------------------------


def running_nodes(root: Path) -> list[NodeEntry]:
    state = load_state(root)
    return [] if state is None else [n for n in state.nodes if node_alive(root, n)]


def up(spec: LocalClusterSpec, *, ready_timeout_ms: int = 30_000) -> ClusterState:
    """Start every node and return once all are ready; on failure stop what was started and
    raise ``LocalClusterError`` carrying the failing node's log tail."""
    root = spec.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    alive = running_nodes(root)
    if alive:
        raise LocalClusterError(
            f"{root} already has a running cluster ({', '.join(n.node_id for n in alive)}); "
            "run `seqlog local down` first"
        )
    recorded = load_state(root)
    if recorded is not None and recorded.zookeeper and zk_server.alive(recorded.zookeeper):
        raise LocalClusterError(f"{root} already has a running ZooKeeper (pid "
                                f"{recorded.zookeeper.pid}); run `seqlog local down` first")
    if spec.with_zookeeper and spec.epoch_store != "file":
        raise LocalClusterError("use either a local ZooKeeper or --epoch-store, not both")
    if spec.secure:
        make_secure_files(root)
    configs = plan(spec)
    ports = [p for c in configs for p in (c.me.http_port, c.me.data_port)]
    busy = busy_ports(spec.host, ports)
    if busy:
        raise LocalClusterError(f"ports already in use on {spec.host}: {busy}")
    zookeeper = None
    if spec.with_zookeeper:
        zookeeper = _start_zookeeper(root, avoid_ports=ports, ready_timeout_ms=ready_timeout_ms)
        spec = replace(spec, epoch_store=zookeeper_url(zookeeper))
        configs = plan(spec)
    started: list[NodeEntry] = []
    try:
        write_configs(spec, configs)
        (root / STATE_FILE).unlink(missing_ok=True)
        save_state(root, _state(spec, started, zookeeper), _STARTING_FILE)
        for config in configs:
            started.append(_entry(config, start_node(root, config.node_id)))
            save_state(root, _state(spec, started, zookeeper), _STARTING_FILE)
        wait_ready(root, started, ready_timeout_ms=ready_timeout_ms)
    except BaseException:
        stop_nodes(root, started)
        if zookeeper is not None:
            zk_server.stop(zookeeper)
        (root / _STARTING_FILE).unlink(missing_ok=True)
        raise
    state = _state(spec, started, zookeeper)
    save_state(root, state)
    (root / _STARTING_FILE).unlink(missing_ok=True)
    return state


def down(root: Path, *, stop_timeout_ms: int = 10_000) -> list[NodeId]:
    """Stop every node recorded in ``root``; returns the ids that were still running."""
    root = root.resolve()
    state = load_state(root)
    if state is None:
        raise LocalClusterError(f"no {STATE_FILE} in {root}")
    alive = [n for n in state.nodes if node_alive(root, n)]
    stop_nodes(root, alive, stop_timeout_ms=stop_timeout_ms)
    stopped = [n.node_id for n in alive]
    if state.zookeeper is not None and zk_server.alive(state.zookeeper):
        _stop_zookeeper(state.zookeeper)
        stopped.append(NodeId("zookeeper"))
    (root / _STARTING_FILE).unlink(missing_ok=True)
    return stopped


def restart(
    root: Path, node_id: str, *, stop_timeout_ms: int = 10_000, ready_timeout_ms: int = 30_000,
    extra_env: Mapping[str, str] | None = None,
) -> NodeEntry:
    """Stop ``node_id`` (if running), start it again on the same config and data (with
    ``extra_env`` added to its environment, e.g. armed failpoints), wait until it is ready and
    record its new pid."""
    root = root.resolve()
    state = load_state(root)
    if state is None:
        raise LocalClusterError(f"no {STATE_FILE} in {root}")
    old = next((n for n in state.nodes if n.node_id == node_id), None)
    if old is None:
        raise LocalClusterError(f"no node {node_id!r} in {root / STATE_FILE}")
    stop_nodes(root, [old], stop_timeout_ms=stop_timeout_ms)
    new = NodeEntry(
        node_id=old.node_id, pid=start_node(root, old.node_id, extra_env), roles=old.roles,
        http=old.http, data_dir=old.data_dir,
    )
    nodes = tuple(new if n.node_id == node_id else n for n in state.nodes)
    save_state(root, replace(state, nodes=nodes))
    wait_ready(root, [new], ready_timeout_ms=ready_timeout_ms)
    return new


def restart_many(root: Path, node_ids: list[str], *, stop_timeout_ms: int = 10_000,
                 ready_timeout_ms: int = 30_000) -> list[NodeEntry]:
    """Stop the nodes of ``node_ids`` (those running), start them all again on their
    configs and data, record their new pids in one write of the state file, and wait until
    every one is ready (nodes that need each other to be ready start together)."""
    root = root.resolve()
    state = load_state(root)
    if state is None:
        raise LocalClusterError(f"no {STATE_FILE} in {root}")
    old = {n.node_id: n for n in state.nodes if n.node_id in node_ids}
    missing = sorted(set(node_ids) - set(old))
    if missing:
        raise LocalClusterError(f"no node {missing[0]!r} in {root / STATE_FILE}")
    stop_nodes(root, list(old.values()), stop_timeout_ms=stop_timeout_ms)
    new = {node_id: NodeEntry(node_id=entry.node_id, pid=start_node(root, node_id),
                              roles=entry.roles, http=entry.http, data_dir=entry.data_dir)
           for node_id, entry in old.items()}
    save_state(root, replace(state, nodes=tuple(new.get(n.node_id, n) for n in state.nodes)))
    wait_ready(root, list(new.values()), ready_timeout_ms=ready_timeout_ms)
    return list(new.values())


def _entry(config: ProcessConfig, pid: int) -> NodeEntry:
    return NodeEntry(
        node_id=config.node_id, pid=pid, roles=config.me.roles, http=config.me.http_address,
        data_dir=config.data_dir,
    )


def _state(
    spec: LocalClusterSpec, nodes: list[NodeEntry], zookeeper: ServerHandle | None
) -> ClusterState:
    return ClusterState(nodes=tuple(nodes), epoch_store=epoch_store_url(spec),
                        zookeeper=zookeeper,
                        ca_file=_tls_of(spec).ca_file)


# -- local ZooKeeper --------------------------------------------------------------------


def zookeeper_url(server: ServerHandle) -> str:
    return f"zk://{server.address}{ZOOKEEPER_ROOT}"


def _start_zookeeper(
    root: Path, *, avoid_ports: list[int], ready_timeout_ms: int, port: int | None = None
) -> ServerHandle:
    try:
        return zk_server.start_standalone(root / ZOOKEEPER_DIR, client_port=port,
                                          avoid_ports=tuple(avoid_ports),
                                          ready_timeout_ms=ready_timeout_ms)
    except zk_server.ZooKeeperServerError as exc:
        raise LocalClusterError(str(exc)) from None


def _stop_zookeeper(server: ServerHandle, *, kill: bool = False) -> None:
    try:
        zk_server.stop(server, kill=kill)
    except zk_server.ZooKeeperServerError as exc:
        raise LocalClusterError(str(exc)) from None


def stop_zookeeper(root: Path, *, kill: bool = False) -> None:
    """Stop the cluster's local ZooKeeper (the nodes keep running; for fault tests)."""
    state = load_state(root.resolve())
    if state is None or state.zookeeper is None:
        raise LocalClusterError(f"no local ZooKeeper recorded in {root}")
    _stop_zookeeper(state.zookeeper, kill=kill)


def start_zookeeper(root: Path, *, ready_timeout_ms: int = 30_000) -> ServerHandle:
    """Start the cluster's local ZooKeeper again on its port and data, and record its pid."""
    root = root.resolve()
    state = load_state(root)
    if state is None or state.zookeeper is None:
        raise LocalClusterError(f"no local ZooKeeper recorded in {root}")
    if zk_server.alive(state.zookeeper):
        return state.zookeeper
    server = _start_zookeeper(root, avoid_ports=[], ready_timeout_ms=ready_timeout_ms,
                              port=state.zookeeper.client_port)
    save_state(root, replace(state, zookeeper=server))
    return server


def format_table(state: ClusterState, root: Path) -> str:
    rows = [("NODE", "PID", "ROLES", "HTTP", "STATE")]
    for n in state.nodes:
        status = "running" if node_alive(root, n) else "stopped"
        rows.append((n.node_id, str(n.pid), ",".join(n.roles), n.http, status))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    footer = [f"epoch store: {state.epoch_store}"]
    if state.ca_file:
        footer.append(f"secure: TLS and node authentication on; CA {state.ca_file}")
    token_file = root / token_cli.AUTH_DIR / token_cli.ADMIN_TOKEN_FILE
    if state.sequencer_urls and token_file.exists():
        footer.append(f"console: {state.sequencer_urls[0]}/ui/ (sign in with the admin token "
                      f"in {token_file})")
    if state.zookeeper is not None:
        running = "running" if zk_server.alive(state.zookeeper) else "stopped"
        footer.append(f"zookeeper: pid {state.zookeeper.pid}, {running}, "
                      f"data in {state.zookeeper.dir}")
    return "\n".join([*lines, *footer])
