"""Per-segment index files (issue 17 item 5): the format and its parser (fuzzed), lookups
over segments held in index files against one in-memory index of everything, and restarts
that read index files instead of scanning: a damaged index file, a crash between a segment
roll and its index file, the restart checkpoint, and the bound on the in-memory index."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.release import Release
from shared.wire.store import RecordFlags, Store
from shared.wire.trim import Trim, Trimmed
from storage_node.durable_state import DurableState, parse_snapshot
from storage_node.index_files import columns_of, load_directory, write_index
from storage_node.record_index import Location, LogIndex, RecordIndex, SealedSegment
from storage_node.runtime import StorageNode
from storage_node.segment_index import (
    FOOTER_BYTES,
    BlockRef,
    Columns,
    decode_block,
    decode_directory,
    encode_index,
    encode_index_file,
)
from tests.unit.storage_node.helpers import (
    LOG,
    assert_ok,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    request,
    running_node,
    seal,
    segment_paths,
    storage_config,
    store,
    wait_until,
)

ALL = 2**64 - 2
BIG_BYTES = 30 * 1024


# ---- the format ----


def columns(*pieces: tuple[int, int, int, int, int, int]) -> Columns:
    result = Columns()
    for piece in pieces:
        result.append(*piece)
    return result


def sample_file(blocks_pieces: int = 2500) -> bytes:
    big = Columns()
    for i in range(blocks_pieces):
        big.append(10 * i + 1, 10 * i + 5, 10 * i + 1, 100 * i, 100, 1_000 + i)
    small = columns((7, 9, 5, 0, 64, -1))
    return encode_index(3, 5_000_000, True, [1, 2, 3, 4, 5], [1, 2, 9],
                        {1: big, 2: small}, b"state")


def directory_of(data: bytes):  # type: ignore[no-untyped-def]
    footer = data[-FOOTER_BYTES:]
    return decode_directory(footer, data[_directory_offset(data):-FOOTER_BYTES], len(data))


def _directory_offset(data: bytes) -> int:
    return int.from_bytes(data[-FOOTER_BYTES + 8:-FOOTER_BYTES + 16], "little")


def test_an_index_file_round_trips_in_blocks_with_their_summaries() -> None:
    data = sample_file()
    directory = directory_of(data)
    assert directory is not None
    assert (directory.segment_id, directory.covered, directory.final) == (3, 5_000_000, True)
    assert directory.logs == (1, 2, 9) and directory.state == b"state"
    refs = directory.runs[1]
    assert [r.count for r in refs] == [1024, 1024, 452]
    assert refs[0].first_lsn == 1 and refs[-1].last_lsn == 24_995
    assert refs[1].max_time_ms == 1_000 + 2047 and refs[1].bytes == 1024 * 100
    block = decode_block(data[refs[1].file_offset:refs[1].file_offset + 1024 * 48], refs[1])
    assert block is not None and block.firsts[0] == 10_241 and block.offsets[-1] == 204_700
    (hole,) = directory.runs[2]
    assert hole.max_time_ms == -1 and hole.first_lsn == 7


def test_the_writer_knows_the_directory_it_wrote_without_parsing_it() -> None:
    """The directory a write hands back (kept for a closed segment) is the one a load parses
    from the file; a checkpoint's has no runs (never kept: no work per block for it)."""
    big = Columns()
    for i in range(2500):
        big.append(10 * i + 1, 10 * i + 5, 10 * i + 1, 100 * i, 100, 1_000 + i)
    runs = {1: big, 2: columns((7, 9, 5, 0, 64, -1)), 5: Columns()}
    for final in (True, False):
        data, directory = encode_index_file(3, 5_000_000, final, [1, 2, 3, 4, 5], [9, 1, 2],
                                            runs, b"state")
        assert data == encode_index(3, 5_000_000, final, [1, 2, 3, 4, 5], [9, 1, 2], runs,
                                    b"state")
        parsed = directory_of(data)
        assert parsed is not None and sorted(parsed.runs) == [1, 2]
        if final:
            assert directory == parsed
        else:
            assert directory.runs == {}
            assert directory == type(parsed)(parsed.segment_id, parsed.covered, False,
                                             parsed.chunk_crcs, parsed.logs, {},
                                             parsed.state, parsed.directory_offset)


