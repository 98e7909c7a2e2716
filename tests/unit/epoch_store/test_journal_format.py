"""The journal format of the file epoch store (``epoch_store.core.journal``): round trips, torn
tails at every byte, and fuzzing of the parser with hostile bytes."""

from __future__ import annotations

import zlib

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


@given(st.lists(records, min_size=1, max_size=5))
def test_frames_round_trip(batches: list[list[journal.Record]]) -> None:
    data = frames_of(batches)
    found = journal.scan(data)
    assert found.problem is None and found.torn_bytes == 0
    assert found.valid_bytes == len(data)
    assert found.records == [r for batch in batches for r in batch]


@settings(max_examples=20)
@given(st.lists(st.lists(metadata() | lce(), min_size=1, max_size=4), min_size=2, max_size=3))
def test_a_cut_anywhere_in_the_last_frame_is_a_torn_tail(
    batches: list[list[journal.Record]],
) -> None:
    head = frames_of(batches[:-1])
    last = frames_of(batches[-1:])
    for cut in range(len(last)):
        found = journal.scan(head + last[:cut])
        assert found.problem is None
        assert found.valid_bytes == len(head)
        assert found.torn_bytes == cut
        assert found.records == [r for batch in batches[:-1] for r in batch]


def test_zeros_after_the_last_frame_are_a_torn_tail() -> None:
    value = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    good = journal.encode_frame(journal.encode_record(value))
    found = journal.scan(good + bytes(4096))
    assert (found.records, found.valid_bytes, found.torn_bytes, found.problem) == (
        [value], len(good), 4096, None)


def test_garbage_longer_than_a_commit_is_corruption() -> None:
    value = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    good = journal.encode_frame(journal.encode_record(value))
    found = journal.scan(good + b"\xff" * (journal.COMMIT_BYTES_MAX + 64))
    assert found.records == [value] and found.problem is not None


def test_a_valid_frame_with_an_invalid_record_is_corruption() -> None:
    bad = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(2), tail_lsn=Lsn(0), version=1)
    payload = bytearray(journal.encode_record(bad))
    payload[1 + 8 + 4:1 + 8 + 4 + 4] = (0).to_bytes(4, "little")  # epoch 0 is not storable
    found = journal.scan(journal.encode_frame(bytes(payload)))
    assert found.records == [] and found.problem is not None and found.torn_bytes == 0


@given(st.binary(max_size=4096))
def test_scan_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    found = journal.scan(data)
    assert 0 <= found.valid_bytes <= len(data)
    assert found.valid_bytes + found.torn_bytes <= len(data)


@given(st.binary(min_size=1, max_size=2048))
def test_decode_never_raises_on_a_payload_with_a_valid_crc(payload: bytes) -> None:
    # A CRC-valid frame around hostile bytes reaches the record decoder.
    frame = journal.FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    found = journal.scan(frame)
    assert found.problem is not None or found.valid_bytes == len(frame)
    assert journal.decode_records(payload) is not None


@given(records, st.data())
def test_a_flipped_byte_never_yields_records_that_were_not_written(
    batch: list[journal.Record], data: st.DataObject
) -> None:
    frame = frames_of([batch])
    index = data.draw(st.integers(0, len(frame) - 1))
    flipped = bytearray(frame)
    flipped[index] ^= data.draw(st.integers(1, 255))
    found = journal.scan(bytes(flipped))
    assert found.records in ([], batch)


def test_header_is_checked() -> None:
    assert journal.check_header(journal.header()) is None
    assert journal.check_header(b"SEQLOGEJ") is not None
    assert journal.check_header(b"NOTAJRNL\x01\x00\x00\x00") is not None
    assert journal.check_header(journal.HEADER.pack(journal.MAGIC, 99)) is not None
