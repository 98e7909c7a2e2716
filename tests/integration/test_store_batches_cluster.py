"""Cross-log STORE batching on real node processes (issue 15): concurrent appends to many
logs through `seqlog.Client` reach the storage nodes as STORE_BATCHes, and every record reads
back in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from seqlog_cluster_support import metric

from seqlog import Client
from services import local_cluster as lc

pytestmark = pytest.mark.integration

LOGS = list(range(1, 201))
ROUNDS = 3


@pytest.mark.timeout(180)
async def test_appends_to_many_logs_travel_in_store_batches_and_read_back(
        cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never"), ready_timeout_ms=60_000)
    storage = [n for n in state.nodes if "storage" in n.roles]
    async with Client(state.sequencer_urls, timeout_ms=30_000) as client:
        written: dict[int, list[tuple[int, bytes]]] = {log: [] for log in LOGS}
        for round_index in range(ROUNDS):
            payloads = {log: b"%d:%d" % (log, round_index) for log in LOGS}
            results = await asyncio.gather(*(client.append(log, payloads[log])
                                             for log in LOGS))
            for log, result in zip(LOGS, results, strict=True):
                written[log].append((result.lsn, payloads[log]))
        for log in LOGS:
            result = await client.read(log, limit=10)
            assert [(r.lsn, r.payload) for r in result.records] == written[log], log
    batches = [await asyncio.to_thread(metric, n.http, "seqlog_storage_store_batches")
               for n in storage]
    stores = [await asyncio.to_thread(metric, n.http, "seqlog_storage_store_messages")
              for n in storage]
    # R=3 of 3: every node holds every record, and most of them came in batches.
    assert all(count >= len(LOGS) * ROUNDS for count in stores), stores
    assert all(count >= 1 for count in batches), batches
    assert sum(batches) < sum(stores) / 4, (batches, stores)
