"""Record store on disk: restart recovery, torn tails, corruption, segment roll-over."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from shared.status import Status
from shared.types import NodeId
from shared.wire.release import Release
from shared.wire.store import Store
from storage_node.runtime import StorageNode
from storage_node.segment_format import HEADER_BYTES, scan_segment
from tests.unit.storage_node.helpers import (
    LOG,
    SEQ_B,
    append_to_file,
    assert_ok,
    file_size,
    flip_byte,
    log_state,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    read_file,
    running_node,
    seal,
    segment_paths,
    storage_config,
    store,
    store_all,
    truncate_file,
    wait_until,
)

BIG_BYTES = 100 * 1024
ALL = 2**64 - 2


def big_store(esn: int, epoch: int = 1) -> Store:
    return make_store(lsn(epoch, esn), (payload_for(lsn(epoch, esn), BIG_BYTES),))


async def read_all_lsns(node: StorageNode, from_lsn: int = 1) -> list[int]:
    reply = await read(node, make_read(from_lsn, release_lsn=ALL))
    assert reply.status == Status.OK, reply.status
    return [r[0] for r in reply.records]


async def test_restart_rebuilds_index_release_and_seals(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 6)]))
        assert_ok([await store(node, make_store(lsn(2, 1), (b"a", b"b", b"c"), sequencer=SEQ_B))])
        node.on_message(NodeId("s"), Release(log_id=LOG, release_lsn=lsn(2, 2)), lambda m: None)
        assert await seal(node, 1, "recoverer") == Status.OK
    async with running_node(data_dir) as node:
        state = await log_state(node)
        assert state.release_lsn == lsn(2, 2) and state.last_lsn == lsn(2, 3)
        restored = node.log_state(LOG)
        assert (restored.sealed_epoch, restored.sealed_by) == (1, "recoverer")
        # The newest STORE (epoch 2, seq-b) rebuilds the soft seal of epoch 1.
        assert (restored.soft_sealed_epoch, restored.soft_sealed_by) == (1, SEQ_B)
        reply = await read(node, make_read(1))
        assert [r[0] for r in reply.records] == [lsn(1, i) for i in range(1, 6)] + [
            lsn(2, 1), lsn(2, 2)]
        assert reply.records[-1][3] == b"b"
        assert reply.records[0][3] == payload_for(lsn(1, 1))


async def test_torn_tail_is_cut_and_the_node_keeps_serving(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok([await store(node, make_store(lsn(1, i))) for i in range(1, 6)])
    (path,) = segment_paths(data_dir)
    size = await asyncio.to_thread(file_size, path)
    # The last entry loses its end, as if the crash hit in the middle of the write.
    await asyncio.to_thread(truncate_file, path, size - 7)
    async with running_node(data_dir) as node:
        stats = node.stats()
        assert stats["torn_tail_bytes"] > 0 and stats["corrupt_segments"] == 0
        assert await read_all_lsns(node) == [lsn(1, i) for i in range(1, 5)]
        assert (await store(node, make_store(lsn(1, 5)))).status == Status.OK
        assert (await store(node, make_store(lsn(1, 6)))).status == Status.OK
        assert await read_all_lsns(node) == [lsn(1, i) for i in range(1, 7)]
    # Garbage at the end. It must not end in a zero byte: trailing zeros count as the
    # zero-filled space a torn entry was written into, not as torn bytes (this flaked 1 in 256).
    await asyncio.to_thread(append_to_file, path, os.urandom(2999) + b"\x01")
    async with running_node(data_dir) as node:
        assert node.stats()["torn_tail_bytes"] == 3000
        assert await read_all_lsns(node) == [lsn(1, i) for i in range(1, 7)]
        assert (await store(node, make_store(lsn(1, 7)))).status == Status.OK
    async with running_node(data_dir) as node:
        assert node.stats()["torn_tail_bytes"] == 0
        assert await read_all_lsns(node) == [lsn(1, i) for i in range(1, 8)]


async def test_segments_roll_over_and_are_all_read_back(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok(await store_all(node, [big_store(i) for i in range(1, 31)]))  # ~3 MiB
        assert len(segment_paths(data_dir)) >= 3
        sizes = [await asyncio.to_thread(file_size, p) for p in segment_paths(data_dir)]
        assert all(size <= 1024 * 1024 for size in sizes)
        assert await read_all_lsns(node) == [lsn(1, i) for i in range(1, 31)]
    async with running_node(data_dir) as node:
        reply = await read(node, make_read(1, release_lsn=ALL))
        assert [r[0] for r in reply.records] == [lsn(1, i) for i in range(1, 31)]
        assert all(r[3] == payload_for(r[0], BIG_BYTES) for r in reply.records)


async def test_corrupt_byte_is_caught_by_checksum_not_served(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    config = storage_config()
    async with running_node(data_dir, config) as node:
        for i in range(1, 21):  # one at a time: ~10 entries per 1 MiB segment
            assert_ok([await store(node, big_store(i))])
        first_segment = segment_paths(data_dir)[0]
        # Flip a byte inside the payload of the third entry of the first (old) segment.
        entries = scan_segment(await asyncio.to_thread(read_file, first_segment)).entries
        assert len(entries) >= 4 and len(segment_paths(data_dir)) >= 2
        offset = entries[2].offset + HEADER_BYTES + 5000
        await asyncio.to_thread(flip_byte, first_segment, offset)
        before = await read(node, make_read(1, release_lsn=ALL))
        assert [r[0] for r in before.records] == [lsn(1, 1), lsn(1, 2)]
        assert before.next_lsn == lsn(1, 3)
        at = await read(node, make_read(lsn(1, 3), release_lsn=ALL))
        assert at.status == Status.CHECKSUM_MISMATCH and at.records == ()
        assert node.stats()["read_checksum_failures"] >= 1
        after = await read(node, make_read(lsn(1, 4), release_lsn=ALL))
        assert after.records[0][0] == lsn(1, 4)
    async with running_node(data_dir, config) as node:
        # The restart takes the old segment from its index file; the background check of
        # such segments against their index finds the damage and scans the segment.
        await wait_until(lambda: node.stats()["corrupt_segments"] == 1)
        served = await read_all_lsns(node)
        assert lsn(1, 3) not in served
        assert served[:2] == [lsn(1, 1), lsn(1, 2)]
        # Everything in the later segments is still there.
        assert served[-5:] == [lsn(1, i) for i in range(16, 21)]
        reply = await read(node, make_read(1, release_lsn=ALL))
        assert all(r[3] == payload_for(r[0], BIG_BYTES) for r in reply.records)
        assert (await store(node, big_store(21))).status == Status.OK


async def test_corruption_inside_the_newest_segment_is_not_cut_off(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok([await store(node, make_store(lsn(1, i))) for i in range(1, 6)])
    (path,) = segment_paths(data_dir)
    size = await asyncio.to_thread(file_size, path)
    await asyncio.to_thread(flip_byte, path, HEADER_BYTES + 2)  # the first entry's body
    async with running_node(data_dir) as node:
        assert node.stats()["corrupt_segments"] == 1
        assert node.stats()["torn_tail_bytes"] == 0
        # Good entries after the damage stay on disk: they may be acknowledged data.
        assert await asyncio.to_thread(file_size, path) == size
        assert (await store(node, make_store(lsn(1, 6)))).status == Status.OK
        assert len(segment_paths(data_dir)) == 2  # new writes go to a fresh segment
        assert await read_all_lsns(node) == [lsn(1, 6)]


def test_vectored_writes_survive_short_writes_and_many_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit's chunks reach the file whole and in order, also when the kernel takes only
    part of a vectored write (any number of bytes, mid-chunk) and when there are more chunks
    than one call may carry."""
    from storage_node import segment_files

    real_writev = os.writev
    calls: list[int] = []

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers))
        budget = 1 + len(calls) % 13  # a few bytes, never a whole batch
        taken = []
        for buffer in buffers:
            taken.append(buffer[:budget])
            budget -= len(taken[-1])
            if not budget:
                break
        return real_writev(fd, taken)

    monkeypatch.setattr(segment_files, "_IOV_MAX", 5)
    monkeypatch.setattr(segment_files.os, "writev", short_writev)
    chunks: list[bytes] = [os.urandom(n) for n in (0, 1, 7, 30, 0, 2, 64, 3, 1, 11, 40)]
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        segment_files._writev_all(fd, chunks)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(chunks)
    assert len(calls) > len(chunks) and max(calls) <= 5
