"""Idle logs cost nothing (issue 15): the periodic release broadcast visits only logs whose
release moved, and a sequencer idle for ``idle_deactivate_ms`` is deactivated (epoch marked
clean, dropped) and comes back on the next append without recovery. Real storage nodes over
TCP and a file epoch store; the transport is the real PeerPool, wrapped only to count the
RELEASEs it is asked to send."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epoch_store import open_epoch_store
from sequencer.runtime import SequencerRuntime
from shared.clock import SystemClock
from shared.config import ClusterConfig, NodeConfig, SequencerConfig
from shared.net.pool import PeerPool
from shared.ports import EpochStore
from shared.status import Status
from shared.types import Epoch, LogId, NodeId, lsn_to_epoch
from shared.wire.release import Release
from shared.wire.store_batch import ReleaseBatch
from tests.unit.sequencer.storage_stack import storage_stack

STORAGE = (NodeId("st1"), NodeId("st2"), NodeId("st3"))
BROADCAST_MS = 50


class CountingTransport:
    """The real pool; remembers the log of every RELEASE sent (alone or in a batch)."""

    def __init__(self, pool: PeerPool) -> None:
        self.pool = pool
        self.released: list[LogId] = []

    def request(self, node: NodeId, message: Any, callback: Callable[[Any], None], *,
                timeout_ms: int | None = None) -> None:
        self.pool.request(node, message, callback, timeout_ms=timeout_ms)

    def send(self, node: NodeId, message: Any) -> bool:
        if type(message) is Release:
            self.released.append(message.log_id)
        elif type(message) is ReleaseBatch:
            self.released.extend(LogId(log_id) for log_id, _ in message.releases)
        return self.pool.send(node, message)

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any:
        return await self.pool.call(node, message, timeout_ms)


@dataclass
class Stack:
    runtime: SequencerRuntime
    store: EpochStore
    transport: CountingTransport
    storage: Any = None


def _stack(idle_deactivate_ms: int, replication: int = 2) -> Callable[[Path], Any]:
    async def fixture(tmp_path: Path) -> AsyncIterator[Stack]:
        async with storage_stack(tmp_path, STORAGE) as storage:
            cluster = ClusterConfig(
                nodes=(NodeConfig(node_id=NodeId("seq"), roles=("sequencer",)),
                       *(NodeConfig(node_id=n, roles=("storage",), data_port=storage.ports[n])
                         for n in STORAGE)),
                replication_factor=replication)
            store = open_epoch_store(f"file://{tmp_path / 'epochs'}")
            transport = CountingTransport(storage.pool)
            runtime = SequencerRuntime(
                node_id=NodeId("seq"), config=SequencerConfig(
                    append_timeout_ms=5_000, release_broadcast_interval_ms=BROADCAST_MS,
                    idle_deactivate_ms=idle_deactivate_ms),
                cluster=cluster, transport=transport, epoch_store=store, clock=SystemClock(),
                rng=random.Random(3))
            await runtime.start()
            yield Stack(runtime, store, transport, storage)
            await runtime.close()
            await store.close()
    return fixture


busy_stack = pytest.fixture(_stack(600_000), name="busy_stack")
whole_nodeset_stack = pytest.fixture(_stack(600_000, replication=3),
                                     name="whole_nodeset_stack")
idle_stack = pytest.fixture(_stack(300), name="idle_stack")


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline_s = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline_s, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
async def test_broadcast_visits_only_logs_whose_release_moved(busy_stack: Stack) -> None:
    runtime, transport = busy_stack.runtime, busy_stack.transport
    for log_id in range(1, 21):
        assert (await runtime.append(LogId(log_id), (b"x",), None)).status is Status.OK
    # A moved pointer goes out with a few broadcasts, then the log is left alone.
    await _until(lambda: not runtime._broadcast_dirty, "the first broadcasts to end")
    await asyncio.sleep(BROADCAST_MS * 4 / 1000)
    transport.released.clear()
    await asyncio.sleep(BROADCAST_MS * 4 / 1000)
    assert transport.released == []  # 20 idle logs: not one RELEASE, not one visit
    assert (await runtime.append(LogId(7), (b"y",), None)).status is Status.OK
    await _until(lambda: len(transport.released) >= 3 * len(STORAGE),
                 "the moved pointer to be broadcast")
    assert set(transport.released) == {LogId(7)}
    assert len(runtime.sequencers) == 20  # idle, but not for idle_deactivate_ms yet


@pytest.mark.timeout(60)
async def test_a_pointer_its_release_told_the_whole_nodeset_is_broadcast_once_more(
        whole_nodeset_stack: Stack) -> None:
    """R = 3 of 3 nodes: a completed append's owed RELEASE tells every node of the nodeset its
    pointer, so the next periodic broadcast sends nothing for it and one more broadcast
    follows (not three): the pointer goes out twice in all, and every node learns it."""
    runtime, transport = whole_nodeset_stack.runtime, whole_nodeset_stack.transport
    log_id = LogId(9)
    assert (await runtime.append(log_id, (b"x",), None)).status is Status.OK
    await _until(lambda: not runtime._broadcast_dirty, "the first broadcasts to end")
    await asyncio.sleep(BROADCAST_MS * 3 / 1000)
    transport.released.clear()
    appended = await runtime.append(log_id, (b"y",), None)
    assert appended.status is Status.OK
    await _until(lambda: runtime.sequencers[log_id].release_lsn == appended.last_lsn,
                 "the release")
    await _until(lambda: not runtime._broadcast_dirty, "the broadcasts to end")
    await asyncio.sleep(BROADCAST_MS * 3 / 1000)
    assert transport.released == [log_id] * (2 * len(STORAGE))
    for node in whole_nodeset_stack.storage.nodes:
        await _until(lambda node=node: node.store.durable_release_lsn(log_id)  # type: ignore[misc]
                     == appended.last_lsn, "every node to hold the pointer")


@pytest.mark.timeout(60)
async def test_idle_sequencer_is_deactivated_and_comes_back_without_recovery(
        idle_stack: Stack) -> None:
    runtime, store = idle_stack.runtime, idle_stack.store
    log_id = LogId(5)
    first = [await runtime.append(log_id, (b"a%d" % i,), None) for i in range(5)]
    assert all(r.status is Status.OK for r in first)
    epoch = runtime.epoch(log_id)
    await _until(lambda: log_id not in runtime.sequencers, "deactivation")
    await _until(lambda: not runtime._deactivating, "the clean mark")
    assert runtime.deactivations_count == 1
    status, lce = await store.get_last_clean_epoch(log_id)
    assert status is Status.OK and lce is not None
    assert (lce.epoch, lce.tail_lsn) == (epoch, first[-1].last_lsn)

    again = await runtime.append(log_id, (b"b",), None)
    assert again.status is Status.OK
    assert lsn_to_epoch(again.first_lsn) == Epoch(epoch + 1)
    assert again.first_lsn > first[-1].last_lsn
    sequencer = runtime.sequencers[log_id]
    assert sequencer.releasable and sequencer.recovery is None
    assert sequencer.release_lsn == again.last_lsn  # released at once: nothing to recover
    assert not runtime.recovery_phases_count  # no recovery started at all


@pytest.mark.timeout(60)
async def test_append_during_the_clean_mark_waits_for_it_and_needs_no_recovery(
        idle_stack: Stack) -> None:
    runtime = idle_stack.runtime
    log_id = LogId(6)
    first = await runtime.append(log_id, (b"a",), None)
    assert first.status is Status.OK
    await _until(lambda: log_id not in runtime.sequencers, "deactivation")
    # Possibly while the mark is still being written: the activation waits for it.
    again = await runtime.append(log_id, (b"b",), None)
    assert again.status is Status.OK and again.first_lsn > first.last_lsn
    assert runtime.sequencers[log_id].releasable
    assert not runtime.recovery_phases_count


@pytest.mark.timeout(60)
async def test_a_log_with_appends_in_flight_is_not_deactivated(idle_stack: Stack) -> None:
    runtime = idle_stack.runtime
    log_id = LogId(8)
    for i in range(20):  # busier than idle_deactivate_ms: stays active throughout
        assert (await runtime.append(log_id, (b"%d" % i,), None)).status is Status.OK
        await asyncio.sleep(0.03)
        assert log_id in runtime.sequencers
    assert runtime.deactivations_count == 0


def test_idle_deactivate_ms_is_validated() -> None:
    with pytest.raises(ValueError, match="idle_deactivate_ms"):
        SequencerConfig(idle_deactivate_ms=0)
    assert SequencerConfig().idle_deactivate_ms == 600_000

