"""The journal format of the file epoch store (``epoch_store.core.journal``): round trips, torn
tails at every byte, and fuzzing of the parser with hostile bytes."""

from __future__ import annotations

import zlib
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from epoch_store.core import journal
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.types import EPOCH_MAX, LOG_ID_MAX, Epoch, Esn, LogId, Lsn, NodeId, compose_lsn

_node = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abcXYZ019"),
    st.text(alphabet="abz09_.-", max_size=12),
)


@st.composite
def metadata(draw: st.DrawFn) -> LogMetadata:
    nodeset = tuple(draw(st.lists(_node, min_size=1, max_size=8, unique=True)))
    return LogMetadata(
        log_id=LogId(draw(st.integers(1, LOG_ID_MAX))),
        next_epoch=Epoch(draw(st.integers(1, EPOCH_MAX))),
        nodeset=tuple(NodeId(n) for n in nodeset),
        replication_factor=draw(st.integers(1, len(nodeset))),
        last_writer=draw(st.none() | _node.map(NodeId)),
        version=draw(st.integers(1, 2**32 - 1)),
    )


@st.composite
def lce(draw: st.DrawFn) -> LastCleanEpoch:
    epoch = draw(st.integers(1, EPOCH_MAX - 1))
    tail_epoch = draw(st.integers(0, epoch))
    tail = 0 if tail_epoch == 0 else compose_lsn(Epoch(tail_epoch),
                                                 Esn(draw(st.integers(0, 2**32 - 1))))
    return LastCleanEpoch(log_id=LogId(draw(st.integers(1, LOG_ID_MAX))), epoch=Epoch(epoch),
                          tail_lsn=Lsn(tail), version=draw(st.integers(1, 2**32 - 1)))


records = st.lists(metadata() | lce(), min_size=1, max_size=20)


def frames_of(batches: list[list[journal.Record]]) -> bytes:
    return b"".join(journal.encode_frame(b"".join(journal.encode_record(r) for r in batch))
                    for batch in batches)


def scanned(data: bytes) -> tuple[journal.Scan, list[journal.Record]]:
    """``scan`` of ``data`` and the values it stored (the last one per object), decoded."""
    objects: journal.Objects = {}
    found = journal.scan(data, objects)
    interned = journal.Interned()
    values: list[journal.Record] = []
    for log_id, current in objects.items():
        meta_raw, lce_raw = journal.split_log(current)
        if meta_raw is not None:
            meta = journal.decode_metadata(meta_raw, log_id, interned)
            assert not isinstance(meta, str), meta
            values.append(meta)
        if lce_raw is not None:
            value = journal.decode_lce(lce_raw, log_id)
            assert not isinstance(value, str), value
            values.append(value)
    return found, values


def last_values(batches: list[list[journal.Record]]) -> list[journal.Record]:
    latest: dict[tuple[bool, int], journal.Record] = {}
    for batch in batches:
        for value in batch:
            latest[(isinstance(value, LogMetadata), value.log_id)] = value
    return sorted(latest.values(), key=_order)


def _order(value: journal.Record) -> tuple[bool, int]:
    return (not isinstance(value, LogMetadata), value.log_id)


@given(st.lists(records, min_size=1, max_size=5))
def test_frames_round_trip(batches: list[list[journal.Record]]) -> None:
    data = frames_of(batches)
    found, values = scanned(data)
    assert found.problem is None and found.torn_bytes == 0
    assert found.valid_bytes == len(data)
    assert sorted(values, key=_order) == last_values(batches)


@given(st.lists(st.lists((metadata() | lce()).flatmap(
    lambda v: st.integers(1, 3).map(lambda log: replace(v, log_id=LogId(log)))),
    min_size=1, max_size=6), min_size=1, max_size=4))
def test_the_last_value_of_each_object_wins_when_logs_repeat(
    batches: list[list[journal.Record]],
) -> None:
    # Three logs only: metadata and last clean epoch records of one log interleave.
    found, values = scanned(frames_of(batches))
    assert found.problem is None
    assert sorted(values, key=_order) == last_values(batches)


