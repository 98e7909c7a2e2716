"""A storage node whose segment file is damaged (issue 16 item 3), with real processes: one
flipped byte in st1's segment, st1 restarted; st1 comes back non-authoritative, and reads
through the HTTP API get every acknowledged record back, never DATALOSS, whichever f-majority
their rounds reach first (3 storage nodes, R=2: an f-majority is 2, so without authoritative
status a round over {st1, x} calls every record st1 forgot and x never had lost). Then the
other nodes rebuild st1's damaged copies and it is authoritative again (issue 17 d)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from seqlog_cluster_support import metric, poll
from test_disk_replacement import _copies_over_protocol, _shard

from seqlog import Client
from services import local_cluster as lc

pytestmark = pytest.mark.integration

RECORDS = 150
READ_LIMIT = 7
"""Records per HTTP read: many read rounds, each starting from a random node."""


def _flip_first_copy(data_dir: Path, payloads: list[bytes]) -> bytes:
    """Flip one byte of the first of ``payloads`` found in the node's first segment; returns
    that payload. Entries follow it, so this is damage mid-segment, not a torn tail."""
    segments = data_dir / "segments"
    path = sorted(p for p in segments.iterdir() if p.suffix == ".seg")[0]
    data = bytearray(path.read_bytes())
    for payload in payloads:
        offset = data.find(payload)
        if offset >= 0:
            data[offset] ^= 0x01
            path.write_bytes(bytes(data))
            return payload
    raise AssertionError("no acknowledged record in the first segment")


async def _read_everything(client: Client, last_lsn: int) -> tuple[dict[int, bytes], set[str]]:
    records: dict[int, bytes] = {}
    kinds: set[str] = set()
    cursor = 1
    while cursor <= last_lsn:
        result = await client.read(1, cursor, limit=READ_LIMIT, wait_ms=2_000)
        assert result.next_lsn > cursor, f"no progress at {cursor}"
        records.update((r.lsn, r.payload) for r in result.records)
        kinds.update(g.type for g in result.gaps if g.lo <= last_lsn)
        cursor = result.next_lsn
    return records, kinds


@pytest.mark.timeout(240)
async def test_reads_get_every_record_from_a_cluster_with_a_damaged_node(
        cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=2,
        base_port=lc.free_base_port(5), fsync="always"), ready_timeout_ms=60_000)
    acked: dict[int, bytes] = {}
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        for i in range(RECORDS):
            payload = b"damaged-segment-%05d-" % i + os.urandom(6).hex().encode()
            acked[(await client.append(1, payload)).lsn] = payload
        victim = next(n for n in state.nodes if n.node_id == "st1")
        await asyncio.to_thread(lc.stop_nodes, cluster_dir, [victim])
        _flip_first_copy(Path(victim.data_dir), [acked[lsn] for lsn in sorted(acked)])
        restarted = await asyncio.to_thread(lc.restart, cluster_dir, "st1")
        # Non-authoritative from the start; a rebuild of the damaged copies begins at once
        # and may be done already (checked below).
        assert metric(restarted.http, "seqlog_storage_corrupt_segments") == 1
        last = max(acked)
        for url in state.sequencer_urls:  # reads served by each node, several times over
            async with Client([url], timeout_ms=20_000) as reader:
                for _ in range(2):
                    found, kinds = await _read_everything(reader, last)
                    missing = sorted(lsn for lsn in acked if found.get(lsn) != acked[lsn])
                    assert not missing, f"{len(missing)} acknowledged records not read back"
                    assert "DATALOSS" not in kinds
        # Repaired: the other nodes rebuilt st1's copies, it vouches for everything again,
        # and every acknowledged record is on R=2 nodes, read over the node protocol.

        async def repaired() -> bool:
            shard = await asyncio.to_thread(_shard, restarted.http, "st1")
            return bool(shard["status"] == "AUTHORITATIVE" and shard["rebuilds_count"] >= 1
                        and metric(restarted.http, "seqlog_storage_non_authoritative") == 0)

        await poll(repaired, 60, "st1 rebuilt")

        async def replicated() -> bool:
            counts = await _copies_over_protocol(restarted.http, 1, last)
            return all(counts.get(lsn, 0) >= 2 for lsn in acked)

        await poll(replicated, 30, "R copies of every record")
