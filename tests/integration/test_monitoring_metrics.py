"""Every metric that the Grafana dashboard and the Prometheus alert rules in
``k8s/monitoring/`` name is exported by a running node of a real local cluster (after one
append and one read, so that the request histograms have their series), and the epoch store
and sequencer metrics added for them move with the cluster's work."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
from pathlib import Path

import pytest
from seqlog_cluster_support import RunningCluster

from seqlog import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))
from monitoring_support import dashboard_exprs, metric_names, rule_exprs

pytestmark = pytest.mark.integration


def exported(cluster: RunningCluster) -> dict[str, set[str]]:
    """Sample names each node exports at /metrics."""
    names: dict[str, set[str]] = {}
    for node in cluster.state.nodes:
        with urllib.request.urlopen(f"http://{node.http}/metrics", timeout=10) as answer:
            lines = answer.read().decode().splitlines()
        names[node.node_id] = {line.split("{")[0].split(" ")[0] for line in lines
                               if line and not line.startswith("#")}
    return names


async def test_every_metric_of_the_dashboard_and_rules_is_exported(
        local_cluster: RunningCluster) -> None:
    log_id = int.from_bytes(os.urandom(4), "big") + 7_000_000
    async with Client(local_cluster.sequencer_urls, protocol="http") as client:
        written = await client.append(log_id, b"for the histograms")
        await client.read(log_id, written.lsn)
    by_node = await asyncio.to_thread(exported, local_cluster)
    everywhere = set().union(*by_node.values())
    named = metric_names(dashboard_exprs()) | metric_names(rule_exprs())
    assert named - everywhere == set(), sorted(named - everywhere)
    # The epoch store and ZooKeeper counters are on every node, whatever its store.
    for node_id, names in by_node.items():
        assert {"seqlog_epoch_store_cas_conflicts_total",
                "seqlog_epoch_store_ambiguous_writes_total",
                "seqlog_zookeeper_connections_lost_total"} <= names, node_id
