"""Each copy is written once: 1 MiB records on logs whose sequencer had only seen small
STOREs are not sent again, and not written again, by a store timeout fit for small records
(issue 15 item 5; real processes, fsync=always)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from seqlog import Client
from services import local_cluster as lc
from tests.integration.seqlog_cluster_support import READY_TIMEOUT_MS, metric

MIB = 1 << 20
RECORDS = 48
INFLIGHT = 16
LOGS = 20
SETTLE_TIMEOUT_S = 30.0


def _written(nodes: list[lc.NodeEntry]) -> tuple[float, float]:
    """(records, bytes) the storage nodes' record stores wrote so far."""
    return (sum(metric(n.http, "seqlog_storage_store_records") for n in nodes),
            sum(metric(n.http, "seqlog_storage_bytes_written") for n in nodes))


async def _settled(nodes: list[lc.NodeEntry]) -> tuple[float, float]:
    """The counters once two reads 0.3 s apart agree (late copies of re-sent waves land)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = await asyncio.to_thread(_written, nodes)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        now = await asyncio.to_thread(_written, nodes)
        if now == last:
            return now
        last = now
    raise AssertionError(f"storage counters still moving after {SETTLE_TIMEOUT_S} s")


@pytest.mark.timeout(180)
async def test_big_records_on_fresh_logs_are_written_once(cluster_dir: Path) -> None:
    spec = lc.LocalClusterSpec(dir=cluster_dir, storage_nodes=3, sequencers=1, replication=3,
                               base_port=lc.free_base_port(4), fsync="always")
    state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
    storage = [n for n in state.nodes if "storage" in n.roles]
    payload = os.urandom(MIB)
    rng = random.Random(15)
    async with Client(state.sequencer_urls, timeout_ms=60_000) as client:
        logs = list(range(1, LOGS + 1))
        # Each log's sequencer sees a small STORE first.
        await asyncio.gather(*(client.append(log, b"w") for log in logs))
        records_before, bytes_before = await _settled(storage)
        queue = list(range(RECORDS))

        async def worker() -> None:
            while queue:
                queue.pop()
                await client.append(rng.choice(logs), payload)

        await asyncio.gather(*(worker() for _ in range(INFLIGHT)))
        records_after, bytes_after = await _settled(storage)
    copies = RECORDS * 3
    assert records_after - records_before <= copies * 1.02, (
        f"{records_after - records_before:.0f} records written for {copies} copies")
    assert (bytes_after - bytes_before) / (RECORDS * MIB * 3) < 1.1
