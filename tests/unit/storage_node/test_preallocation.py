"""Segment preallocation: the writer keeps zero-filled, fsynced space ahead of its write
position (commits there use fdatasync), and the scan takes a zero tail for the clean end of the
data while still catching torn tails and corruption (``segment_files``, ``segment_format``)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.status import Status
from shared.types import LogId, Lsn
from storage_node import segment_files
from storage_node.segment_files import SPARE_NAME, SegmentWriter, segment_name
from storage_node.segment_format import (
    HEADER_BYTES,
    ScannedEntry,
    encode_release,
    encode_store,
    scan_segment,
)
from tests.unit.storage_node.helpers import (
    append_to_file,
    assert_ok,
    data_size,
    file_size,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    running_node,
    segment_paths,
    store,
    store_all,
)

SEGMENT_MAX = 1024 * 1024
PREALLOC = 256 * 1024
DEADLINE_S = 10.0


def entry(index: int, size_bytes: int = 200) -> bytes:
    return encode_store(make_store(lsn(1, index), (payload_for(index, size_bytes),)))


def entries(count: int, size_bytes: int = 200) -> bytes:
    return b"".join(entry(i, size_bytes) for i in range(1, count + 1))


# ---- the scan ----

def test_a_zero_tail_is_the_clean_end_of_the_data() -> None:
    data = entries(5)
    scan = scan_segment(data + bytes(70_000))
    assert len(scan.entries) == 5 and scan.valid_bytes == len(data)
    assert scan.bad_offset is None and not scan.good_after_bad
    assert scan.zero_tail_bytes == 70_000
    # A file of zeros only (a fresh preallocated segment) holds no data; one byte of zero too.
    empty = scan_segment(bytes(PREALLOC))
    assert empty.entries == [] and empty.valid_bytes == 0 and empty.bad_offset is None
    assert empty.zero_tail_bytes == PREALLOC
    one = scan_segment(data + b"\0")
    assert one.bad_offset is None and one.zero_tail_bytes == 1 and len(one.entries) == 5
    # Without a zero tail nothing changes.
    plain = scan_segment(data)
    assert plain.bad_offset is None and plain.zero_tail_bytes == 0 and len(plain.entries) == 5


def test_a_torn_entry_followed_by_zeros_is_a_torn_tail() -> None:
    data = entries(5)
    torn = entry(6)[:-40]
    scan = scan_segment(data + torn + bytes(10_000))
    assert len(scan.entries) == 5 and scan.valid_bytes == len(data)
    assert scan.bad_offset == len(data) and not scan.good_after_bad
    # Only its header written, the rest of the page never reached the disk.
    scan = scan_segment(data + entry(6)[:HEADER_BYTES] + bytes(4096))
    assert scan.bad_offset == len(data) and not scan.good_after_bad


def test_corruption_inside_the_data_is_still_caught_with_a_zero_tail() -> None:
    data = bytearray(entries(5))
    second = scan_segment(bytes(data)).entries[1]
    data[second.offset + HEADER_BYTES + 7] ^= 0xFF
    scan = scan_segment(bytes(data) + bytes(8192))
    assert len(scan.entries) == 1 and scan.bad_offset == second.offset
    assert scan.good_after_bad  # corruption in the middle, not a torn tail
    assert scan.zero_tail_bytes == 0


def test_zeros_then_an_entry_are_not_a_clean_end() -> None:
    # A page of a batch reached the disk, the one before it did not: the data does not end
    # at the zeros (as without preallocation: the bytes after are kept, nothing indexed).
    data = entries(3)
    scan = scan_segment(data + bytes(4096) + entry(4))
    assert len(scan.entries) == 3 and scan.bad_offset == len(data) and scan.good_after_bad


TAIL_KINDS = st.sampled_from(["zeros", "garbage", "truncated", "truncated+zeros", "none"])


@settings(max_examples=400, deadline=None)
@given(sizes=st.lists(st.integers(0, 600), max_size=6), kind=TAIL_KINDS,
       zeros=st.integers(0, 5000), garbage=st.binary(max_size=300), cut=st.integers(1, 10_000),
       release=st.booleans())
def test_fuzz_the_scan_over_random_tails(sizes: list[int], kind: str, zeros: int,
                                         garbage: bytes, cut: int, release: bool) -> None:
    parts = [entry(i + 1, size) for i, size in enumerate(sizes)]
    if release:
        parts.append(encode_release(LogId(7), Lsn(len(sizes))))
    prefix = b"".join(parts)
    victim = entry(99, 100)
    truncated = victim[: cut % len(victim)] or victim[:1]
    tail = {"zeros": bytes(zeros), "garbage": garbage, "truncated": truncated,
            "truncated+zeros": truncated + bytes(zeros), "none": b""}[kind]
    data = prefix + tail
    scan = scan_segment(data)
    # Every entry before the tail is found, at its offset.
    found = [(e.offset, e.length) for e in scan.entries[: len(parts)]]
    offsets = [sum(map(len, parts[:i])) for i in range(len(parts))]
    assert found == [(o, len(p)) for o, p in zip(offsets, parts, strict=True)]
    assert scan.valid_bytes >= len(prefix)
    # The general contract: a clean end is followed by zeros only; a bad entry is not.
    rest = data[scan.valid_bytes:]
    if scan.bad_offset is None:
        assert rest == bytes(len(rest)) and scan.zero_tail_bytes == len(rest)
    else:
        assert scan.bad_offset == scan.valid_bytes and rest != bytes(len(rest))
        assert scan.zero_tail_bytes == 0
    if kind in ("zeros", "none"):
        assert scan.bad_offset is None and scan.valid_bytes == len(prefix)
        assert scan.zero_tail_bytes == len(tail)
    if kind.startswith("truncated"):
        if scan.bad_offset is None:
            # Only when the cut-off bytes were zeros: then the zeros complete the entry.
            assert data[len(prefix): len(prefix) + len(victim)] == victim
        else:
            assert scan.bad_offset == len(prefix) and not scan.good_after_bad


# ---- the writer ----

def wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, "not before the deadline"
        time.sleep(0.002)


def new_writer(directory: str) -> tuple[SegmentWriter, list[tuple[int, ScannedEntry]]]:
    writer = SegmentWriter(directory, segment_bytes_max=SEGMENT_MAX, fsync="always",
                           disk_free_bytes_min=0, preallocate_bytes=PREALLOC)
    found: list[tuple[int, ScannedEntry]] = []
    writer.recover(lambda segment_id, scanned: found.append((segment_id, scanned)))
    return writer, found


def test_commits_inside_the_zeroed_space_use_fdatasync_and_a_restart_ends_at_the_data(
        tmp_path: Path) -> None:
    directory = str(tmp_path)
    writer, _ = new_writer(directory)
    wait_for(lambda: writer.zeroed_ahead_bytes >= PREALLOC // 2)
    assert writer.zero_fill_bytes == PREALLOC
    path = os.path.join(directory, segment_name(1))
    assert file_size(path) == PREALLOC
    written = 0
    for i in range(1, 11):
        chunk = entry(i)
        result = writer.append([chunk], fsync=True)
        assert result.status is Status.OK and result.offset == written
        written += len(chunk)
    assert writer.fdatasyncs_count == 10  # no size change, no journal commit
    assert file_size(path) == PREALLOC and data_size(path) == written
    # A crash now (the files as they are, the writer never closed): the restart finds the
    # data and the zeros.
    crashed = str(tmp_path / "crashed")
    shutil.copytree(directory, crashed)
    writer.close()
    again, found = new_writer(crashed)
    try:
        assert [scanned.offset for _, scanned in found] == [
            sum(len(entry(j)) for j in range(1, i)) for i in range(1, 11)]
        result = again.append([entry(11)], fsync=True)
        assert result.status is Status.OK and (result.segment_id, result.offset) == (1, written)
        assert again.fdatasyncs_count == 1  # the zero tail is the zeroed space again
    finally:
        again.close()
    # A closed writer leaves data only.
    assert file_size(path) == written == data_size(path)
    again_path = os.path.join(crashed, segment_name(1))
    assert file_size(again_path) == written + len(entry(11)) == data_size(again_path)


def test_the_zeroed_space_is_extended_ahead_and_the_next_segment_is_a_spare(
        tmp_path: Path) -> None:
    directory = str(tmp_path)
    writer, _ = new_writer(directory)
    try:
        big = entry(1, 30 * 1024)
        count = 0
        # Write the first segment full, one commit at a time, as a slow stream would.
        while writer.segment_id == 1:
            wait_for(lambda: not writer.preparing)
            assert writer.append([big], fsync=True).status is Status.OK
            count += 1
        spare = os.path.join(directory, SPARE_NAME)
        assert not os.path.exists(spare)  # renamed into place as segment 2
        first = os.path.join(directory, segment_name(1))
        # The roll cut what was left of the zeroed space off the closed segment.
        assert file_size(first) == data_size(first) == (count - 1) * len(big)
        assert file_size(os.path.join(directory, segment_name(2))) == PREALLOC
        # Every commit was inside zeroed space, the one that rolled too.
        assert writer.fdatasyncs_count == count
        assert writer.zero_fill_bytes >= SEGMENT_MAX + PREALLOC
    finally:
        writer.close()
    assert not os.path.exists(os.path.join(directory, SPARE_NAME))


def test_a_failed_write_inside_the_zeroed_space_is_zeroed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = str(tmp_path)
    writer, _ = new_writer(directory)
    try:
        wait_for(lambda: writer.zeroed_ahead_bytes >= PREALLOC // 2)
        first = entry(1)
        assert writer.append([first], fsync=True).status is Status.OK

        def half_then_enospc(fd: int, chunks: list[bytes]) -> None:
            data = b"".join(chunks)
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with monkeypatch.context() as patch:
            patch.setattr(segment_files, "_writev_all", half_then_enospc)
            failed = writer.append([entry(2, 5000)], fsync=True)
        assert failed.status is Status.NOSPC and not failed.broken
        path = os.path.join(directory, segment_name(1))
        with open(path, "rb") as file:
            data = file.read()
        assert len(data) == PREALLOC and data[len(first):] == bytes(PREALLOC - len(first))
        writer.disk_low = False
        result = writer.append([entry(3)], fsync=True)
        assert result.status is Status.OK and result.offset == len(first)
    finally:
        writer.close()


def test_a_leftover_spare_is_removed_at_open(tmp_path: Path) -> None:
    # A spare the preparer had not finished (or synced) when the process died.
    (tmp_path / SPARE_NAME).write_bytes(b"\0" * 1000 + b"junk")
    writer, found = new_writer(str(tmp_path))
    try:
        assert found == [] and not (tmp_path / SPARE_NAME).exists()
        assert writer.append([entry(1)], fsync=True).status is Status.OK
    finally:
        writer.close()


def test_no_preallocation_without_fsync(tmp_path: Path) -> None:
    writer = SegmentWriter(str(tmp_path), segment_bytes_max=SEGMENT_MAX, fsync="never",
                           disk_free_bytes_min=0)
    writer.recover(lambda segment_id, scanned: None)
    try:
        assert writer.append([entry(1)], fsync=False).status is Status.OK
        assert writer.zero_fill_bytes == 0 and writer.zeroed_ahead_bytes == 0
    finally:
        writer.close()


# ---- the record store over a zero tail ----

async def test_a_torn_entry_in_the_zeroed_space_is_cut_and_the_store_goes_on(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 6)]))
    (path,) = segment_paths(data_dir)
    torn = encode_store(make_store(lsn(1, 6)))[:-9]
    # As a crash leaves it: part of an entry written into the zeroed space.
    await asyncio.to_thread(append_to_file, path, torn + bytes(100_000))
    async with running_node(data_dir) as node:
        stats = node.stats()
        assert stats["torn_tail_bytes"] == len(torn) and stats["corrupt_segments"] == 0
        assert (await store(node, make_store(lsn(1, 6)))).status is Status.OK
    async with running_node(data_dir) as node:
        assert node.stats()["torn_tail_bytes"] == 0
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [r[0] for r in reply.records] == [lsn(1, i) for i in range(1, 7)]


async def test_a_zero_tail_is_not_reported_as_torn_and_sizes_are_data_lengths(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 6)]))
    (path,) = segment_paths(data_dir)
    size = await asyncio.to_thread(file_size, path)
    await asyncio.to_thread(append_to_file, path, bytes(300_000))
    async with running_node(data_dir) as node:
        stats = node.stats()
        assert stats["torn_tail_bytes"] == 0 and stats["corrupt_segments"] == 0
        assert stats["disk_bytes"] == size
        assert (await store(node, make_store(lsn(1, 6)))).status is Status.OK
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [r[0] for r in reply.records] == [lsn(1, i) for i in range(1, 7)]
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_the_writer_and_the_preparer_race_without_losing_a_byte(tmp_path: Path) -> None:
    # Small zeroed space and segments, commits as fast as they come: the writer keeps
    # running past the zeroed space (and into the preparer's zero-filling) and rolls often.
    directory = str(tmp_path / "live")
    writer = SegmentWriter(directory, segment_bytes_max=SEGMENT_MAX, fsync="always",
                           disk_free_bytes_min=0, preallocate_bytes=16 * 1024)
    writer.recover(lambda segment_id, scanned: None)
    written: dict[int, list[int]] = {}
    try:
        for i in range(1, 1500):
            chunk = entry(i, 50 + (i * 7919) % 3000)
            result = writer.append([chunk], fsync=True)
            assert result.status is Status.OK
            written.setdefault(result.segment_id, []).append(result.offset)
        assert writer.segment_id >= 3
        assert writer.fdatasyncs_count > 0
        crashed = str(tmp_path / "crashed")
        shutil.copytree(directory, crashed)
    finally:
        writer.close()
    for copy in (crashed, directory):  # as a crash left it, and after a clean close
        again, found = new_writer(copy)
        again.close()
        offsets: dict[int, list[int]] = {}
        for segment_id, scanned in found:
            offsets.setdefault(segment_id, []).append(scanned.offset)
        assert offsets == written