def test_a_flipped_byte_anywhere_is_caught() -> None:
    data = sample_file(300)
    directory = directory_of(data)
    assert directory is not None
    ref = directory.runs[1][0]
    for position in (0, ref.count * 48 - 1):
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        assert decode_block(bytes(damaged[:ref.count * 48]), ref) is None
    for position in (_directory_offset(data) + 3, len(data) - 5, len(data) - 20):
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        assert directory_of(bytes(damaged)) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_parser_survives_hostile_files(data: st.DataObject) -> None:
    """Random bytes, truncations and flips of a valid file: the parser returns a directory or
    None, never raises, and whatever it returns is consistent with the file's size."""
    base = sample_file(data.draw(st.integers(1, 1500)))
    mode = data.draw(st.sampled_from(["random", "flip", "cut", "splice"]))
    if mode == "random":
        blob = data.draw(st.binary(max_size=4096))
    elif mode == "flip":
        flipped = bytearray(base)
        for _ in range(data.draw(st.integers(1, 8))):
            flipped[data.draw(st.integers(0, len(flipped) - 1))] ^= data.draw(
                st.integers(1, 255))
        blob = bytes(flipped)
    elif mode == "cut":
        blob = base[:data.draw(st.integers(0, len(base)))]
    else:
        at = data.draw(st.integers(0, len(base)))
        blob = base[:at] + data.draw(st.binary(max_size=64)) + base[at:]
    footer = blob[-FOOTER_BYTES:] if len(blob) >= FOOTER_BYTES else blob
    offset = _directory_offset(blob) if len(blob) >= FOOTER_BYTES else 0
    directory = decode_directory(footer, blob[offset:max(len(blob) - FOOTER_BYTES, 0)],
                                 len(blob))
    if directory is not None:
        for refs in directory.runs.values():
            for ref in refs:
                assert ref.file_offset + ref.count * 48 <= directory.directory_offset
                decode_block(blob[ref.file_offset:ref.file_offset + ref.count * 48], ref)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048), st.integers(1, 64), st.integers(0, 2**63 - 1))
def test_the_block_parser_survives_hostile_blocks(blob: bytes, count: int, crc: int) -> None:
    ref = BlockRef(0, count, 1, 2**40, 0, 0, crc % 2**32)
    decode_block(blob, ref)  # None or a block; never an exception
    decode_block(blob[:count * 48].ljust(count * 48, b"\1"), ref)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_the_checkpoint_parser_survives_hostile_bytes(blob: bytes) -> None:
    parse_snapshot(blob)


def test_a_checkpoint_round_trips_the_per_log_state() -> None:
    from storage_node.segment_format import (
        CheckpointEntry,
        ReleaseEntry,
        ScannedEntry,
        SealEntry,
        StoreMeta,
    )
    state = DurableState(RecordIndex())
    entries = [StoreMeta(LogId(1), Lsn(2**32 + 1), 3, NodeId("seq-a"), 2, 0, 1000,
                         (("p", 1, 2**32 + 1, 2**32 + 3),)),
               StoreMeta(LogId(1), Lsn(2**32 + 9), 1, NodeId("seq-a"), 2,
                         int(RecordFlags.BRIDGE), 1000),
               SealEntry(LogId(1), Epoch(4), NodeId("first")), ReleaseEntry(LogId(2), Lsn(77)),
               CheckpointEntry(LogId(3), Lsn(5), None, Lsn(4), Epoch(2), None, Lsn(3),
                               ((1, 2, 3),))]
    for position, entry in enumerate(entries):
        state.on_entry(1, ScannedEntry(position * 100, 100, entry))  # type: ignore[arg-type]
    state.finish_recovery()
    restored = DurableState(RecordIndex())
    assert restored.restore(state.snapshot())
    restored.finish_recovery()
    assert restored.states() == state.states()
    assert restored.bridge_below(LogId(1), Lsn(2**32 + 20)) == 2**32 + 9
    assert restored.producers.entries(LogId(1), "p", 0) == state.producers.entries(
        LogId(1), "p", 0)
    assert not restored.restore(b"\x93\x01\x02\x03")


# ---- lookups over index files against one index of everything ----


