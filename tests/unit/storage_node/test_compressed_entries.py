"""Compressed batch entries on a storage node: stored as the blob (the segment holds the
compressed bytes), indexed by their LSN range, sent whole to reads that cover them, expanded and
sliced for reads that start or end inside, for digests, after a trim inside and after a
recovery copy replaced part of them; the restart scan rebuilds the same index."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.compression import Codec, compress_batch
from shared.read_merge import NodeAnswer, expand_blocks, merge
from shared.status import Status
from shared.types import Epoch, Esn, Lsn
from shared.wire import codec as wire_codec
from shared.wire.read import ReadReply
from shared.wire.recovery import Digest, GetDigest
from shared.wire.store import RecordFlags, Store, payloads_checksum, recovery_wave
from shared.wire.trim import Trim, Trimmed
from storage_node.runtime import StorageNode
from storage_node.segment_format import (
    HEADER_BYTES,
    EntryType,
    StoreMeta,
    decode_meta,
    decode_store_records,
    encode_store,
    scan_segment,
)
from tests.unit.storage_node.helpers import (
    LOG,
    SEQ_B,
    data_size,
    lsn,
    make_read,
    make_store,
    read,
    request,
    running_node,
    segment_paths,
    store,
)

ALL = 2**64 - 2
LINES = [json.dumps({"level": "info", "msg": f"request {i} served", "latency_ms": i % 13,
                     "pad": "x" * 200}).encode() for i in range(100)]


def compressed_store(first: Lsn, payloads: list[bytes], codec: Codec = Codec.LZ4,
                     blob: bytes | None = None) -> Store:
    if blob is None:
        blob = compress_batch(payloads, codec)
        assert blob is not None
    return dataclasses.replace(make_store(first, (blob,)), compression=int(codec),
                               records=len(payloads))


def plain(reply: ReadReply) -> dict[int, bytes]:
    records = expand_blocks(reply.blocks, reply.records)
    assert records is not None
    assert len({r[0] for r in records}) == len(records)  # never one LSN twice
    return {r[0]: r[3] for r in records}


def expected(first_esn: int, payloads: list[bytes]) -> dict[int, bytes]:
    return {lsn(1, first_esn + i): p for i, p in enumerate(payloads)}


async def setup(node: StorageNode) -> dict[int, bytes]:
    """e1n1 plain, e1n2..e1n101 one lz4 batch, e1n102 plain, e1n103..e1n202 one zstd batch."""
    assert (await store(node, make_store(lsn(1, 1), (b"before",)))).status is Status.OK
    assert (await store(node, compressed_store(lsn(1, 2), LINES))).status is Status.OK
    assert (await store(node, make_store(lsn(1, 102), (b"between",)))).status is Status.OK
    zstd = compressed_store(lsn(1, 103), LINES, Codec.ZSTD)
    assert (await store(node, zstd)).status is Status.OK
    return {lsn(1, 1): b"before", **expected(2, LINES), lsn(1, 102): b"between",
            **expected(103, LINES)}


async def test_blob_is_stored_and_read_whole_or_sliced(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        want = await setup(node)
        # On disk: the compressed size, far below the plain payloads.
        segment_bytes = sum([await asyncio.to_thread(data_size, p)
                             for p in segment_paths(str(tmp_path))])
        assert segment_bytes < sum(map(len, LINES)) / 4

        whole = await read(node, make_read(1, release_lsn=ALL))
        assert plain(whole) == want
        assert [(b[0], b[3], b[4]) for b in whole.blocks] == [
            (lsn(1, 2), Codec.LZ4, 100), (lsn(1, 103), Codec.ZSTD, 100)]
        assert [r[0] for r in whole.records] == [lsn(1, 1), lsn(1, 102)]

        # Starting inside a batch: expanded and sliced.
        middle = await read(node, make_read(lsn(1, 40), release_lsn=ALL))
        assert plain(middle) == {k: v for k, v in want.items() if k >= lsn(1, 40)}
        assert [b[0] for b in middle.blocks] == [lsn(1, 103)]

        # Ending inside a batch (the range, and records_max).
        ending = await read(node, make_read(1, until_lsn=lsn(1, 50), release_lsn=ALL))
        assert plain(ending) == {k: v for k, v in want.items() if k <= lsn(1, 50)}
        assert not ending.blocks and ending.next_lsn == lsn(1, 51)
        # A block that does not fit after what a read took ends it: the next read takes it
        # whole; one over records_max by itself is sliced.
        capped = await read(node, make_read(1, records_max=30, release_lsn=ALL))
        assert plain(capped) == {lsn(1, 1): b"before"} and capped.next_lsn == lsn(1, 2)
        capped = await read(node, make_read(lsn(1, 2), records_max=30, release_lsn=ALL))
        assert plain(capped) == {k: v for k, v in want.items() if lsn(1, 2) <= k < lsn(1, 32)}
        assert not capped.blocks and capped.next_lsn == lsn(1, 32)
        two = await read(node, make_read(lsn(1, 102), records_max=100, release_lsn=ALL))
        assert plain(two) == {lsn(1, 102): b"between"} and two.next_lsn == lsn(1, 103)
        # bytes_max counts a block by its plain size; the first item is taken whatever its
        # size.
        small = await read(node, make_read(lsn(1, 102), bytes_max=1000, release_lsn=ALL))
        assert plain(small) == {lsn(1, 102): b"between"} and small.next_lsn == lsn(1, 103)
        first_whole = await read(node, make_read(lsn(1, 103), bytes_max=1000, release_lsn=ALL))
        assert len(first_whole.blocks) == 1

        # A digest sees every record of a batch on its own.
        digest = await request(node, GetDigest(log_id=LOG, epoch=Epoch(1), from_esn=Esn(1),
                                               seal_epoch=Epoch(1), records_max=1000,
                                               bytes_max=1 << 24))
        assert isinstance(digest, Digest) and digest.status is Status.OK
        assert {lsn(1, e[0]): e[5] for e in digest.entries} == want


async def test_restart_scan_rebuilds_the_index(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        want = await setup(node)
        snapshot = node.store.index_snapshot()
        assert [loc[3:5] for loc in snapshot[LOG]] == [
            (lsn(1, 1), lsn(1, 1)), (lsn(1, 2), lsn(1, 101)), (lsn(1, 102), lsn(1, 102)),
            (lsn(1, 103), lsn(1, 202))]
    async with running_node(str(tmp_path)) as node:
        assert node.store.index_snapshot() == snapshot
        reply = await read(node, make_read(1, release_lsn=ALL))
        assert plain(reply) == want and len(reply.blocks) == 2


async def test_trim_inside_a_batch(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        want = await setup(node)
        trimmed = await request(node, Trim(log_id=LOG, trim_lsn=lsn(1, 60)))
        assert isinstance(trimmed, Trimmed) and trimmed.status is Status.OK
        reply = await read(node, make_read(1, release_lsn=ALL))
        assert plain(reply) == {k: v for k, v in want.items() if k > lsn(1, 60)}
        assert [b[0] for b in reply.blocks] == [lsn(1, 103)]  # the cut batch is sliced
    async with running_node(str(tmp_path)) as node:
        reply = await read(node, make_read(1, release_lsn=ALL))
        assert plain(reply) == {k: v for k, v in want.items() if k > lsn(1, 60)}


async def test_recovery_copy_inside_a_batch_wins_once(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        want = await setup(node)
        payloads = (b"recovered",)
        recovered = Store(log_id=LOG, lsn=lsn(1, 50), wave=recovery_wave(1, 1),
                          sequencer_node=SEQ_B, copyset=(), timestamp_ms=5,
                          last_known_good=Esn(0), release_lsn=Lsn(0), timeout_ms=500, key=None,
                          payloads=payloads, checksum=payloads_checksum(payloads),
                          flags=int(RecordFlags.WRITTEN_BY_RECOVERY))
        assert (await store(node, recovered)).status is Status.OK
        reply = await read(node, make_read(1, release_lsn=ALL))
        assert plain(reply) == {**want, lsn(1, 50): b"recovered"}
        assert [b[0] for b in reply.blocks] == [lsn(1, 103)]
        assert reply.markers == ((lsn(1, 50), lsn(1, 50), int(RecordFlags.WRITTEN_BY_RECOVERY),
                                  recovery_wave(1, 1)),)
        # The merge: recovery's copy beats another node's block copy of the same LSN.
        other = await read(node, make_read(lsn(1, 2), until_lsn=lsn(1, 101), release_lsn=ALL))
        block_node = NodeAnswer(records=expand_blocks(
            ((lsn(1, 2), 0, None, int(Codec.LZ4), 100,
              compress_batch(LINES, Codec.LZ4) or b""),), ()) or (),
            next_lsn=Lsn(ALL), release_lsn=Lsn(ALL - 1))
        this_node = NodeAnswer(records=plain_records(other), next_lsn=Lsn(ALL),
                               release_lsn=Lsn(ALL - 1), markers=other.markers)
        merged = merge([block_node, this_node], lsn(1, 2), lsn(1, 101), 1000, 1 << 30)
        assert [r[0] for r in merged.records] == list(range(lsn(1, 2), lsn(1, 102)))
        assert merged.records[48][3] == b"recovered" and not merged.gaps


def plain_records(reply: ReadReply) -> tuple[tuple[int, int, str | None, bytes], ...]:
    records = expand_blocks(reply.blocks, reply.records)
    assert records is not None
    return records


async def test_a_bad_blob_is_never_served_as_records(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        # A blob that passed no edge check (a hostile peer): stored, as the CRC matches.
        bad = compressed_store(lsn(1, 1), LINES, blob=b"\x04\x22\x4d\x18garbage")
        assert (await store(node, bad)).status is Status.OK
        whole = await read(node, make_read(1, release_lsn=ALL))
        assert whole.status is Status.OK and len(whole.blocks) == 1
        assert expand_blocks(whole.blocks, whole.records) is None  # the reader refuses it
        inside = await read(node, make_read(lsn(1, 5), release_lsn=ALL))
        assert inside.status is Status.CHECKSUM_MISMATCH and not inside.records


def test_entry_round_trips_and_the_scan_indexes_its_range() -> None:
    entry = encode_store(compressed_store(lsn(1, 2), LINES, Codec.ZSTD))
    scan = scan_segment(entry + encode_store(make_store(lsn(1, 102), (b"p",))))
    assert scan.bad_offset is None
    meta = scan.entries[0].entry
    assert isinstance(meta, StoreMeta)
    assert (meta.first_lsn, meta.last_lsn) == (lsn(1, 2), lsn(1, 101))
    copies = decode_store_records(EntryType.STORE_FIELDS, memoryview(entry)[HEADER_BYTES:])
    assert copies is not None and [r[3] for r in copies.records] == LINES
    block = decode_store_records(EntryType.STORE_FIELDS, memoryview(entry)[HEADER_BYTES:],
                                 expand=False)
    assert block is not None and block.records == [] and block.count == 100


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 2**64 - 1), st.binary(max_size=40), st.text(max_size=4),
                          st.none(), st.lists(st.binary(max_size=40), max_size=2)),
                min_size=10, max_size=14))
def test_fuzz_store_bodies_never_raise(fields: list[object]) -> None:
    body = msgpack.packb(fields, use_bin_type=True)
    for entry_type in (EntryType.STORE, EntryType.STORE_FIELDS):
        decode_meta(entry_type, body)
        copies = decode_store_records(entry_type, body)
        assert copies is None or isinstance(copies.records, list)
        decode_store_records(entry_type, body, expand=False)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3), st.integers(-1, 200), st.binary(max_size=300))
def test_fuzz_compressed_fields_of_a_valid_entry(codec: int, count: int, blob: bytes) -> None:
    fields = [7, lsn(1, 1), count, "seq", 1, 0, 1, ["n1"], None, [blob], 0, [], codec]
    body = msgpack.packb(fields, use_bin_type=True)
    meta = decode_meta(EntryType.STORE, body)
    assert meta is None or codec in (1, 2)
    copies = decode_store_records(EntryType.STORE, body)
    # Random bytes never expand to a batch; a bad codec or count is refused before trying.
    # (Codec 0 with a count of 1 is a valid plain entry of one payload.)
    assert copies is None or (codec == 0 and count == 1)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3), st.integers(-1, 200), st.binary(max_size=300))
def test_fuzz_compressed_fields_of_a_store_fields_entry(codec: int, count: int,
                                                        blob: bytes) -> None:
    """The same for the STORE_FIELDS layout (the STORE's own fields, as received)."""
    store = dataclasses.replace(make_store(lsn(1, 1), (blob,)), compression=codec,
                                records=max(count, 0))
    body = wire_codec.encode_fields(store)
    meta = decode_meta(EntryType.STORE_FIELDS, body)
    assert meta is None or codec in (1, 2) or codec == 0
    copies = decode_store_records(EntryType.STORE_FIELDS, body)
    if codec:
        assert copies is None
