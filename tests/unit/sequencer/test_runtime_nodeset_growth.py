"""The sequencer driver when a storage node is added (SIGHUP reload, ``update_cluster``): it
reaches the new node first, then the active log finishes its epoch and takes the next one on
a nodeset with the node, and appends store copies there. Real storage nodes behind TCP."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from epoch_store import open_epoch_store
from sequencer.runtime import SequencerRuntime
from shared.clock import SystemClock
from shared.config import ClusterConfig, NodeConfig, SequencerConfig
from shared.status import Status
from shared.types import LogId, NodeId, lsn_to_epoch
from tests.unit.sequencer.storage_stack import storage_stack

OLD = (NodeId("st1"), NodeId("st2"), NodeId("st3"))
ST4 = NodeId("st4")


async def test_an_added_storage_node_joins_the_active_log_at_a_new_epoch(
        tmp_path: Path) -> None:
    async with storage_stack(tmp_path, (*OLD, ST4)) as storage:
        def cluster(nodes: tuple[NodeId, ...]) -> ClusterConfig:
            return ClusterConfig(
                nodes=(NodeConfig(node_id=NodeId("seq"), roles=("sequencer",)),
                       *(NodeConfig(node_id=n, roles=("storage",), data_port=storage.ports[n])
                         for n in nodes)),
                replication_factor=2, nodeset_size=4)

        store = open_epoch_store(f"file://{tmp_path / 'epochs'}")
        runtime = SequencerRuntime(
            node_id=NodeId("seq"), config=SequencerConfig(append_timeout_ms=5_000),
            cluster=cluster(OLD), transport=storage.pool, epoch_store=store,
            clock=SystemClock(), rng=random.Random(4))
        await runtime.start()
        try:
            log = LogId(5)
            first = await runtime.append(log, (b"a",), None)
            assert first.status is Status.OK
            sequencer = runtime.sequencers[log]
            assert sequencer.metadata is not None and sequencer.metadata.nodeset == OLD
            runtime.update_cluster(cluster((*OLD, ST4)))
            for _ in range(1000):  # 10 s at most
                if sequencer.metadata.nodeset == (*OLD, ST4):
                    break
                await asyncio.sleep(0.01)
            assert sequencer.metadata.nodeset == (*OLD, ST4)
            status, metadata = await store.get_metadata(log)
            assert status is Status.OK and metadata is not None
            assert [r.nodeset for r in metadata.nodeset_ranges()] == [OLD, (*OLD, ST4)]
            st4 = storage.nodes[3]
            lsns = []
            for i in range(40):
                result = await runtime.append(log, (b"b%d" % i,), None)
                assert result.status is Status.OK
                lsns.append(result.first_lsn)
            assert min(lsn_to_epoch(lsn) for lsn in lsns) > lsn_to_epoch(first.first_lsn)
            held = st4.store.held_ranges(log, min(lsns), max(lsns))
            assert held, "no copy of the new epoch on st4"
        finally:
            await runtime.close()
            await store.close()