def test_lookups_over_sealed_segments_match_one_in_memory_index(tmp_path: Path) -> None:
    """Random writes over five segments (later waves and recovery copies overlapping earlier
    segments, holes, trims): every locate, find_time, last_before_time and range answer of
    an index with four segments in index files equals that of one in-memory index."""
    rng = random.Random(17)
    whole = LogIndex()
    split = RecordIndex(cache_bytes_max=64 * 1024)  # small: blocks come and go
    time_ms = 1_000
    next_lsn = 1
    offset = 0
    for segment_id in range(1, 6):
        for _ in range(rng.randrange(400, 2500)):
            if rng.random() < 0.1 and next_lsn > 20:
                first = rng.randrange(1, next_lsn)  # a copy written again later
                last = min(first + rng.randrange(0, 6), next_lsn - 1)
            else:
                first = next_lsn + rng.choice((0, 0, 0, 1, 5))
                last = first + rng.choice((0, 0, 0, 3, 30))
                next_lsn = last + 1
            time_ms += rng.choice((0, 1, 3))
            stamp = -1 if rng.random() < 0.03 else time_ms
            location = Location(segment_id, offset, 10 + (last - first), Lsn(first), Lsn(last),
                                timestamp_ms=stamp)
            offset += 100
            whole.insert(location)
            split.insert(LogId(1), location)
        if segment_id < 5:
            snapshot = split.memory_snapshot(segment_id)
            directory, fd = write_index(str(tmp_path), segment_id, offset, True, [0] * (
                -(-offset // (1024 * 1024))), [1], columns_of(snapshot), b"")
            split.add_sealed(SealedSegment(directory, fd))
    assert split.memory_segment_ids() == [5] and split.sealed_ids() == [1, 2, 3, 4]
    trim = rng.randrange(1, next_lsn // 3)
    whole.drop_through(Lsn(trim))
    split.drop_through(LogId(1), Lsn(trim))

    def key(found: list[Location], lo: int = 0, hi: int = ALL) -> list[tuple[int, ...]]:
        """Pieces as a read uses them: clipped to the range asked for (a piece reaching out
        of it may be cut by a segment that holds nothing inside it)."""
        return [(x.segment_id, x.offset, max(x.first_lsn, lo), min(x.last_lsn, hi),
                 x.stored_first_lsn, x.timestamp_ms) for x in found]

    assert key(split.locations(LogId(1))) == key(whole.locate(Lsn(0), Lsn(ALL), 2**62))
    for _ in range(300):
        lo = rng.randrange(1, next_lsn + 5)
        hi = lo + rng.randrange(0, 400)
        records = rng.choice((1, 7, 100, 10_000))
        assert key(split.locate(LogId(1), Lsn(lo), Lsn(hi), records), lo, hi) == key(
            whole.locate(Lsn(lo), Lsn(hi), records), lo, hi), (lo, hi, records)
    for wanted in [0, 1_000, time_ms, time_ms + 1,
                   *rng.sample(range(1_000, time_ms + 1), 60)]:
        assert split.find_time(LogId(1), wanted) == whole.find_time(wanted), wanted
        assert split.last_before_time(LogId(1), wanted) == whole.last_before_time(wanted)
    assert split.cache.loads_count > split.cache.hits_count / 100  # the cache did evict
    assert split.cache.bytes <= 64 * 1024 + 1024 * 48
    split.close()


# ---- restarts ----


def big(esn: int, log_id: LogId = LOG) -> Store:
    first = lsn(1, esn)
    return make_store(first, (payload_for(first + log_id, BIG_BYTES),), log_id=log_id)


async def fill(node: StorageNode, esns: range) -> None:
    for esn in esns:
        assert_ok([await store(node, big(esn))])


async def all_lsns(node: StorageNode) -> list[int]:
    found: list[int] = []
    from_lsn = 1
    while True:
        reply = await read(node, make_read(from_lsn, release_lsn=ALL, records_max=9))
        assert reply.status.name == "OK", reply.status
        if not reply.records:
            return found
        assert all(r[3] == payload_for(r[0] + LOG, BIG_BYTES) for r in reply.records)
        found += [r[0] for r in reply.records]
        from_lsn = reply.next_lsn


def index_files(data_dir: str) -> list[str]:
    directory = os.path.join(data_dir, "segments")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith(".idx"))


async def test_a_restart_reads_index_files_instead_of_scanning(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        await fill(node, range(1, 101))  # ~3 MiB: three closed segments and a newest
        assert_ok([await store(node, big(50))])  # a copy of LSN 50 written again
        await wait_until(lambda: node.stats()["index_sealed_segments"] >= 2)
        before = node.store.index_snapshot()
        found_time = node.store.find_time(LOG, 0)
    assert len(index_files(data_dir)) == len(segment_paths(data_dir))
    async with running_node(data_dir) as node:
        stats = node.stats()
        assert stats["index_sealed_segments"] == len(segment_paths(data_dir)) - 1
        assert stats["index_memory_segments"] == 1
        assert node.store.index_snapshot() == before
        assert node.store.find_time(LOG, 0) == found_time
        assert await all_lsns(node) == [lsn(1, e) for e in range(1, 101)]
        await asyncio.wait_for(node.store.scrub_done(), 30)  # type: ignore[arg-type]
        assert node.stats()["corrupt_segments"] == 0


def damage_two_index_files(data_dir: str) -> None:
    """A block of the first index file (found when a read needs it) and the footer of the
    second (found at open)."""
    first, second = index_files(data_dir)[:2]
    loaded = load_directory(os.path.dirname(first), 1)
    assert loaded is not None
    block = loaded[0].runs[LOG][0]
    os.close(loaded[1])
    with open(first, "r+b") as file:
        file.seek(block.file_offset + 5)
        file.write(b"\xff\xfe")
    with open(second, "r+b") as file:
        file.seek(-3, os.SEEK_END)
        file.write(b"\0\0\0")


def lose_the_last_index_files(data_dir: str) -> str:
    """The newest closed segment's final index file was never written (a half-written
    temporary one is left), nor a checkpoint of the newest segment; returns the path of the
    missing file."""
    newest_closed = segment_paths(data_dir)[-2]
    closed_index = newest_closed[: -len(".seg")] + ".idx"
    os.unlink(closed_index)
    with open(closed_index + ".tmp", "wb") as file:
        file.write(b"half an index")
    os.unlink(index_files(data_dir)[-1])
    return closed_index


async def test_a_damaged_index_file_is_rebuilt_from_its_segment(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        await fill(node, range(1, 101))
        await wait_until(lambda: node.stats()["index_sealed_segments"] >= 2)
        before = node.store.index_snapshot()
    await asyncio.to_thread(damage_two_index_files, data_dir)
    async with running_node(data_dir) as node:
        assert node.stats()["index_sealed_segments"] == len(segment_paths(data_dir)) - 2
        assert await all_lsns(node) == [lsn(1, e) for e in range(1, 101)]
        assert node.stats()["index_rebuilds"] == 1
        assert node.store.index_snapshot() == before
        # Both are written again, good.
        await wait_until(lambda: node.stats()["index_sealed_segments"]
                         == len(segment_paths(data_dir)) - 1)
        assert node.stats()["non_authoritative"] == 0
    async with running_node(data_dir) as node:
        assert node.stats()["index_sealed_segments"] == len(segment_paths(data_dir)) - 1
        assert node.store.index_snapshot() == before


async def test_a_crash_between_a_roll_and_its_index_file_loses_nothing(
        tmp_path: Path) -> None:
    """The final index file of a closed segment never got written (kill -9 right after the
    roll): the restart uses the last checkpoint before it and scans the rest; a leftover
    temporary file is removed; the file is written after the start."""
    data_dir = str(tmp_path)
    config = storage_config(index_checkpoint_bytes=256 * 1024)
    async with running_node(data_dir, config) as node:
        await fill(node, range(1, 61))
        await wait_until(lambda: node.stats()["index_sealed_segments"] >= 1)
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 60)),
                        lambda _: None)
        assert (await seal(node, 3, "recoverer")).name == "OK"
        await wait_until(lambda: node.store.durable_release_lsn(LOG) == lsn(1, 60))
        trimmed = await request(node, Trim(log_id=LOG, trim_lsn=Lsn(lsn(1, 5))))
        assert isinstance(trimmed, Trimmed) and trimmed.status.name == "OK"
        before = node.store.index_snapshot()
        state = node.log_state(LOG)
    closed_index = await asyncio.to_thread(lose_the_last_index_files, data_dir)
    async with running_node(data_dir, config) as node:
        assert node.store.index_snapshot() == before
        assert node.log_state(LOG) == state
        await wait_until(lambda: os.path.exists(closed_index))
        # The leftover went at open (the index thread writes its own temporary file then).
        assert not await asyncio.to_thread(os.path.exists, closed_index + ".tmp")
    async with running_node(data_dir, config) as node:
        assert node.store.index_snapshot() == before
        assert node.log_state(LOG) == state
        assert await all_lsns(node) == [lsn(1, e) for e in range(6, 61)]


async def test_a_roll_during_a_checkpoint_of_the_segment_still_gets_its_final_index_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment closes while a checkpoint index file of it is being written (a slow disk):
    its final index file is written after that one, not skipped until the next restart."""
    import storage_node.record_store as record_store_module

    real_write = record_store_module.write_index
    slow = threading.Event()

    def slow_checkpoints(*args: Any) -> Any:
        final = args[3]
        if not final:
            slow.set()
            time.sleep(0.3)  # in the index thread: the roll happens meanwhile
        return real_write(*args)

    monkeypatch.setattr(record_store_module, "write_index", slow_checkpoints)
    config = storage_config(index_checkpoint_bytes=256 * 1024)
    async with running_node(str(tmp_path), config) as node:
        await fill(node, range(1, 61))
        assert slow.is_set()  # a checkpoint ran: the scenario happened
        await wait_until(lambda: node.stats()["index_sealed_segments"] >= 1, timeout_s=10)
        assert await all_lsns(node) == [lsn(1, e) for e in range(1, 61)]


async def test_a_segment_closed_again_during_its_final_index_write_keeps_that_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Later rolls ask again for the final index file of a closed segment whose final file is
    still being written (a slow disk): the file written is kept, not replaced by an empty one
    once the in-memory index is gone (a restart then lost the segment's records)."""
    import storage_node.record_store as record_store_module

    real_write = record_store_module.write_index
    finals: list[int] = []

    def slow_finals(*args: Any) -> Any:
        if args[3]:
            finals.append(args[1])
            time.sleep(0.2)
        return real_write(*args)

    monkeypatch.setattr(record_store_module, "write_index", slow_finals)
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        await fill(node, range(1, 101))  # ~3 MiB: three rolls while finals are slow
        await wait_until(lambda: node.stats()["index_sealed_segments"] >= 2, timeout_s=20)
        expected = await all_lsns(node)
    assert len(finals) == len(set(finals)), finals  # one final file per segment
    async with running_node(data_dir) as node:
        assert await all_lsns(node) == expected == [lsn(1, e) for e in range(1, 101)]


async def test_state_written_after_the_last_checkpoint_survives_a_restart(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        await fill(node, range(1, 80))
        await wait_until(lambda: node.stats()["index_sealed_segments"] >= 2)
        assert (await seal(node, 4, "late")).name == "OK"
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 79)),
                        lambda _: None)
        await wait_until(lambda: node.store.durable_release_lsn(LOG) == lsn(1, 79))
        state = node.log_state(LOG)
        before = node.store.index_snapshot()
    # As if killed before the newest segment's first checkpoint: the restart starts from the
    # checkpoint in the last closed segment's index file and folds the newest one whole.
    await asyncio.to_thread(os.unlink, index_files(data_dir)[-1])
    async with running_node(data_dir) as node:
        assert node.log_state(LOG) == state
        assert (node.log_state(LOG).sealed_epoch, node.log_state(LOG).sealed_by) == (4, "late")
        assert node.store.index_snapshot() == before


