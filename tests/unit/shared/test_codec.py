"""The wire codec: every message round-trips; malformed frames become BADMSG, never raise."""

from __future__ import annotations

import dataclasses
import itertools
import random

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.status import Status
from shared.types import compose_lsn, format_lsn, parse_lsn
from shared.wire import codec
from shared.wire.framing import FrameDecoder, FrameTooBig, frame
from shared.wire.message_type import MessageType
from shared.wire.store import Store, Stored, payloads_checksum

ints = st.integers(0, 2**63)
node = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


@st.composite
def stores(draw: st.DrawFn) -> Store:
    payloads = tuple(draw(st.lists(st.binary(max_size=64), min_size=1, max_size=4)))
    return Store(log_id=draw(ints), lsn=draw(ints), wave=draw(ints), sequencer_node=draw(node),
                 copyset=tuple(draw(st.lists(node, max_size=3))), timestamp_ms=draw(ints),
                 last_known_good=draw(ints), release_lsn=draw(ints), timeout_ms=draw(ints),
                 key=draw(st.none() | st.text(max_size=8)), payloads=payloads,
                 checksum=payloads_checksum(payloads))


@settings(max_examples=200, deadline=None)
@given(stores(), st.integers(0, 2**32))
def test_store_round_trips(store: Store, correlation_id: int) -> None:
    frames = FrameDecoder().feed(codec.encode(store, correlation_id))
    assert codec.decode(frames[0]) == (correlation_id, store)


@given(st.sampled_from(list(Status)), st.none() | node)
def test_stored_round_trips(status: Status, sealed_by: str | None) -> None:
    stored = Stored(log_id=1, lsn=2, wave=3, status=status, sealed_epoch=4, sealed_by=sealed_by)
    body = FrameDecoder().feed(codec.encode(stored, 9))[0]
    decoded = codec.decode(body)
    assert decoded == (9, stored)
    assert isinstance(decoded, tuple) and type(decoded[1].status) is Status


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_badmsg(body: bytes) -> None:
    result = codec.decode(body)
    assert result is Status.BADMSG or isinstance(result, tuple)


def test_wrong_field_types_and_unknown_status_are_badmsg() -> None:
    good = [1, 2, 3, int(Status.OK), 4, None]
    assert isinstance(codec.decode(msgpack.packb([int(MessageType.STORED), 1, good])), tuple)
    for index, bad in [(0, "x"), (3, 999), (5, 7), (2, b"b")]:
        fields = list(good)
        fields[index] = bad
        body = msgpack.packb([int(MessageType.STORED), 1, fields])
        assert codec.decode(body) is Status.BADMSG
    assert codec.decode(msgpack.packb([999, 1, good])) is Status.BADMSG
    assert codec.decode(msgpack.packb([int(MessageType.STORED), 1, good[:-1]])) is Status.BADMSG


def test_oversized_frame_header_is_refused() -> None:
    decoder = FrameDecoder(frame_bytes_max=10)
    try:
        decoder.feed(b"\x00\x00\x01\x00")
    except FrameTooBig:
        return
    raise AssertionError("FrameTooBig not raised")


def test_lsn_text_round_trips() -> None:
    lsn = compose_lsn(5, 8)  # type: ignore[arg-type]
    assert format_lsn(lsn) == "e5n8"
    assert parse_lsn("e5n8") == lsn
    assert parse_lsn(str(lsn)) == lsn
    assert parse_lsn("e5") is None and parse_lsn("-1") is None


