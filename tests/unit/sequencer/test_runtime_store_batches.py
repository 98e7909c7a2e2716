"""Cross-log STORE batching in the sequencer's driver, on the real in-process stack of
test_runtime (three StorageNodes behind TCP servers, a PeerPool, a file epoch store)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from epoch_store import open_epoch_store
from sequencer.runtime import SequencerRuntime
from shared.clock import SystemClock
from shared.config import ClusterConfig, NodeConfig, SequencerConfig
from shared.status import Status
from shared.types import LogId, NodeId
from tests.unit.sequencer.storage_stack import storage_stack
from tests.unit.sequencer.test_runtime import STORAGE, Stack, stack

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


@pytest.mark.timeout(30)
async def test_store_batch_stores_max_one_sends_each_store_alone(tmp_path: Path) -> None:
    """The setting for clusters that still have storage nodes of builds without STORE_BATCH
    (they would close the connection): every STORE and RELEASE in a frame of its own."""
    async with storage_stack(tmp_path, STORAGE) as storage:
        cluster = ClusterConfig(
            nodes=(NodeConfig(node_id=NodeId("seq"), roles=("sequencer",)),
                   *(NodeConfig(node_id=n, roles=("storage",), data_port=storage.ports[n])
                     for n in STORAGE)),
            replication_factor=2)
        store = open_epoch_store(f"file://{tmp_path / 'epochs'}")
        runtime = SequencerRuntime(
            node_id=NodeId("seq"), config=SequencerConfig(store_batch_stores_max=1),
            cluster=cluster, transport=storage.pool, epoch_store=store, clock=SystemClock(),
            rng=random.Random(3))
        await runtime.start()
        try:
            for _ in range(2):
                results = await asyncio.gather(*(runtime.append(log_id, (b"x",), None)
                                                 for log_id in LOGS))
                assert all(r.status is Status.OK for r in results)
            stats = [n.stats() for n in storage.nodes]
            assert sum(s["store_messages"] for s in stats) >= 2 * 2 * len(LOGS)
            assert sum(s["store_batches"] for s in stats) == 0
        finally:
            await runtime.close()
            await store.close()