async def test_the_in_memory_index_stays_bounded_while_written(tmp_path: Path) -> None:
    """``index_memory_entries_max`` closes the segment being written by entry count, so
    small entries never pile up in memory; everything reads back after a restart."""
    data_dir = str(tmp_path)
    config = storage_config(segment_bytes_max=64 * 1024 * 1024, index_memory_entries_max=200)
    async with running_node(data_dir, config) as node:
        for start in range(1, 2001, 100):
            assert_ok([await store(node, make_store(lsn(1, esn))) for esn in
                       range(start, start + 100)])
            assert node.stats()["index_memory_segments"] <= 3
        await wait_until(lambda: node.stats()["index_memory_segments"] == 1)
        assert node.stats()["index_sealed_segments"] >= 8
    async with running_node(data_dir, config) as node:
        reply = await read(node, make_read(1, release_lsn=ALL, records_max=5000))
        assert [r[0] for r in reply.records] == [lsn(1, e) for e in range(1, 2001)]
        assert node.stats()["index_memory_segments"] == 1


async def test_checkpoints_of_a_store_holding_many_logs_are_further_apart(
        tmp_path: Path) -> None:
    """A checkpoint rewrites every piece of the segment and every log's state: once the store
    holds many logs, the next one waits for more bytes (``CHECKPOINT_BYTES_PER_UNIT``), so
    its cost per byte written stays flat (issue 15); a restart still finds everything."""
    data_dir = str(tmp_path)
    config = storage_config(segment_bytes_max=64 * 1024 * 1024,
                            index_checkpoint_bytes=64 * 1024)
    logs = range(100, 2100)
    async with running_node(data_dir, config) as node:
        for start in range(0, len(logs), 500):
            assert_ok(await asyncio.gather(*(
                store(node, make_store(lsn(1, 1), log_id=LogId(log_id)))
                for log_id in logs[start:start + 500])))
        written = node.stats()["index_files_written"]
        await fill(node, range(1, 41))  # 1.2 MiB of one log: 19 checkpoints at 64 KiB
        # 2,000 logs and 2,040 pieces: about 1 MiB between checkpoints.
        assert node.stats()["index_files_written"] - written <= 2
        before = node.store.index_snapshot()
        state = node.log_state(LogId(logs[-1]))
    async with running_node(data_dir, config) as node:
        assert node.store.index_snapshot() == before
        assert node.log_state(LogId(logs[-1])) == state
        assert await all_lsns(node) == [lsn(1, e) for e in range(1, 41)]
