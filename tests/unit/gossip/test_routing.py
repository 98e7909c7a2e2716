"""Routing over the gossip view: the shared hash rule, its balance and stability, and the
client's router computing the same owners as the nodes."""

from __future__ import annotations

from collections import Counter

from seqlog.results import ClusterInfo, NodeInfo, NodeState
from seqlog.routing import Router
from shared.routing import routable_sequencers, sequencer_for
from shared.types import LogId, NodeId

S1, S2, S3 = NodeId("s1"), NodeId("s2"), NodeId("s3")
WEIGHTS = [(S1, 1.0), (S2, 1.0), (S3, 2.0)]
LOGS = [LogId(i) for i in range(1, 4001)]


def _owners(weights: list[tuple[NodeId, float]]) -> dict[LogId, NodeId | None]:
    return {log: sequencer_for(log, weights) for log in LOGS}


def test_only_alive_nodes_route_and_suspect_ones_only_when_none_is_alive() -> None:
    assert routable_sequencers(WEIGHTS, {S1: "ALIVE", S2: "DEAD", S3: "SUSPECT"}) == [(S1, 1.0)]
    assert routable_sequencers(WEIGHTS, {S1: "DEAD", S2: "SUSPECT", S3: "DEAD"}) == [(S2, 1.0)]
    assert routable_sequencers(WEIGHTS, dict.fromkeys((S1, S2, S3), "DEAD")) == []
    assert routable_sequencers([(S1, 0.0), (S2, 1.0)], {}) == [(S2, 1.0)]


def test_placement_follows_the_weights() -> None:
    counts = Counter(_owners(WEIGHTS).values())
    total = len(LOGS)
    for node, weight in WEIGHTS:
        share = counts[node] / total
        assert abs(share - weight / 4.0) < 0.03, (node, share)


def test_a_dead_node_moves_only_its_own_logs() -> None:
    before = _owners(WEIGHTS)
    after = _owners(routable_sequencers(WEIGHTS, {S2: "DEAD"}))
    moved = {log for log in LOGS if before[log] != after[log]}
    assert moved == {log for log in LOGS if before[log] == S2}
    assert all(after[log] in (S1, S3) for log in moved)


def _info(states: dict[NodeId, NodeState]) -> ClusterInfo:
    nodes = [NodeInfo(node_id=n, roles=("sequencer",), http=f"127.0.0.1:{7400 + i}",
                      state=states.get(n, "ALIVE"), sequencer_weight=w, storage_capacity=1.0)
             for i, (n, w) in enumerate(WEIGHTS)]
    nodes.append(NodeInfo(node_id=NodeId("st1"), roles=("storage",), http="127.0.0.1:7500",
                          state="ALIVE", sequencer_weight=5.0, storage_capacity=1.0))
    return ClusterInfo(cluster="c", nodes=nodes)


def test_client_router_agrees_with_the_nodes_rule() -> None:
    router = Router(["127.0.0.1:7400"], routes_max=10)
    router.learn_cluster(_info({S3: "DEAD"}))
    expected = _owners(routable_sequencers(WEIGHTS, {S3: "DEAD"}))
    for log in LOGS[:500]:
        assert router.owner(log) == expected[log]
    url_of = {S1: "http://127.0.0.1:7400", S2: "http://127.0.0.1:7401"}
    assert router.primary(LOGS[0]) == url_of[expected[LOGS[0]]]  # type: ignore[index]


def test_named_route_wins_and_a_failed_node_falls_back_to_the_hash() -> None:
    router = Router(["127.0.0.1:7400"], routes_max=10)
    router.learn_cluster(_info({}))
    log = next(log for log in LOGS if router.owner(log) == S3)
    router.learn_route(log, "s1")
    assert router.primary(log) == "http://127.0.0.1:7400"
    router.demote("http://127.0.0.1:7400")
    # s1 failed: its routes are forgotten and the hash skips it until the next view.
    assert router.owner(log) == S3
    other = next(log for log in LOGS if sequencer_for(log, WEIGHTS) == S1)
    assert router.owner(other) in (S2, S3)
