"""Disk reclaim on real files: trimmed segments deleted, mixed ones compacted, a restart
rebuilding exactly the same state, reads racing with compaction, retention by age."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shared.config import StorageConfig
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.release import Release
from shared.wire.store import Store
from shared.wire.trim import Trim, Trimmed
from storage_node import record_store
from storage_node.core.retention import BacklogTable
from storage_node.record_store import ReclaimReport
from storage_node.runtime import StorageNode
from storage_node.segment_format import HEADER_BYTES, StoreMeta, scan_segment
from tests.unit.storage_node.helpers import (
    assert_ok,
    data_size,
    file_size,
    flip_byte,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    read_file,
    request,
    seal,
    segment_paths,
    storage_config,
    store,
    wait_until,
)

LOG_A = LogId(11)
LOG_B = LogId(12)
LOG_SEALED_ONLY = LogId(13)
BIG_BYTES = 100 * 1024
ALL = 2**64 - 2
T0_MS = 1_700_000_000_000


def big(log_id: LogId, esn: int, *, timestamp_ms: int = T0_MS, release_esn: int = 0) -> Store:
    first = lsn(1, esn)
    message = make_store(first, (payload_for(first + log_id, BIG_BYTES),), log_id=log_id,
                         release_lsn=lsn(1, release_esn) if release_esn else 0)
    return Store(**{**_fields(message), "timestamp_ms": timestamp_ms})


def _fields(message: Store) -> dict[str, Any]:
    return {f.name: getattr(message, f.name) for f in dataclasses.fields(message) if f.init}


def reclaim_config(**overrides: Any) -> StorageConfig:
    # A long interval: the tests run passes themselves.
    settings: dict[str, Any] = {"retention_interval_ms": 3_600_000,
                                "compaction_live_fraction_max": 0.6}
    settings.update(overrides)
    return storage_config(**settings)


@asynccontextmanager
async def node_at(data_dir: str, config: StorageConfig | None = None, *,
                  backlogs: BacklogTable | None = None,
                  wall_ms: list[int] | None = None) -> AsyncIterator[StorageNode]:
    clock = wall_ms or [T0_MS]
    node = StorageNode(node_id=NodeId("n1"), data_dir=data_dir,
                       config=config or reclaim_config(), backlogs=backlogs,
                       wall_ms=lambda: clock[0])
    await node.start()
    try:
        yield node
    finally:
        await node.close()


async def trim(node: StorageNode, log_id: LogId, trim_lsn: int) -> None:
    answer = await request(node, Trim(log_id=log_id, trim_lsn=Lsn(trim_lsn)))
    assert isinstance(answer, Trimmed) and answer.status is Status.OK, answer


def release(node: StorageNode, log_id: LogId, release_lsn: int) -> None:
    node.on_message(NodeId("seq"), Release(log_id=log_id, release_lsn=Lsn(release_lsn)),
                    lambda _: None)


async def payloads(node: StorageNode, log_id: LogId, *,
                   released: bool = True) -> dict[int, bytes]:
    """Every record of ``log_id`` the node serves, page by page (``released``: everything
    is released to the node first, as by a RELEASE)."""
    found: dict[int, bytes] = {}
    from_lsn = 1
    while True:
        reply = await read(node, make_read(from_lsn, release_lsn=ALL, log_id=log_id,
                                           records_max=7), released=released)
        assert reply.status is Status.OK, reply.status
        found.update((r[0], r[3]) for r in reply.records)
        if not reply.records:
            return found
        from_lsn = reply.next_lsn


def expected(log_id: LogId, esns: range) -> dict[int, bytes]:
    return {lsn(1, e): payload_for(lsn(1, e) + log_id, BIG_BYTES) for e in esns}


def snapshot(node: StorageNode) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The per-log state and the index: what a restart must rebuild."""
    states = {log_id: node.log_state(log_id) for log_id in sorted(node.log_ids())}
    return states, node.store.index_snapshot()


def disk_bytes(data_dir: str) -> int:
    """Data bytes in the segments (a running store keeps zero-filled space ahead of its
    writes, which is not data)."""
    return sum(data_size(p) for p in segment_paths(data_dir))


async def fill_interleaved(node: StorageNode, esns: range) -> None:
    """Logs A and B alternate, so every segment holds both (one STORE at a time keeps the
    order, hence the mix, deterministic)."""
    for esn in esns:
        assert_ok([await store(node, big(LOG_A, esn))])
        assert_ok([await store(node, big(LOG_B, esn))])


