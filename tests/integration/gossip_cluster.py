"""A small launcher for the gossip integration tests: real node processes (``python -m
services.node``) with shortened gossip settings, one ``config.json`` per node. Separate from
``services.local_cluster`` so that tests can set the failure detector's timing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.config import (
    ClusterConfig,
    GossipConfig,
    NodeConfig,
    ProcessConfig,
    StorageConfig,
    to_dict,
)
from shared.net.local_ports import free_port_block
from shared.routing import routable_sequencers, sequencer_for
from shared.types import LogId, NodeId

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0

FAST_GOSSIP = GossipConfig(
    gossip_interval_ms=50, gossip_threshold_intervals=10, suspect_duration_ms=1_000,
    min_gossips_for_stable_state=3, startup_wait_ms=500, gossip_time_skew_ms=2_000,
    failover_duration_ms=300)
"""Threshold 500 ms, SUSPECT 1 s: the production timing scaled down for tests."""
THRESHOLD_MS = FAST_GOSSIP.gossip_interval_ms * FAST_GOSSIP.gossip_threshold_intervals


def _free_ports(count: int) -> list[int]:
    base = free_port_block(count)
    return list(range(base, base + count))


def get_json(http: str, path: str, timeout_s: float = 2.0) -> Any:
    with urllib.request.urlopen(f"http://{http}{path}", timeout=timeout_s) as response:
        return json.loads(response.read())


@dataclass
class GossipCluster:
    root: Path
    cluster: ClusterConfig
    gossip: GossipConfig
    pids: dict[NodeId, int] = field(default_factory=dict)
    _procs: dict[NodeId, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def sequencers(self) -> list[NodeId]:
        return [n.node_id for n in self.cluster.sequencer_nodes]

    def http(self, node: NodeId) -> str:
        config = self.cluster.node(node)
        assert config is not None
        return config.http_address

    def url(self, node: NodeId) -> str:
        return f"http://{self.http(node)}"

    def start(self, node: NodeId) -> None:
        config = ProcessConfig(node_id=node, cluster=self.cluster,
                               data_dir=str(self.root / node / "data"),
                               epoch_store="file", epoch_store_dir=str(self.root / "epochs"),
                               storage=StorageConfig(fsync="never"), gossip=self.gossip)
        (self.root / node / "data").mkdir(parents=True, exist_ok=True)
        path = self.root / node / "config.json"
        path.write_text(json.dumps(to_dict(config), indent=2))
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        with open(self.root / node / "node.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.node", "--config", str(path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        self._procs[node] = proc
        self.pids[node] = proc.pid

    def wait_ready(self, nodes: list[NodeId] | None = None) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for node in nodes or [n.node_id for n in self.cluster.nodes]:
            while True:
                proc = self._procs[node]
                if proc.poll() is not None:
                    log = (self.root / node / "node.log").read_text()[-3000:]
                    raise AssertionError(f"{node} exited {proc.returncode}:\n{log}")
                with contextlib.suppress(OSError, urllib.error.URLError):
                    if get_json(self.http(node), "/readyz").get("status") == "OK":
                        break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{node} not ready")
                time.sleep(0.05)

    def signal(self, node: NodeId, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pids[node], signum)

    def kill9(self, node: NodeId) -> None:
        self.signal(node, signal.SIGKILL)
        self._procs[node].wait(timeout=10)

    def stop_all(self) -> None:
        for node, proc in self._procs.items():
            if proc.poll() is None:
                self.signal(node, signal.SIGCONT)
                self.signal(node, signal.SIGKILL)
                proc.wait(timeout=10)

    def states(self, observer: NodeId) -> dict[NodeId, str]:
        doc = get_json(self.http(observer), "/v1/cluster")
        return {NodeId(n["node_id"]): n["state"] for n in doc["nodes"]}

    def owners(self, observer: NodeId, logs: list[LogId]) -> dict[LogId, NodeId | None]:
        """Each log's sequencer node as ``observer``'s gossip view routes it."""
        routable = routable_sequencers(
            [(n.node_id, n.sequencer_weight) for n in self.cluster.sequencer_nodes],
            self.states(observer))
        return {log: sequencer_for(log, routable) for log in logs}


def launch(root: Path, *, storage_nodes: int = 3, sequencers: int = 3, replication: int = 3,
           gossip: GossipConfig = FAST_GOSSIP) -> GossipCluster:
    ids = [f"st{i}" for i in range(1, storage_nodes + 1)]
    ids += [f"s{i}" for i in range(1, sequencers + 1)]
    ports = _free_ports(2 * len(ids))
    nodes = tuple(
        NodeConfig(node_id=NodeId(node), roles=("storage",) if node.startswith("st")
                   else ("sequencer",),
                   http_port=ports[2 * i], data_port=ports[2 * i + 1])
        for i, node in enumerate(ids))
    cluster = GossipCluster(root=root, gossip=gossip, cluster=ClusterConfig(
        cluster_name="gossip-test", nodes=nodes, replication_factor=replication))
    (root / "epochs").mkdir(parents=True, exist_ok=True)
    try:
        for node in ids:
            cluster.start(NodeId(node))
        cluster.wait_ready()
    except BaseException:
        cluster.stop_all()
        raise
    return cluster
