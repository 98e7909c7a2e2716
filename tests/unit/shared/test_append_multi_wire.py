"""APPEND_MULTI and APPENDED_MULTI on the wire (shared/wire/append_multi.py): round trips,
the element checks of both (``append_multi_entries``, ``appended_multi_answers``), and
malformed input answered with None or BADMSG, never an exception."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire import codec
from shared.wire.append import Append, Appended
from shared.wire.append_multi import (
    APPEND_MULTI_ENTRIES_MAX,
    AppendedMulti,
    AppendMulti,
    append_multi_entries,
    appended_multi_answers,
    entry_append,
    ok_answer,
    other_answer,
)
from shared.wire.framing import FrameDecoder
from shared.wire.message_type import MessageType

_entries = st.lists(st.tuples(
    st.integers(0, 2**64 - 1),
    st.lists(st.binary(max_size=20), max_size=4).map(tuple),
    st.none() | st.text(max_size=10)), min_size=1, max_size=8)


def body_of(frame: bytes) -> bytes:
    [body] = FrameDecoder().feed(frame)
    return body


@settings(max_examples=100, deadline=None)
@given(_entries, st.integers(1, 2**32))
def test_append_multi_round_trips_and_its_entries_check(
        entries: list[tuple[int, tuple[bytes, ...], str | None]], correlation_id: int) -> None:
    message = AppendMulti(appends=tuple(entries))
    decoded = codec.decode(body_of(codec.encode(message, correlation_id)))
    assert decoded == (correlation_id, message)
    assert isinstance(decoded, tuple) and isinstance(decoded[1], AppendMulti)
    assert append_multi_entries(decoded[1]) == entries


def test_append_multi_entries_refuses_bad_shapes() -> None:
    good = (1, (b"x",), None)
    assert append_multi_entries(AppendMulti(appends=(good,))) == [good]
    for bad in [(), ((1, (b"x",)),), ((1, [b"x"], None),), (("1", (b"x",), None),),
                ((1, ("x",), None),), ((1, (b"x",), 5),), ([1, (b"x",), None],),
                (good,) * (APPEND_MULTI_ENTRIES_MAX + 1)]:
        assert append_multi_entries(AppendMulti(appends=bad)) is None  # type: ignore[arg-type]


_anything = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.binary(max_size=8)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_anything)
def test_any_append_multi_frame_decodes_to_a_message_or_badmsg_and_checks_without_raising(
        fields: Any) -> None:
    body = msgpack.packb([int(MessageType.APPEND_MULTI), 7, [fields]])
    decoded = codec.decode(body)
    if isinstance(decoded, Status):
        assert decoded is Status.BADMSG
        return
    _, message = decoded
    assert isinstance(message, AppendMulti)
    entries = append_multi_entries(message)
    assert entries is None or all(type(e[0]) is int for e in entries)


@settings(max_examples=300, deadline=None)
@given(st.none() | st.text(max_size=8), _anything,
       st.lists(st.tuples(st.integers(1, 2**62), st.integers(1, 5)), min_size=0, max_size=5))
def test_any_appended_multi_frame_decodes_and_fits_or_is_refused_without_raising(
        node: Any, answers: Any, shape: list[tuple[int, int]]) -> None:
    body = msgpack.packb([int(MessageType.APPENDED_MULTI), 7, [node, answers]])
    decoded = codec.decode(body)
    if isinstance(decoded, Status):
        assert decoded is Status.BADMSG
        return
    _, message = decoded
    assert isinstance(message, AppendedMulti)
    results = appended_multi_answers(message, [(LogId(a), b) for a, b in shape])
    assert results is None or len(results) == len(shape)


def test_appended_multi_answers_stand_for_the_appendeds_they_replace() -> None:
    refused = Appended(status=Status.NOSEQUENCER, log_id=LogId(8), first_lsn=Lsn(0),
                       last_lsn=Lsn(0), timestamp_ms=0, sequencer_node=NodeId("seq2"),
                       message="not here", redirect_data="127.0.0.1:7000", retry_after_ms=0)
    reply = AppendedMulti(sequencer_node=NodeId("seq1"),
                          answers=(ok_answer(100, 5), other_answer(refused)))
    decoded = codec.decode(body_of(codec.encode(reply, 3)))
    assert decoded == (3, reply)
    assert isinstance(decoded, tuple) and isinstance(decoded[1], AppendedMulti)
    results = appended_multi_answers(decoded[1], [(LogId(7), 3), (LogId(8), 1)])
    assert results == [
        Appended(status=Status.OK, log_id=LogId(7), first_lsn=Lsn(100), last_lsn=Lsn(102),
                 timestamp_ms=5, sequencer_node=NodeId("seq1"), message=""),
        refused]
    # Not fitting the request: wrong length, a bad LSN, an unknown status.
    assert appended_multi_answers(decoded[1], [(LogId(7), 3)]) is None
    for bad in [(0, 0, 5), (0, 100), (9999, None, "", None, 0), (int(Status.OK), -1, 5),
                (int(Status.NOSEQUENCER), 5, "", None, 0), ()]:
        assert appended_multi_answers(
            AppendedMulti(sequencer_node=None, answers=(bad,)), [(LogId(7), 1)]) is None


def test_an_entry_stands_for_an_append_with_no_hops_and_no_forward() -> None:
    assert entry_append(LogId(7), (b"a",), "k") == Append(
        log_id=LogId(7), payloads=(b"a",), key="k", hops=0, no_forward=True)
