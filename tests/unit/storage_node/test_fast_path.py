"""The storage fast path: small batches commit inline on the event loop (no writer-thread
hop) while big ones and busy periods use the writer thread; a STORE is written as the bytes it
arrived in; segments written in the older STORE layout stay readable; a STORE's release
pointer advances the node's release, wakes long-poll READs and is persisted."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.compression import Codec, compress_batch
from shared.status import Status
from shared.wire import codec
from shared.wire.message_type import MessageType
from shared.wire.read import Read
from shared.wire.store import Store
from storage_node import record_store, segment_format
from storage_node.runtime import StorageNode
from storage_node.segment_format import (
    HEADER_BYTES,
    EntryType,
    StoreMeta,
    check_entry,
    decode_meta,
    decode_store_records,
    encode_legacy_store,
    encode_release,
    scan_segment,
)
from tests.unit.storage_node.helpers import (
    LOG,
    assert_ok,
    data_size,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    read_file,
    running_node,
    segment_paths,
    storage_config,
    store,
    store_all,
)


def received(message: Store, correlation_id: int = 5) -> Store:
    """``message`` as the transport hands it over: encoded by the sender, decoded here."""
    decoded = codec.decode(codec.encode(message, correlation_id)[4:])
    assert isinstance(decoded, tuple) and isinstance(decoded[1], Store)
    return decoded[1]


class ThreadHops:
    """Counts the jobs handed to a node's writer thread."""

    def __init__(self, node: StorageNode) -> None:
        self.count = 0
        executor = node.store._writer_thread
        submit = executor.submit

        def counting(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            self.count += 1
            return submit(fn, *args, **kwargs)

        executor.submit = counting  # type: ignore[method-assign]


def all_fields(message: Store) -> list[Any]:
    """Every wire field of ``message``, trailing defaults included (the codec leaves those
    out)."""
    return [getattr(message, name) for name in codec.wire_field_names(Store)]


def overwrite(path: str, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.write(data)


def entries_of(data: bytes) -> list[tuple[EntryType, bytes]]:
    """(type, body) of every entry in a segment's bytes (up to its zero-filled tail)."""
    found: list[tuple[EntryType, bytes]] = []
    offset = 0
    data = data[: scan_segment(data).valid_bytes]
    while offset < len(data):
        checked = check_entry(data, offset)
        assert checked is not None, offset
        entry_type, body_bytes = checked
        found.append((entry_type, data[offset + HEADER_BYTES : offset + HEADER_BYTES + body_bytes]))
        offset += HEADER_BYTES + body_bytes
    return found


# ---- inline commit ----

@pytest.fixture
def fast_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slow this machine's fsync is right now, small commits count as fast."""
    monkeypatch.setattr(record_store, "INLINE_COMMIT_US_MAX", 10**9)


async def test_small_store_on_an_idle_store_commits_without_a_thread_hop(
        tmp_path: Path, fast_disk: None) -> None:
    async with running_node(str(tmp_path)) as node:
        hops = ThreadHops(node)
        fsyncs = node.stats()["fsyncs"]
        for esn in (1, 2, 3):
            assert (await store(node, make_store(lsn(1, esn)))).status is Status.OK
        assert hops.count == 0
        stats = node.stats()
        assert stats["inline_commits"] == 3 and stats["writer_handoffs"] == 0
        # fsync=always: each answered STORE was fsynced first, inline as well.
        assert stats["fsyncs"] - fsyncs == 3
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [r[0] for r in reply.records] == [lsn(1, 1), lsn(1, 2), lsn(1, 3)]


async def test_a_big_batch_goes_to_the_writer_thread_as_one_group_commit(
        tmp_path: Path) -> None:
    big = record_store.INLINE_COMMIT_BYTES_MAX // 8
    async with running_node(str(tmp_path)) as node:
        hops = ThreadHops(node)
        fsyncs = node.stats()["fsyncs"]
        messages = [make_store(lsn(1, esn), (payload_for(esn, big),)) for esn in range(1, 17)]
        assert_ok(await store_all(node, messages))
        assert hops.count >= 1 and node.stats()["inline_commits"] == 0
        # Everything queued in one loop iteration (or while a commit ran) shares an fsync.
        assert node.stats()["fsyncs"] - fsyncs < len(messages)


async def test_stores_arriving_during_a_thread_commit_wait_for_the_next_batch(
        tmp_path: Path) -> None:
    big = record_store.INLINE_COMMIT_BYTES_MAX
    async with running_node(str(tmp_path)) as node:
        hops = ThreadHops(node)
        first = asyncio.ensure_future(store(node, make_store(lsn(1, 1), (payload_for(1, big),))))
        await asyncio.sleep(0)  # the big batch is handed to the thread in this iteration
        await asyncio.sleep(0)
        # A small STORE while the writer thread is busy must not be written beside it on the
        # loop: it joins the next batch, started when the thread is done.
        order: list[str] = []
        first.add_done_callback(lambda _: order.append("first"))
        second = asyncio.ensure_future(store(node, make_store(lsn(1, 2))))
        second.add_done_callback(lambda _: order.append("second"))
        assert_ok([await first, await second])
        await asyncio.sleep(0)  # done callbacks run one iteration later
        assert order == ["first", "second"]
        assert hops.count >= 1
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [r[0] for r in reply.records] == [lsn(1, 1), lsn(1, 2)]


async def test_slow_small_commits_go_back_to_the_writer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every commit is "slow" against a limit of 0 us: after the first one has been timed,
    # small batches use the writer thread, so a slow disk never stalls the event loop.
    monkeypatch.setattr(record_store, "INLINE_COMMIT_US_MAX", 0)
    async with running_node(str(tmp_path)) as node:
        hops = ThreadHops(node)
        assert (await store(node, make_store(lsn(1, 1)))).status is Status.OK
        assert hops.count == 0
        assert (await store(node, make_store(lsn(1, 2)))).status is Status.OK
        assert hops.count == 1


async def test_inline_commit_modes_interval_and_never_still_answer(
        tmp_path: Path, fast_disk: None) -> None:
    for mode in ("interval", "never"):
        directory = tmp_path / mode
        async with running_node(str(directory), storage_config(fsync=mode)) as node:
            fsyncs = node.stats()["fsyncs"]
            assert (await store(node, make_store(lsn(1, 1)))).status is Status.OK
            assert node.stats()["inline_commits"] == 1
            assert node.stats()["fsyncs"] == fsyncs  # answered after the write alone
        async with running_node(str(directory), storage_config(fsync=mode)) as node:
            reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
            assert [r[0] for r in reply.records] == [lsn(1, 1)]


# ---- the received bytes go to disk ----

async def test_a_received_store_is_written_as_its_bytes_without_packing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = received(make_store(lsn(1, 1), (b"one", b"two"), key="k", release_lsn=0))
    assert message.wire_fields is not None

    def no_packing(_: object) -> bytes:
        raise AssertionError("the STORE was packed again")

    monkeypatch.setattr(segment_format, "encode_fields", no_packing)
    async with running_node(str(tmp_path)) as node:
        assert (await store(node, message)).status is Status.OK
        (path,) = segment_paths(str(tmp_path))
        entries = entries_of(await asyncio.to_thread(read_file, path))
        assert (EntryType.STORE_FIELDS, message.wire_fields) in entries
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [(r[0], r[2], r[3]) for r in reply.records] == [
            (lsn(1, 1), "k", b"one"), (lsn(1, 2), "k", b"two")]


async def test_a_locally_built_store_is_packed_to_the_same_layout(tmp_path: Path) -> None:
    message = make_store(lsn(1, 1))
    assert message.wire_fields is None
    async with running_node(str(tmp_path)) as node:
        assert (await store(node, message)).status is Status.OK
        (path,) = segment_paths(str(tmp_path))
        entries = entries_of(await asyncio.to_thread(read_file, path))
        assert (EntryType.STORE_FIELDS, codec.encode_fields(message)) in entries


async def test_restart_rebuilds_the_index_from_received_bytes(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        replies = await store_all(node, [
            received(make_store(lsn(1, esn), release_lsn=lsn(1, esn - 1)), esn)
            for esn in range(1, 6)])
        assert_ok(replies)
        snapshot = node.store.index_snapshot()
    async with running_node(str(tmp_path)) as node:
        assert node.store.index_snapshot() == snapshot
        assert node.log_state(LOG).last_lsn == lsn(1, 5)
        reply = await read(node, make_read(1))
        assert [r[0] for r in reply.records] == [lsn(1, esn) for esn in range(1, 5)]


async def test_old_store_entries_stay_readable_beside_new_ones(tmp_path: Path) -> None:
    """Segments written before STORE_FIELDS hold type-1 STORE entries: a restart indexes
    them and reads serve them, and new entries follow in the same segment."""
    segments = tmp_path / "segments"
    segments.mkdir()
    old = [make_store(lsn(1, 1), (b"a", b"b"), key="x"), make_store(lsn(1, 3))]
    data = b"".join(encode_legacy_store(m) for m in old) + encode_release(LOG, lsn(1, 2))
    (segments / "000000001.seg").write_bytes(data)
    async with running_node(str(tmp_path)) as node:
        assert node.log_state(LOG).release_lsn == lsn(1, 2)
        assert (await store(node, received(make_store(lsn(1, 4))))).status is Status.OK
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [(r[0], r[3]) for r in reply.records] == [
            (lsn(1, 1), b"a"), (lsn(1, 2), b"b"), (lsn(1, 3), old[1].payloads[0]),
            (lsn(1, 4), payload_for(lsn(1, 4)))]
    data = await asyncio.to_thread(read_file, str(segments / "000000001.seg"))
    # (The read's release pointer reached the node as a RELEASE first: the last entry.)
    assert [t for t, _ in entries_of(data)] == [
        EntryType.STORE, EntryType.STORE, EntryType.RELEASE, EntryType.STORE_FIELDS,
        EntryType.RELEASE]


def test_entries_with_fewer_fields_get_the_defaults_of_later_fields() -> None:
    """A field added to Store later goes at the end with a default: an entry written before
    it existed (or by a sender that leaves trailing defaults out) still decodes."""
    message = make_store(lsn(1, 1), (b"p",))
    fields = all_fields(message)
    shorter = msgpack.packb(fields[:12], use_bin_type=True)  # up to the checksum
    copies = decode_store_records(EntryType.STORE_FIELDS, shorter)
    assert copies is not None and copies.producers == ()
    assert copies.records == [(lsn(1, 1), message.timestamp_ms, None, b"p")]
    meta = decode_meta(EntryType.STORE_FIELDS, shorter)
    assert isinstance(meta, StoreMeta) and meta.first_lsn == lsn(1, 1)
    # A field without a default (the checksum) must be there.
    assert decode_meta(EntryType.STORE_FIELDS,
                       msgpack.packb(fields[:11], use_bin_type=True)) is None


async def test_a_corrupt_received_entry_is_caught_on_read_and_at_restart(
        tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        for esn in (1, 2):
            assert (await store(node, received(make_store(lsn(1, esn))))).status is Status.OK
        (path,) = segment_paths(str(tmp_path))
        data = bytearray(await asyncio.to_thread(read_file, path))
        # Flip a payload byte of the second entry.
        second = data.rindex(payload_for(lsn(1, 2)))
        data[second] ^= 0xFF
        await asyncio.to_thread(overwrite, path, bytes(data))
        reply = await read(node, make_read(lsn(1, 2), release_lsn=lsn(1, 9)))
        assert reply.status is Status.CHECKSUM_MISMATCH and reply.records == ()
    scan = scan_segment(bytes(data))
    assert len(scan.entries) == 1 and scan.bad_offset is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_store_fields_bodies_never_raise(body: bytes) -> None:
    meta = decode_meta(EntryType.STORE_FIELDS, body)
    assert meta is None or isinstance(meta, StoreMeta)
    copies = decode_store_records(EntryType.STORE_FIELDS, body)
    assert copies is None or copies.records


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=5),
       st.integers(0, 40), st.binary(min_size=1, max_size=4))
def test_store_fields_bodies_with_wrong_parts_are_refused(
        payloads: list[bytes], cut: int, junk: bytes) -> None:
    body = codec.encode_fields(make_store(lsn(1, 1), tuple(payloads)))
    for mutated in (body[:cut], body + junk, body[:cut] + junk + body[cut:]):
        meta = decode_meta(EntryType.STORE_FIELDS, mutated)
        assert meta is None or isinstance(meta, StoreMeta)


def test_wrong_types_in_a_store_fields_body_are_refused() -> None:
    fields = all_fields(make_store(lsn(1, 1)))
    names = codec.wire_field_names(Store)
    for name, bad in (("payloads", ()), ("payloads", ("text",)), ("log_id", -1),
                      ("producers", (("", 1, 1, 1),)), ("lsn", "x")):
        mutated = list(fields)
        mutated[names.index(name)] = bad
        body = msgpack.packb(mutated, use_bin_type=True)
        assert decode_meta(EntryType.STORE_FIELDS, body) is None, name
        assert decode_store_records(EntryType.STORE_FIELDS, body) is None, name


# ---- the release pointer a STORE carries ----

async def test_a_stores_release_pointer_wakes_a_long_poll_and_is_persisted(
        tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        for esn in (1, 2):
            assert (await store(node, received(make_store(lsn(1, esn))))).status is Status.OK
        plain = make_read(lsn(1, 1))
        waiting = Read(log_id=plain.log_id, from_lsn=plain.from_lsn, until_lsn=plain.until_lsn,
                       release_lsn=plain.release_lsn, records_max=plain.records_max,
                       bytes_max=plain.bytes_max, wait_ms=10_000)
        pending = asyncio.ensure_future(read(node, waiting))
        await asyncio.sleep(0.02)
        assert not pending.done()
        # No RELEASE message: the next STORE carries the pointer.
        assert (await store(node, received(make_store(lsn(1, 3), release_lsn=lsn(1, 2))))
                ).status is Status.OK
        answer = await asyncio.wait_for(pending, 5)
        assert [r[0] for r in answer.records] == [lsn(1, 1), lsn(1, 2)]
        assert node.log_state(LOG).release_lsn == lsn(1, 2)
    async with running_node(str(tmp_path)) as node:
        assert node.log_state(LOG).release_lsn == lsn(1, 2)


def test_fields_offset_covers_every_correlation_id_width() -> None:
    message = make_store(lsn(1, 1))
    for correlation_id in (0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32,
                           2**64 - 1):
        assert received(message, correlation_id).wire_fields == codec.encode_fields(message)
    # A legal body of another shape (a signed correlation id) decodes, without the bytes kept:
    # the storage node then packs the STORE itself.
    body = b"\x93" + msgpack.packb(int(MessageType.STORE)) + b"\xd3" + struct.pack(">q", 7) + (
        codec.encode_fields(message))
    decoded = codec.decode(body)
    assert isinstance(decoded, tuple) and decoded[1] == message
    assert isinstance(decoded[1], Store) and decoded[1].wire_fields is None


def test_replace_never_carries_stale_bytes() -> None:
    message = received(make_store(lsn(1, 1)))
    changed = dataclasses.replace(message, wave=2)
    assert message.wire_fields is not None and changed.wire_fields is None


# ---- small reads of what was just written ----

class ReadThreadHops:
    """Counts the jobs handed to a node's read threads."""

    def __init__(self, node: StorageNode) -> None:
        self.count = 0
        executor = node.store._read_threads
        submit = executor.submit

        def counting(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            self.count += 1
            return submit(fn, *args, **kwargs)

        executor.submit = counting  # type: ignore[method-assign]


async def test_a_woken_tailing_read_is_served_on_the_loop(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        hops = ReadThreadHops(node)
        assert (await store(node, received(make_store(lsn(1, 1))))).status is Status.OK
        plain = make_read(lsn(1, 1))
        waiting = Read(log_id=plain.log_id, from_lsn=plain.from_lsn, until_lsn=plain.until_lsn,
                       release_lsn=plain.release_lsn, records_max=plain.records_max,
                       bytes_max=plain.bytes_max, wait_ms=10_000)
        pending = asyncio.ensure_future(read(node, waiting))
        await asyncio.sleep(0.02)
        assert (await store(node, received(make_store(lsn(1, 2), release_lsn=lsn(1, 1))))
                ).status is Status.OK
        answer = await asyncio.wait_for(pending, 5)
        assert [r[0] for r in answer.records] == [lsn(1, 1)]
        assert answer.release_lsn == lsn(1, 1)
        assert hops.count == 0 and node.stats()["inline_reads"] == 1


async def test_big_reads_and_reads_of_older_segments_use_the_read_threads(
        tmp_path: Path) -> None:
    big = 300 * 1024
    async with running_node(str(tmp_path)) as node:  # 1 MiB segments
        hops = ReadThreadHops(node)
        sizes = {1: 32, 2: big, 3: big, 4: big, 5: big, 6: 32}
        for esn, size in sizes.items():
            message = make_store(lsn(1, esn), (payload_for(esn, size),))
            assert (await store(node, message)).status is Status.OK
        assert len(segment_paths(str(tmp_path))) > 1
        served = 0

        async def read_one(esn: int) -> None:
            nonlocal served
            reply = await read(node, make_read(lsn(1, esn), until_lsn=lsn(1, esn),
                                               release_lsn=lsn(1, 6)))
            assert [(r[0], r[3]) for r in reply.records] == [
                (lsn(1, esn), payload_for(esn, sizes[esn]))]
            served += 1

        await read_one(1)  # small, in an older segment: thread
        assert hops.count == 1
        await read_one(5)  # in the newest segment, too big: thread
        assert hops.count == 2
        await read_one(6)  # small, in the segment being written: inline
        assert hops.count == 2 and node.stats()["inline_reads"] == 1
        assert served == 3


async def test_a_small_commit_that_rolls_the_segment_goes_to_the_writer_thread(
        tmp_path: Path, fast_disk: None) -> None:
    segment_max = storage_config().segment_bytes_max
    big = 300 * 1024
    async with running_node(str(tmp_path)) as node:
        hops = ThreadHops(node)
        for esn in range(1, 4):
            message = make_store(lsn(1, esn), (payload_for(esn, big),))
            assert (await store(node, message)).status is Status.OK
        (path,) = segment_paths(str(tmp_path))
        used = await asyncio.to_thread(data_size, path)
        # Fill the segment up to 200 bytes before its end.
        overhead = len(segment_format.encode_store(make_store(lsn(1, 4), (b"",))))
        filler = make_store(lsn(1, 4), (payload_for(4, segment_max - used - overhead - 200),))
        assert (await store(node, filler)).status is Status.OK
        assert len(segment_paths(str(tmp_path))) == 1
        before = hops.count
        # Small, but it does not fit: it rolls the segment, in the writer thread.
        small = make_store(lsn(1, 5), (payload_for(5, 1024),))
        assert (await store(node, small)).status is Status.OK
        assert hops.count == before + 1
        assert len(segment_paths(str(tmp_path))) == 2
        # The next small one goes inline again, into the new segment.
        assert (await store(node, make_store(lsn(1, 6)))).status is Status.OK
        assert hops.count == before + 1


async def test_a_received_compressed_batch_is_written_as_received_and_read_whole(
        tmp_path: Path) -> None:
    lines = [b'{"n": %d, "msg": "hello"}' % i for i in range(50)]
    blob = compress_batch(lines, Codec.LZ4)
    assert blob is not None
    message = received(dataclasses.replace(make_store(lsn(1, 1), (blob,)),
                                           compression=int(Codec.LZ4), records=len(lines)))
    async with running_node(str(tmp_path)) as node:
        assert (await store(node, message)).status is Status.OK
        (path,) = segment_paths(str(tmp_path))
        entries = entries_of(await asyncio.to_thread(read_file, path))
        assert (EntryType.STORE_FIELDS, message.wire_fields) in entries
        whole = await read(node, make_read(1, release_lsn=lsn(1, 50)))
        assert [(b[0], b[4]) for b in whole.blocks] == [(lsn(1, 1), 50)]
        inside = await read(node, make_read(lsn(1, 10), until_lsn=lsn(1, 11),
                                            release_lsn=lsn(1, 50)))
        assert [r[3] for r in inside.records] == lines[9:11]
    async with running_node(str(tmp_path)) as node:
        assert node.log_state(LOG).last_lsn == lsn(1, 50)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=4096))
def test_entry_crc_is_zlibs_crc32_so_old_segments_still_check(body: bytes) -> None:
    """The CRC-32 is computed by ISA-L now; its values must be zlib's, which every segment
    written so far carries."""
    import zlib

    entry = segment_format._frame(segment_format.EntryType.TRIM, body)
    prefix_bytes = segment_format._CRC_PREFIX_BYTES
    (crc,) = struct.unpack_from("<I", entry, prefix_bytes)
    expected = zlib.crc32(entry[segment_format.HEADER_BYTES:], zlib.crc32(entry[:prefix_bytes]))
    assert crc == expected
    assert segment_format.check_entry(entry, 0) is not None
