"""Cross-log STORE batching in the sequencer's driver, on the real in-process stack of
test_runtime (three StorageNodes behind TCP servers, a PeerPool, a file epoch store)."""

from __future__ import annotations

import asyncio

import pytest

from shared.status import Status
from shared.types import LogId, NodeId
from tests.unit.sequencer.test_runtime import Stack, stack

__all__ = ["stack"]  # the fixture

LOGS = [LogId(200 + i) for i in range(40)]


async def _warm(stack: Stack) -> None:
    results = await asyncio.gather(*(stack.runtime.append(log_id, (b"warm",), None)
                                     for log_id in LOGS))
    assert all(r.status is Status.OK for r in results)


@pytest.mark.timeout(30)
async def test_appends_to_many_logs_share_one_frame_per_storage_node(stack: Stack) -> None:
    await _warm(stack)
    frames_before = stack.pool.counters.frames_sent
    batches_before = sum(n.stats()["store_batches"] for n in stack.nodes)
    stores_before = sum(n.stats()["store_messages"] for n in stack.nodes)
    results = await asyncio.gather(*(stack.runtime.append(log_id, (b"x%d" % log_id,), None)
                                     for log_id in LOGS))
    assert all(r.status is Status.OK for r in results)
    stores = sum(n.stats()["store_messages"] for n in stack.nodes) - stores_before
    assert stores >= 2 * len(LOGS)  # R=2 copies of each record
    assert sum(n.stats()["store_batches"] for n in stack.nodes) - batches_before >= 2
    # Without batching: a frame per STORE (80 or more). With it: about one per node and
    # loop iteration, plus the RELEASE_BATCHes that follow.
    assert stack.pool.counters.frames_sent - frames_before <= 20, (
        stack.pool.counters.frames_sent - frames_before)
    # Each log's timer is pushed again only when its deadline moves earlier.
    assert len(stack.runtime._timers) <= 4 * len(LOGS)


@pytest.mark.timeout(30)
async def test_a_batch_to_a_dead_node_fails_each_store_and_new_waves_succeed(
        stack: Stack) -> None:
    await _warm(stack)
    await stack.servers[NodeId("st3")].close()
    st3 = next(n for n in stack.nodes if n.node_id == "st3")
    stored_before = st3.stats()["store_messages"]
    for round_index in range(3):
        results = await asyncio.gather(*(
            stack.runtime.append(log_id, (b"r%d" % round_index,), None) for log_id in LOGS))
        assert [r.status for r in results] == [Status.OK] * len(LOGS)
    assert st3.stats()["store_messages"] == stored_before
