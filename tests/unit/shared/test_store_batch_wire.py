"""STORE_BATCH, STORED_BATCH and RELEASE_BATCH on the wire (shared/wire/store_batch.py and
their codec paths): round trips, each STORE keeping its own packed bytes, and malformed input
answered with a Status, never an exception."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.status import Status
from shared.types import Epoch, LogId, Lsn
from shared.wire import codec
from shared.wire.framing import FrameDecoder
from shared.wire.message_type import MessageType
from shared.wire.release import Release
from shared.wire.store import Store, Stored, payloads_checksum, sequencer_store, stored_of
from shared.wire.store_batch import (
    RELEASE_BATCH_LOGS_MAX,
    STORE_BATCH_STORES_MAX,
    ReleaseBatch,
    StoreBatch,
    StoredBatch,
    release_batch_entries,
    release_batch_pairs,
    stored_batch_results,
)
from tests.unit.shared.test_codec import stores

TYPE = int(MessageType.STORE_BATCH)


def store(log_id: int, payload: bytes = b"p") -> Store:
    payloads = (payload,)
    return Store(log_id=log_id, lsn=(1 << 32) + log_id, wave=1, sequencer_node="seq1",
                 copyset=("st1", "st2"), timestamp_ms=5, last_known_good=0, release_lsn=0,
                 timeout_ms=10, key=None, payloads=payloads,
                 checksum=payloads_checksum(payloads))


def body_of(frame: bytes) -> bytes:
    [body] = FrameDecoder().feed(frame)
    return body


@settings(max_examples=100, deadline=None)
@given(st.lists(stores(), min_size=1, max_size=6), st.integers(0, 2**32))
def test_store_batch_round_trips_and_each_store_keeps_its_bytes(
        batch_stores: list[Store], correlation_id: int) -> None:
    batch = StoreBatch(stores=tuple(batch_stores))
    decoded = codec.decode(body_of(codec.encode(batch, correlation_id)))
    assert decoded == (correlation_id, batch)
    assert isinstance(decoded, tuple) and isinstance(decoded[1], StoreBatch)
    for sent, got in zip(batch_stores, decoded[1].stores, strict=True):
        # The storage node writes these bytes as they are: they must be the STORE's fields.
        assert got.wire_fields is not None
        assert bytes(got.wire_fields) == codec.encode_fields(sent)


def test_parts_with_packed_stores_are_the_same_frame_without_a_copy() -> None:
    batch = StoreBatch(stores=(store(1), store(2, b"x" * 1000), store(3)))
    packed = tuple(codec.encode_fields(s) for s in batch.stores)
    parts = codec.encode_store_batch_parts(
        StoreBatch(stores=batch.stores).with_packed(packed), 7)
    assert b"".join(parts) == codec.encode(batch, 7)
    assert parts[1:] == packed
    assert all(part is given for part, given in zip(parts[1:], packed, strict=True))


def test_any_legal_encoding_decodes_even_without_the_fast_path() -> None:
    fields = [msgpack.unpackb(codec.encode_fields(s), use_list=False) for s in
              (store(1), store(2))]
    # The type id as a uint8 instead of a fixint: legal msgpack, not what encode makes.
    body = b"\x93\xcc" + bytes([TYPE]) + msgpack.packb(5) + msgpack.packb([fields])
    decoded = codec.decode(body)
    assert decoded == (5, StoreBatch(stores=(store(1), store(2))))


def test_malformed_store_batches_are_badmsg() -> None:
    good = msgpack.unpackb(codec.encode_fields(store(1)), use_list=False)
    too_many = [good] * (STORE_BATCH_STORES_MAX + 1)
    for fields in (
        [[]],                              # no STOREs
        [[good, good[:-3]]],               # a STORE short of its version-1 fields
        [[(*good, 1, 2, 3, 4)]],           # a STORE with fields this build does not know
        [[good], 1],                       # a field this build does not know
        [[good, 5]],                       # not a STORE
        [too_many],
        [[(*good[:2], "not an int", *good[3:])]],  # wave of the wrong type
    ):
        body = b"\x93" + bytes([TYPE]) + msgpack.packb(1) + msgpack.packb(fields)
        assert codec.decode(body) is Status.BADMSG, fields
    good_body = body_of(codec.encode(StoreBatch(stores=(store(1), store(2))), 3))
    assert codec.decode(good_body + b"\x00") is Status.BADMSG  # trailing bytes
    assert codec.decode(good_body[:-1]) is Status.BADMSG  # cut short


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_fuzzed_store_batch_frames_never_raise(data: st.DataObject) -> None:
    batch = StoreBatch(stores=tuple(store(i, b"y" * i) for i in range(1, 4)))
    body = bytearray(body_of(codec.encode(batch, 11)))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(body) - 1))
        body[index] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[:data.draw(st.integers(0, len(body)))]
    result = codec.decode(bytes(body))
    assert result is Status.BADMSG or (
        isinstance(result, tuple) and type(result[1]) in codec.MESSAGE_CLASSES.values())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_after_a_store_batch_header_is_badmsg(tail: bytes) -> None:
    result = codec.decode(b"\x93" + bytes([TYPE]) + b"\x01" + tail)
    assert result is Status.BADMSG or isinstance(result[1], StoreBatch)


def test_stored_batch_round_trips_and_maps_to_each_store() -> None:
    reply = StoredBatch(statuses=(int(Status.OK), int(Status.PREEMPTED), int(Status.NOSPC)),
                        seals=((1, 7, "seq2"),))
    decoded = codec.decode(body_of(codec.encode(reply, 4)))
    assert decoded == (4, reply)
    assert stored_batch_results(reply, 3) == [
        (Status.OK, 0, None), (Status.PREEMPTED, 7, "seq2"), (Status.NOSPC, 0, None)]
    # No seals: the field stays off the wire (one byte per OK answer).
    assert codec.encode(StoredBatch(statuses=(0, 0)), 1).endswith(b"\x91\x92\x00\x00")


@given(st.lists(st.integers(-3, 300), max_size=6), st.lists(
    st.tuples(st.integers(-2, 8), st.integers(-1, 2**33), st.none() | st.text(max_size=4))
    | st.integers(), max_size=3), st.integers(0, 6))
def test_stored_batch_results_of_anything_is_a_list_or_badmsg(
        statuses: list[int], seals: list[object], count: int) -> None:
    reply = StoredBatch(statuses=tuple(statuses), seals=tuple(seals))  # type: ignore[arg-type]
    results = stored_batch_results(reply, count)
    if results is not Status.BADMSG:
        assert isinstance(results, list) and len(results) == count
        assert all(type(status) is Status for status, _, _ in results)


def test_stored_batch_that_does_not_fit_the_batch_is_badmsg() -> None:
    assert stored_batch_results(StoredBatch(statuses=(0, 0)), 3) is Status.BADMSG
    assert stored_batch_results(StoredBatch(statuses=(0, 999)), 2) is Status.BADMSG
    assert stored_batch_results(StoredBatch(statuses=(0,), seals=((1, 2, "x"),)), 1) is (
        Status.BADMSG)
    assert stored_batch_results(StoredBatch(statuses=(0,), seals=((0, 2, "bad id!"),)), 1) is (
        Status.BADMSG)


def test_release_batch_round_trips_and_skips_invalid_pairs() -> None:
    batch = ReleaseBatch(releases=((1, 5), (2, 9)))
    assert codec.decode(body_of(codec.encode(batch))) == (0, batch)
    assert release_batch_entries(batch) == [Release(log_id=1, release_lsn=5),
                                            Release(log_id=2, release_lsn=9)]
    odd = ReleaseBatch(releases=((0, 5), (3, -1), (4, 2), (5,), "x"))  # type: ignore[arg-type]
    assert release_batch_entries(odd) == [Release(log_id=4, release_lsn=2)]
    huge = ReleaseBatch(releases=((1, 1),) * (RELEASE_BATCH_LOGS_MAX + 1))
    assert release_batch_entries(huge) == []
    assert release_batch_pairs(batch) == [(1, 5), (2, 9)]
    assert release_batch_pairs(odd) == [(4, 2)] and release_batch_pairs(huge) == []


@given(st.lists(st.one_of(
    st.tuples(st.integers(-2, 2**63), st.integers(-2, 2**65)),
    st.tuples(st.integers(1, 5)), st.text(max_size=2), st.none()), max_size=8))
def test_release_batch_pairs_are_the_entries_release_batch_entries_gives(
        releases: list[object]) -> None:
    batch = ReleaseBatch(releases=tuple(releases))  # type: ignore[arg-type]
    assert release_batch_pairs(batch) == [
        (release.log_id, release.release_lsn) for release in release_batch_entries(batch)]


@settings(max_examples=100, deadline=None)
@given(stores())
def test_sequencer_store_is_the_same_store_as_the_dataclass_builds(built: Store) -> None:
    fast = sequencer_store(
        built.log_id, built.lsn, built.wave, built.sequencer_node, built.copyset,
        built.timestamp_ms, built.last_known_good, built.release_lsn, built.timeout_ms,
        built.key, built.payloads, built.checksum, built.producers, built.compression,
        built.records)
    assert fast == built and hash(fast) == hash(built) and fast.wire_fields is None
    assert codec.encode(fast, 3) == codec.encode(built, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.wave = 2  # type: ignore[misc]


@given(st.sampled_from(list(Status)), st.integers(0, 2**32), st.none() | st.text(max_size=5))
def test_stored_of_is_the_same_stored_as_the_dataclass_builds(
        status: Status, sealed_epoch: int, sealed_by: str | None) -> None:
    built = Stored(log_id=LogId(3), lsn=Lsn(9), wave=2, status=status,
                   sealed_epoch=Epoch(sealed_epoch), sealed_by=sealed_by)
    fast = stored_of(LogId(3), Lsn(9), 2, status, Epoch(sealed_epoch), sealed_by)
    assert fast == built and hash(fast) == hash(built)
    assert codec.encode(fast, 1) == codec.encode(built, 1)
