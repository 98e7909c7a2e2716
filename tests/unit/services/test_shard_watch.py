"""``services.shard_watch``: which storage nodes take no new copies (retired) and which hold
none any more (moved), as the cluster state says."""

from __future__ import annotations

from epoch_store.cluster_state import MemoryClusterState
from services.shard_watch import ShardWatch, leaving
from shared.cluster_state import ClusterState, ShardState, ShardStatus
from shared.types import NodeId


def _state(**statuses: ShardStatus) -> ClusterState:
    return ClusterState(shards=tuple(ShardState(node_id=n, generation=1, status=s)
                                     for n, s in statuses.items()))


def test_retired_and_moved() -> None:
    state = _state(a=ShardStatus.AUTHORITATIVE, b=ShardStatus.DRAINING,
                   c=ShardStatus.DRAINED, d=ShardStatus.REMOVED, e=ShardStatus.REBUILDING)
    retired, moved = leaving(state)
    assert retired == {NodeId("b"), NodeId("c"), NodeId("d")}
    assert moved == {NodeId("c"), NodeId("d")}


async def test_poll_once_tells_the_listener() -> None:
    store = MemoryClusterState()
    store.state = _state(a=ShardStatus.AUTHORITATIVE, b=ShardStatus.DRAINING)
    seen: list[tuple[frozenset[NodeId], frozenset[NodeId]]] = []
    watch = ShardWatch(store, lambda retired, moved: seen.append((retired, moved)))
    assert await watch.poll_once()
    assert seen == [(frozenset({NodeId("b")}), frozenset())]
