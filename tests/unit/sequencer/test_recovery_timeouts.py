"""A recovery member that seals and then hangs (issue 16 item 5), on a real in-process stack:
four StorageNodes behind real TCP servers, one of which answers SEAL and then nothing more, the
sequencer's asyncio driver and a file epoch store."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from epoch_store import open_epoch_store
from sequencer.runtime import SequencerRuntime
from shared.clock import SystemClock
from shared.config import (
    ClusterConfig,
    NodeConfig,
    SequencerConfig,
    StorageConfig,
    TransportConfig,
)
from shared.epoch_metadata import ProvisionSpec
from shared.net.pool import PeerPool
from shared.net.server import start_server
from shared.ports import EpochStore
from shared.status import Status
from shared.types import LogId, NodeId
from shared.wire.codec import Message
from shared.wire.recovery import Seal
from storage_node.runtime import ReplyFn, StorageNode
from tests.unit.storage_node.helpers import lsn, make_store, store

STORAGE = tuple(NodeId(f"st{i}") for i in range(1, 5))
HUNG = STORAGE[3]
LOG = LogId(7)
SEQ = NodeId("seq")


class SealsThenHangs:
    """Serves SEAL, then never answers anything else: a node stopped (or with a stalled disk)
    right after it sealed, its connection still open."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node
        self.swallowed = 0

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        if type(message) is Seal:
            self.node.on_message(peer, message, reply)
        else:
            self.swallowed += 1


@contextlib.asynccontextmanager
async def stack(root: Path, config: SequencerConfig) -> AsyncIterator[
        tuple[SequencerRuntime, EpochStore, list[StorageNode], SealsThenHangs]]:
    transport = TransportConfig(connect_timeout_ms=500, reconnect_backoff_ms_max=100)
    async with contextlib.AsyncExitStack() as exits:
        nodes: list[StorageNode] = []
        ports: dict[NodeId, int] = {}
        hung: SealsThenHangs | None = None
        for node_id in STORAGE:
            node = StorageNode(node_id=node_id, data_dir=str(root / node_id),
                               config=StorageConfig(fsync="never"))
            await node.start()
            exits.push_async_callback(node.close)
            nodes.append(node)
            handler: StorageNode | SealsThenHangs = node
            if node_id == HUNG:
                handler = hung = SealsThenHangs(node)
            server = await start_server("127.0.0.1", 0, node_id=node_id,
                                        cluster_fingerprint="t", handler=handler,
                                        config=transport)
            exits.push_async_callback(server.close)
            ports[node_id] = server.port
        pool = PeerPool(node_id=SEQ, cluster_fingerprint="t", config=transport,
                        addresses=lambda n: ("127.0.0.1", ports[n]) if n in ports else None)
        exits.push_async_callback(pool.close)
        epochs = open_epoch_store(f"file://{root / 'epochs'}")
        exits.push_async_callback(epochs.close)
        cluster = ClusterConfig(
            nodes=(NodeConfig(node_id=SEQ, roles=("sequencer",)),
                   *(NodeConfig(node_id=n, roles=("storage",), data_port=ports[n])
                     for n in STORAGE)),
            replication_factor=2)
        runtime = SequencerRuntime(node_id=SEQ, config=config, cluster=cluster, transport=pool,
                                   epoch_store=epochs, clock=SystemClock(),
                                   rng=random.Random(5))
        await runtime.start()
        exits.push_async_callback(runtime.close)
        assert hung is not None
        yield runtime, epochs, nodes, hung


async def recovery_time_s(root: Path, config: SequencerConfig, deadline_s: float) -> float:
    """Epoch 1 of a dead sequencer left copies above its last known good on every node; the
    next sequencer's recovery runs while st4 seals and then hangs. How long until the new
    epoch's first append is released (recovery done), or ``deadline_s`` if it is not."""
    async with stack(root, config) as (runtime, epochs, nodes, hung):
        status, epoch, _ = await epochs.activate(
            LOG, writer=NodeId("dead"),
            provision=ProvisionSpec(nodeset=STORAGE, replication_factor=2))
        assert (status, epoch) == (Status.OK, 1)
        for node in nodes:
            assert (await store(node, make_store(lsn(1, 1), (b"x",), log_id=LOG))).status is (
                Status.OK)
        started_s = time.monotonic()
        result = await runtime.append(LOG, (b"after failover",), None)
        assert result.status is Status.OK
        while runtime.release_lsn(LOG) < result.last_lsn:
            if time.monotonic() - started_s > deadline_s:
                return deadline_s
            await asyncio.sleep(0.01)
        assert hung.swallowed  # it was asked for more than its seal
        return time.monotonic() - started_s


@pytest.mark.timeout(60)
async def test_a_member_that_seals_and_hangs_is_dropped_after_the_request_timeout(
        tmp_path: Path) -> None:
    # recovery_timeout_ms is far beyond the deadline: only the per-request timeout can end the
    # wait for the hung member (without it the recovery stalls for the full 60 s and then
    # starts over).
    config = SequencerConfig(recovery_timeout_ms=60_000, recovery_request_timeout_ms=300,
                             append_timeout_ms=5_000)
    took_s = await recovery_time_s(tmp_path, config, deadline_s=10.0)
    assert took_s < 5.0, f"recovery stalled on the hung member for {took_s:.1f} s"