def test_new_trailing_fields_are_left_out_at_their_defaults_and_filled_in() -> None:
    from shared.wire.append import Append

    plain = Append(log_id=1, payloads=(b"x",), key=None, hops=0)
    fields = msgpack.unpackb(codec.encode_fields(plain))
    # Byte for byte what a version-1 node sends: its 6 fields, no extensions.
    assert fields == [1, [b"x"], None, 0, None, 0]
    assert codec.decode(msgpack.packb([int(MessageType.APPEND), 3, fields])) == (3, plain)
    compressed = Append(log_id=1, payloads=(b"blob",), key="k", hops=1, compression=2,
                        records=9)
    assert codec.decode(FrameDecoder().feed(codec.encode(compressed, 4))[0]) == (4, compressed)
    # A version-1 node's STORE (no compression fields) decodes with the defaults.
    payloads = (b"a", b"b")
    store = Store(log_id=1, lsn=2, wave=1, sequencer_node="s", copyset=("n",), timestamp_ms=5,
                  last_known_good=0, release_lsn=0, timeout_ms=9, key=None, payloads=payloads,
                  checksum=payloads_checksum(payloads))
    old = [1, 2, 1, "s", ["n"], 5, 0, 0, 9, None, [b"a", b"b"], store.checksum, 0, []]
    assert codec.decode(msgpack.packb([int(MessageType.STORE), 1, old])) == (1, store)
    assert msgpack.unpackb(codec.encode_fields(store)) == old
    # Too few fields (a version-1 one missing) stays BADMSG; so do fields this build does not
    # know (a compressed batch read as plain would be wrong records).
    assert codec.decode(msgpack.packb([int(MessageType.STORE), 1, old[:13]])) is Status.BADMSG
    longer = [*msgpack.unpackb(codec.encode_fields(
        dataclasses.replace(store, payloads=(b"z",), compression=1, records=2))), "new"]
    assert codec.decode(msgpack.packb([int(MessageType.STORE), 1, longer])) is Status.BADMSG


@settings(max_examples=100, deadline=None)
@given(stores(), st.integers(1, 2), st.integers(1, 1000))
def test_compressed_store_round_trips(store: Store, compression: int, records: int) -> None:
    import dataclasses

    compressed = dataclasses.replace(store, payloads=store.payloads[:1], compression=compression,
                                     records=records,
                                     checksum=payloads_checksum(store.payloads[:1]))
    frames = FrameDecoder().feed(codec.encode(compressed, 1))
    assert codec.decode(frames[0]) == (1, compressed)
    assert compressed.last_lsn == compressed.lsn + records - 1


def test_decoded_messages_stay_immutable_and_complete() -> None:
    # Decoders build messages without the dataclass __init__ (cheaper): every slot is still
    # set (local-only fields to their defaults) and the message is still frozen.
    payloads = (b"a", b"bc")
    store = Store(log_id=1, lsn=2, wave=1, sequencer_node="s", copyset=("x",), timestamp_ms=3,
                  last_known_good=0, release_lsn=1, timeout_ms=10, key=None, payloads=payloads,
                  checksum=payloads_checksum(payloads))
    for message in (store, Stored(log_id=1, lsn=2, wave=3, status=Status.OK, sealed_epoch=4,
                                  sealed_by=None)):
        decoded = codec.decode(FrameDecoder().feed(codec.encode(message, 5))[0])
        assert isinstance(decoded, tuple)
        copy = decoded[1]
        assert type(copy) is type(message)
        for field in dataclasses.fields(message):
            getattr(copy, field.name)  # set, or AttributeError
        assert dataclasses.replace(copy) == message
        try:
            copy.lsn = 99  # type: ignore[misc]
        except dataclasses.FrozenInstanceError:
            pass
        else:
            raise AssertionError("a decoded message must stay frozen")


@given(st.lists(st.sampled_from([0, 1, 7, 40, 64, 65, 300, 5000]), max_size=30),
       st.lists(st.integers(min_value=0, max_value=6000), max_size=40), st.randoms())
def test_frames_split_anywhere_come_out_whole(sizes: list[int], cuts: list[int],
                                              rng: random.Random) -> None:
    """Frames cut into reads at any points, big ones gathered across reads and small ones out
    of the buffer, come out exactly as sent, in order."""
    bodies = [rng.randbytes(size) for size in sizes]
    stream = b"".join(frame(body) for body in bodies)
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    decoder = FrameDecoder(big_frame_bytes_min=64)
    out: list[bytes] = []
    for start, end in itertools.pairwise(points):
        out += decoder.feed(stream[start:end])
    assert out == bodies


def test_a_big_frame_over_the_limit_is_refused_before_gathering() -> None:
    decoder = FrameDecoder(frame_bytes_max=1000, big_frame_bytes_min=64)
    assert decoder.feed(frame(b"x" * 500)[:100]) == []
    assert decoder.feed(frame(b"x" * 500)[100:] + frame(b"y" * 70)[:10]) == [b"x" * 500]
    assert decoder.feed(frame(b"y" * 70)[10:]) == [b"y" * 70]
    try:
        decoder.feed(b"\x00\x00\x10\x00")
    except FrameTooBig:
        return
    raise AssertionError("FrameTooBig not raised")