async def test_trimmed_segments_are_deleted_and_a_restart_rebuilds_the_same_state(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with node_at(data_dir) as node:
        # State that only the first segment carries: a seal and a release pointer of logs
        # with no records.
        assert await seal(node, 3, "recoverer", log_id=LOG_SEALED_ONLY) is Status.OK
        release(node, LOG_B, lsn(2, 5))
        for esn in range(1, 41):
            assert_ok([await store(node, big(LOG_A, esn, release_esn=esn))])
        assert len(segment_paths(data_dir)) >= 4
        await trim(node, LOG_A, lsn(1, 30))
    async with node_at(data_dir) as node:
        before = snapshot(node)
        bytes_before = await asyncio.to_thread(disk_bytes, data_dir)
        segments_before = len(segment_paths(data_dir))
        report = await node.retention_pass()
        assert report.reclaim.segments_deleted >= 2 and report.reclaim.checkpoint_entries >= 2
        assert len(segment_paths(data_dir)) == segments_before - report.reclaim.segments_deleted
        bytes_after = await asyncio.to_thread(disk_bytes, data_dir)
        assert bytes_after <= bytes_before - report.reclaim.bytes_deleted + 4096
        assert node.stats()["disk_bytes"] == bytes_after
        assert node.stats()["segments_deleted"] == report.reclaim.segments_deleted
        assert await payloads(node, LOG_A, released=False) == expected(LOG_A, range(31, 41))
        assert snapshot(node) == before
        # Nothing left to do: a second pass deletes nothing more.
        assert (await node.retention_pass()).reclaim.segments_deleted == 0
    async with node_at(data_dir) as node:
        assert snapshot(node) == before
        state = node.log_state(LOG_SEALED_ONLY)
        assert (state.sealed_epoch, state.sealed_by) == (3, "recoverer")
        assert node.log_state(LOG_A).trim_lsn == lsn(1, 30)
        assert node.log_state(LOG_A).release_lsn == lsn(1, 40)
        assert node.log_state(LOG_B).release_lsn == lsn(2, 5)
        assert await payloads(node, LOG_A) == expected(LOG_A, range(31, 41))
        # Writes go on after the deletion, in a newer segment.
        assert (await store(node, big(LOG_A, 41))).status is Status.OK


async def test_mixed_segments_are_compacted_in_place_and_survive_restart(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with node_at(data_dir) as node:
        await fill_interleaved(node, range(1, 26))
        release(node, LOG_A, lsn(1, 25))
        await trim(node, LOG_A, lsn(1, 25))  # every A record: segments become half dead
        assert (await store(node, big(LOG_B, 26))).status is Status.OK
        sealed = segment_paths(data_dir)[:-1]
        sizes_before = [await asyncio.to_thread(os.path.getsize, p) for p in sealed]
        report = await node.retention_pass()
        assert report.reclaim.segments_compacted == len(sealed)
        sizes_after = [await asyncio.to_thread(os.path.getsize, p) for p in sealed]
        assert all(a < b * 0.6 for a, b in zip(sizes_after, sizes_before, strict=True))
        assert report.reclaim.bytes_compacted == sum(sizes_before) - sum(sizes_after)
        assert await payloads(node, LOG_B) == expected(LOG_B, range(1, 27))
        assert await payloads(node, LOG_A) == {}
        live = snapshot(node)
        # A compacted segment is all live: the next pass leaves it alone.
        assert (await node.retention_pass()).reclaim == ReclaimReport()
    async with node_at(data_dir) as node:
        assert snapshot(node) == live
        assert await payloads(node, LOG_B) == expected(LOG_B, range(1, 27))


async def test_reads_racing_with_compaction_and_deletion_see_every_record(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with node_at(data_dir) as node:
        await fill_interleaved(node, range(1, 31))
        release(node, LOG_A, lsn(1, 30))
        want = expected(LOG_B, range(1, 31))
        stop = asyncio.Event()
        reads_done = [0]

        async def reader() -> None:
            while not stop.is_set():
                assert await payloads(node, LOG_B) == want
                reads_done[0] += 1

        readers = [asyncio.create_task(reader()) for _ in range(6)]
        try:
            # Trim A step by step: each pass deletes or compacts under the readers' feet.
            for esn in range(2, 31, 2):
                await trim(node, LOG_A, lsn(1, esn))
                await node.retention_pass()
                await asyncio.sleep(0.01)  # let the readers run between passes
        finally:
            stop.set()
            await asyncio.gather(*readers)
        stats = node.stats()
        assert stats["segments_compacted"] >= 2, stats
        assert reads_done[0] >= 4
        # Old file versions are closed once the reads that might use them are over.
        assert node.store.open_files_count() <= stats["segments"]


async def test_age_retention_trims_old_records_only_and_never_past_release(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    clock = [T0_MS]
    backlogs = BacklogTable(0, [(int(LOG_A), int(LOG_A), 60_000)])
    async with node_at(data_dir, backlogs=backlogs, wall_ms=clock) as node:
        # A record every 10 s of record time: esn e written at T0 + 10 s * e.
        for esn in range(1, 21):
            assert_ok([await store(node, big(LOG_A, esn, timestamp_ms=T0_MS + 10_000 * esn))])
            assert_ok([await store(node, big(LOG_B, esn, timestamp_ms=T0_MS))])
        release(node, LOG_A, lsn(1, 20))
        release(node, LOG_B, lsn(1, 20))
        clock[0] = T0_MS + 10_000 * 10 + 60_000 + 1  # esns 1..10 are older than 60 s
        report = await node.retention_pass()
        assert report.trims == [(LOG_A, lsn(1, 10))]
        assert node.log_state(LOG_A).trim_lsn == lsn(1, 10)
        assert node.log_state(LOG_B).trim_lsn == 0  # no backlog: kept forever
        reply = await read(node, make_read(1, release_lsn=ALL, log_id=LOG_A), released=False)
        assert reply.trim_lsn == lsn(1, 10) and reply.records[0][0] == lsn(1, 11)
        # Everything is old now, but the release pointer caps the trim.
        clock[0] += 10**9
        assert (await store(node, big(LOG_A, 21, timestamp_ms=T0_MS))).status is Status.OK
        report = await node.retention_pass()
        assert report.trims == [(LOG_A, lsn(1, 20))]
        assert node.stats()["retention_trims"] == 2
        assert (await node.retention_pass()).trims == []
    async with node_at(data_dir, backlogs=backlogs, wall_ms=clock) as node:
        assert node.log_state(LOG_A).trim_lsn == lsn(1, 20)


async def test_background_retention_frees_disk_without_being_asked(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    clock = [T0_MS + 3_600_000]
    config = reclaim_config(retention_interval_ms=20)
    async with node_at(data_dir, config, backlogs=BacklogTable(1_000), wall_ms=clock) as node:
        for esn in range(1, 31):
            assert_ok([await store(node, big(LOG_A, esn, release_esn=esn))])
        deadline = asyncio.get_running_loop().time() + 10
        while node.stats()["segments_deleted"] < 2 or (
                node.log_state(LOG_A).trim_lsn < lsn(1, 30)):
            assert asyncio.get_running_loop().time() < deadline, node.stats()
            await asyncio.sleep(0.02)
        assert node.log_state(LOG_A).trim_lsn == lsn(1, 30)
        assert node.stats()["retention_passes"] >= 1


async def test_a_read_located_before_the_swap_reads_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic version of the race: a read has located its entries, then compaction
    replaces the file and deletion removes another before the read's pread runs."""
    data_dir = str(tmp_path)
    gate = threading.Event()
    entered = threading.Event()
    real_read_locations = record_store.read_locations

    def gated(*args: Any) -> Any:
        entered.set()
        assert gate.wait(10)
        return real_read_locations(*args)

    async with node_at(data_dir) as node:
        await fill_interleaved(node, range(1, 31))
        release(node, LOG_A, lsn(1, 30))
        release(node, LOG_B, lsn(1, 30))
        monkeypatch.setattr(record_store, "read_locations", gated)
        held_a = asyncio.create_task(read(node, make_read(lsn(1, 1), release_lsn=ALL,
                                                          log_id=LOG_A)))
        held_b = asyncio.create_task(read(node, make_read(lsn(1, 1), release_lsn=ALL,
                                                          log_id=LOG_B)))
        try:
            assert await asyncio.to_thread(entered.wait, 10)
            monkeypatch.setattr(record_store, "read_locations", real_read_locations)
            await trim(node, LOG_A, lsn(1, 30))
            await trim(node, LOG_B, lsn(1, 6))  # the first segment is then dead: deleted
            report = await node.retention_pass()
            assert report.reclaim.segments_compacted >= 1
            assert report.reclaim.segments_deleted >= 1
        finally:
            gate.set()
        reply_a, reply_b = await held_a, await held_b
        assert reply_a.status is Status.OK and reply_b.status is Status.OK
        assert {r[0]: r[3] for r in reply_a.records} == expected(LOG_A, range(1, 31))
        assert {r[0]: r[3] for r in reply_b.records} == expected(LOG_B, range(1, 31))
        assert await payloads(node, LOG_B) == expected(LOG_B, range(7, 31))
        assert node.store.open_files_count() <= node.stats()["segments"]


async def test_compaction_moves_both_pieces_of_a_split_batch(tmp_path: Path) -> None:
    """A batch whose middle record was stored again later (a new wave) is served in two
    pieces from one entry; compaction must move both, and a restart must agree."""
    data_dir = str(tmp_path)
    batch = tuple(payload_for(lsn(1, e) + LOG_B, 1000) for e in range(1, 6))
    async with node_at(data_dir) as node:
        assert (await store(node, make_store(lsn(1, 1), batch, log_id=LOG_B))).status is (
            Status.OK)
        for esn in range(1, 25):
            assert_ok([await store(node, big(LOG_A, esn))])
        again = make_store(lsn(1, 3), (b"wave 2",), log_id=LOG_B, wave=2)
        assert (await store(node, again)).status is Status.OK
        release(node, LOG_A, lsn(1, 24))
        release(node, LOG_B, lsn(1, 5))
        await trim(node, LOG_A, lsn(1, 24))
        report = await node.retention_pass()
        assert report.reclaim.segments_compacted >= 1
        want = {lsn(1, e): p for e, p in zip(range(1, 6), batch, strict=True)}
        want[lsn(1, 3)] = b"wave 2"
        assert await payloads(node, LOG_B) == want
        live = snapshot(node)
    async with node_at(data_dir) as node:
        assert snapshot(node) == live
        assert await payloads(node, LOG_B) == want


async def test_a_mostly_trimmed_segment_being_written_is_closed_and_reclaimed(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with node_at(data_dir) as node:
        for esn in range(1, 16):
            assert_ok([await store(node, big(LOG_A, esn, release_esn=esn))])
        await trim(node, LOG_A, lsn(1, 15))
        active = segment_paths(data_dir)[-1]
        report = await node.retention_pass()
        # Nothing but the checkpoint is left, in a fresh segment.
        assert not await asyncio.to_thread(os.path.exists, active)
        assert report.reclaim.segments_deleted == 2 and node.stats()["segments_rolled"] == 1
        assert await asyncio.to_thread(disk_bytes, data_dir) < 1024
        assert (await node.retention_pass()).reclaim == ReclaimReport()
    async with node_at(data_dir) as node:
        assert node.log_state(LOG_A).trim_lsn == lsn(1, 15)
        assert node.log_state(LOG_A).last_lsn == lsn(1, 15)
        assert node.log_state(LOG_A).epoch_tails == {1: (0, 15)}
        assert (await store(node, big(LOG_A, 16))).status is Status.OK


async def test_segments_with_damage_are_left_alone(tmp_path: Path) -> None:
    """A live entry that fails its CRC is not copied into a fresh file (nor is its segment
    retried every pass), and a segment found corrupt at start is never deleted: the bytes
    after its bad entry may be acknowledged records nobody could index."""
    data_dir = str(tmp_path)
    async with node_at(data_dir) as node:
        await fill_interleaved(node, range(1, 21))
        release(node, LOG_A, lsn(1, 20))
        release(node, LOG_B, lsn(1, 20))
        first, second = segment_paths(data_dir)[:2]
        entries = scan_segment(await asyncio.to_thread(read_file, second)).entries
        # Damage a B record in the second segment while the node runs (alternating A, B).
        victim = next(e for e in entries
                      if isinstance(e.entry, StoreMeta) and e.entry.log_id == LOG_B)
        await asyncio.to_thread(flip_byte, second, victim.offset + victim.length - 10)
        await trim(node, LOG_A, lsn(1, 20))
        report = await node.retention_pass()
        assert report.reclaim.failed == 1 and node.stats()["reclaim_failures"] == 1
        assert report.reclaim.segments_compacted >= 1
        # The damaged segment was not rewritten, and is not tried again.
        assert await asyncio.to_thread(file_size, second) == entries[-1].offset + (
            entries[-1].length)
        checkpoints = node.stats()["checkpoint_entries"]
        assert (await node.retention_pass()).reclaim == ReclaimReport()
        assert node.stats()["checkpoint_entries"] == checkpoints
    # Now damage the first segment's first entry: at start its rest cannot be indexed.
    await asyncio.to_thread(flip_byte, first, HEADER_BYTES + 3)
    async with node_at(data_dir) as node:
        # Found by the background check of segments taken from their index file.
        await wait_until(lambda: node.stats()["corrupt_segments"] >= 1)
        await trim(node, LOG_B, lsn(1, 20))
        await node.retention_pass()
        assert await asyncio.to_thread(os.path.exists, first)