@settings(max_examples=20)
@given(st.lists(st.lists(metadata() | lce(), min_size=1, max_size=4), min_size=2, max_size=3))
def test_a_cut_anywhere_in_the_last_frame_is_a_torn_tail(
    batches: list[list[journal.Record]],
) -> None:
    head = frames_of(batches[:-1])
    last = frames_of(batches[-1:])
    for cut in range(len(last)):
        found, values = scanned(head + last[:cut])
        assert found.problem is None
        assert found.valid_bytes == len(head)
        assert found.torn_bytes == cut
        assert sorted(values, key=_order) == last_values(batches[:-1])


def test_zeros_after_the_last_frame_are_a_torn_tail() -> None:
    value = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    good = journal.encode_frame(journal.encode_record(value))
    found, values = scanned(good + bytes(4096))
    assert (values, found.valid_bytes, found.torn_bytes, found.problem) == (
        [value], len(good), 4096, None)


def test_garbage_longer_than_a_commit_is_corruption() -> None:
    value = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    good = journal.encode_frame(journal.encode_record(value))
    found, values = scanned(good + b"\xff" * (journal.COMMIT_BYTES_MAX + 64))
    assert values == [value] and found.problem is not None


def test_a_valid_frame_that_does_not_split_into_records_is_corruption() -> None:
    value = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    payload = journal.encode_record(value) + b"\x03"  # a record head cut short
    found, values = scanned(journal.encode_frame(payload))
    assert values == [] and found.problem is not None and found.torn_bytes == 0


def test_an_invalid_record_is_refused_when_decoded() -> None:
    value = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    raw = bytearray(journal.encode_record(value))
    raw[journal.RECORD_HEAD.size + 4:journal.RECORD_HEAD.size + 8] = bytes(4)  # epoch 0
    assert isinstance(journal.decode_lce(bytes(raw), LogId(1)), str)
    assert isinstance(journal.decode_lce(journal.encode_record(value), LogId(2)), str)


@given(st.binary(max_size=4096))
def test_scan_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    found = journal.scan(data, {})
    assert 0 <= found.valid_bytes <= len(data)
    assert found.valid_bytes + found.torn_bytes <= len(data)


@given(st.binary(min_size=1, max_size=2048))
def test_hostile_records_in_a_frame_with_a_valid_crc_never_raise(payload: bytes) -> None:
    # A CRC-valid frame around hostile bytes reaches the record splitter and the decoders.
    frame = journal.FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    objects: journal.Objects = {}
    found = journal.scan(frame, objects)
    assert found.problem is not None or found.valid_bytes == len(frame)
    interned = journal.Interned()
    for log_id, current in objects.items():
        meta_raw, lce_raw = journal.split_log(current)
        if meta_raw is not None:
            journal.decode_metadata(meta_raw, log_id, interned)
        if lce_raw is not None:
            journal.decode_lce(lce_raw, log_id)


@given(st.binary(max_size=300), st.integers(1, LOG_ID_MAX))
def test_decoders_never_raise(raw: bytes, log_id: int) -> None:
    journal.decode_metadata(raw, LogId(log_id), journal.Interned())
    journal.decode_lce(raw, LogId(log_id))


@given(records, st.data())
def test_a_flipped_byte_never_yields_records_that_were_not_written(
    batch: list[journal.Record], data: st.DataObject
) -> None:
    frame = frames_of([batch])
    index = data.draw(st.integers(0, len(frame) - 1))
    flipped = bytearray(frame)
    flipped[index] ^= data.draw(st.integers(1, 255))
    _, values = scanned(bytes(flipped))
    assert sorted(values, key=_order) in ([], last_values([batch]))


def test_header_is_checked() -> None:
    assert journal.check_header(journal.header()) is None
    assert journal.check_header(b"SEQLOGEJ") is not None
    assert journal.check_header(b"NOTAJRNL\x01\x00\x00\x00") is not None
    assert journal.check_header(journal.HEADER.pack(journal.MAGIC, 99)) is not None
