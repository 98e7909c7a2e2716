"""``seqlog local add-node``: a node joins a running local cluster without restarting the
others. The new node gets free ports, its own data directory and a config naming every node;
once it is ready, every other node's config file gets the new member and the node is sent
SIGHUP, which makes it reload its membership (``services.membership``). ``add_node`` returns
once every running node lists the new one in ``GET /v1/cluster``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from services.local_cluster import (
    LocalClusterError,
    NodeEntry,
    config_path,
    load_state,
    local_ssl,
    log_tail,
    node_alive,
    save_state,
    start_node,
    wait_ready,
)
from services.token_cli import local_admin_token
from shared.config import (
    NodeConfig,
    ProcessConfig,
    Role,
    TransportConfig,
    process_from_dict,
    to_dict,
)
from shared.net.local_ports import free_port_block
from shared.types import NodeId

_POLL_S = 0.05


def _read_config(root: Path, node_id: str) -> ProcessConfig:
    return process_from_dict(json.loads(config_path(root, node_id).read_text()))


def _write_config(root: Path, config: ProcessConfig) -> None:
    path = config_path(root, config.node_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_dict(config), indent=2) + "\n")
    tmp.replace(path)


def _next_id(existing: list[str], role: Role) -> NodeId:
    prefix = "seq" if role == "sequencer" else "st"
    taken = {int(n[len(prefix):]) for n in existing
             if n.startswith(prefix) and n[len(prefix):].isdigit()}
    return NodeId(f"{prefix}{max(taken, default=0) + 1}")


def _listed(http: str, node_id: str, context: ssl.SSLContext | None = None,
            token: str | None = None) -> bool:
    """``token``: the cluster's admin token when it has auth on (docs/SECURITY.md)."""
    scheme = "http" if context is None else "https"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{scheme}://{http}/v1/cluster", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=2.0, context=context) as resp:
            nodes = json.loads(resp.read())["nodes"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False
    return any(n.get("node_id") == node_id for n in nodes)


def add_node(root: Path, role: Role, *, ready_timeout_ms: int = 30_000) -> NodeEntry:
    """Start a new ``role`` node and make every running node take it into its membership."""
    root = root.resolve()
    state = load_state(root)
    if state is None:
        raise LocalClusterError(f"no cluster in {root}")
    running = [n for n in state.nodes if node_alive(root, n)]
    if not running:
        raise LocalClusterError(f"the cluster in {root} is not running")
    template = _read_config(root, running[0].node_id)
    node_id = _next_id([n.node_id for n in state.nodes], role)
    base = free_port_block(2, host=template.me.host)
    node = NodeConfig(node_id=node_id, roles=(role,), host=template.me.host,
                      http_port=base, data_port=base + 1)
    try:
        cluster = replace(template.cluster, nodes=(*template.cluster.nodes, node))
        config = replace(template, node_id=node_id, cluster=cluster,
                         data_dir=str(root / node_id), transport=TransportConfig())
    except ValueError as exc:
        raise LocalClusterError(str(exc)) from None
    _write_config(root, config)
    entry = NodeEntry(node_id=node_id, pid=start_node(root, node_id), roles=(role,),
                      http=node.http_address, data_dir=config.data_dir)
    save_state(root, replace(state, nodes=(*state.nodes, entry)))
    wait_ready(root, [entry], ready_timeout_ms=ready_timeout_ms)
    for other in state.nodes:
        _write_config(root, replace(_read_config(root, other.node_id), cluster=cluster))
    for other in running:
        with contextlib.suppress(ProcessLookupError):  # it died meanwhile: it reads the file
            os.kill(other.pid, signal.SIGHUP)          # when it starts again
    deadline_s = time.monotonic() + ready_timeout_ms / 1000
    context = local_ssl(root)
    token = local_admin_token(root)
    for other in running:
        while not _listed(other.http, node_id, context, token):
            if time.monotonic() > deadline_s:
                raise LocalClusterError(f"{other.node_id} did not take {node_id} into its "
                                        f"membership\n{log_tail(root, other.node_id)}")
            time.sleep(_POLL_S)
    return entry
