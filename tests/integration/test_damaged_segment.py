"""A storage node whose segment file is damaged (issue 16 item 3), with real processes: one
flipped byte in st1's first segment, st1 restarted; st1 comes back non-authoritative, and reads
through the HTTP API get every acknowledged record back, never DATALOSS, whichever f-majority
their rounds reach first (3 storage nodes, R=2: an f-majority is 2, so without authoritative
status a round over {st1, x} calls every record st1 forgot and x never had lost). Then the
other nodes repair st1's damaged copies and it is authoritative again (issue 17 d).

The repair is a mini-rebuild (issue 17): segments roll every few dozen entries here, so the
damaged first segment holds a small part of st1's copies; its index file names the LSN range
they span, the cluster state records a rebuild of only that range (``dirty_ranges``), and
the donors send a small fraction of what a rebuild of st1's whole shard would."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from seqlog_cluster_support import metric, poll
from test_disk_replacement import _copies_over_protocol, _shard

from seqlog import Client
from services import local_cluster as lc
from shared.config import StorageConfig

pytestmark = pytest.mark.integration

RECORDS = 600
READ_LIMIT = 25
"""Records per HTTP read: many read rounds, each starting from a random node."""
SEGMENT_ENTRIES = 32
"""``index_memory_entries_max``: a segment rolls after this many entries, so st1's ~400
copies span a dozen segments and the damaged one a small part of them."""


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


@pytest.mark.timeout(300)
async def test_reads_get_every_record_from_a_cluster_with_a_damaged_node(
        cluster_dir: Path) -> None:
    storage = dataclasses.replace(StorageConfig(), index_memory_entries_max=SEGMENT_ENTRIES,
                                  rebuild_poll_interval_ms=200)
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=2, storage=storage,
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
        # The first segment is closed with its index file: the restart does not read it, the
        # background scrub finds the damage just after. Non-authoritative from then on; a
        # mini-rebuild of the damaged range begins at once and may be done already.

        async def found() -> bool:
            return metric(restarted.http, "seqlog_storage_corrupt_segments") == 1

        await poll(found, 30, "the scrub finds st1's damaged segment")
        last = max(acked)
        for url in state.sequencer_urls:  # reads served by each node, several times over
            async with Client([url], timeout_ms=20_000) as reader:
                for _ in range(2):
                    found_records, kinds = await _read_everything(reader, last)
                    missing = sorted(lsn for lsn in acked
                                     if found_records.get(lsn) != acked[lsn])
                    assert not missing, f"{len(missing)} acknowledged records not read back"
                    assert "DATALOSS" not in kinds
        # Repaired: the other nodes rebuilt st1's damaged range, it vouches for everything
        # again, and every acknowledged record is on R=2 nodes, read over the node protocol.

        async def repaired() -> bool:
            shard = await asyncio.to_thread(_shard, restarted.http, "st1")
            return bool(shard["status"] == "AUTHORITATIVE" and shard["rebuilds_count"] >= 1
                        and metric(restarted.http, "seqlog_storage_non_authoritative") == 0)

        await poll(repaired, 60, "st1 rebuilt")
        # ... by a mini-rebuild: only the damaged segment's range (the scrub's find; a read
        # of the damaged entry first would add its own, merged), no new disk generation.
        shard = await asyncio.to_thread(_shard, restarted.http, "st1")
        assert shard["mini"] and shard["mini_rebuilds_count"] == shard["rebuilds_count"], shard
        assert shard["generation"] == shard["rebuilds_count"], shard  # 1, or 2 if begun again
        # The finished rebuild's ranges left the cluster state; their size stays: one log.
        assert shard["dirty_ranges"] == [] and shard["scope_logs"] == 1, shard
        assert shard["scope_ranges"] >= 1, shard
        assert metric(restarted.http, "seqlog_storage_rebuild_mini_finished") >= 1
        sent = 0
        for node in state.nodes:
            if node.node_id in ("st2", "st3"):
                sent += int(metric(node.http, "seqlog_storage_rebuild_records_sent"))
        # Each donor sends its copies in the range (about 2/3 of it); a whole-shard rebuild
        # would have sent about 2/3 of every record from each donor (~800).
        assert 0 < sent < RECORDS // 3, sent
        shown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "services.cli", "rebuild", "status",
                             "--dir", str(cluster_dir)],
            capture_output=True, text=True, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        row = next(line for line in shown.stdout.splitlines() if line.startswith("st1 "))
        assert "AUTHORITATIVE" in row and "mini: " in row and "of 1 log" in row, shown.stdout

        async def replicated() -> bool:
            counts = await _copies_over_protocol(restarted.http, 1, last)
            return all(counts.get(lsn, 0) >= 2 for lsn in acked)

        await poll(replicated, 30, "R copies of every record")
