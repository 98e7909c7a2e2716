"""Hostile input for a data port, for the fuzz tests of the binary protocol (unit: the
transport server; integration: a real node): after a good HELLO, bytes that are garbage,
truncated, oversized, of unknown message types, node-only messages, APPENDs with wrong field
types, forged hops or values out of range, each with what the node must do about it."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import msgpack
from hypothesis import strategies as st

from shared.limits import FRAME_BYTES_MAX
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.hello import PROTOCOL_VERSION, Hello, HelloReply
from shared.wire.message_type import MessageType
from shared.wire.recovery import GetDigest, Seal
from shared.wire.release import Release
from shared.wire.store import Store, payloads_checksum

CLIENT_ID = NodeId("client.fuzzer")

ANSWER_TIMEOUT_S = 5.0
FUZZ_LOG = 2201
_PAYLOADS = (b"p",)
NODE_ONLY: list[Any] = [
    Store(log_id=LogId(FUZZ_LOG), lsn=Lsn(1), wave=1, sequencer_node=NodeId("seq1"),
          copyset=(NodeId("st1"),), timestamp_ms=0, last_known_good=Esn(0), release_lsn=Lsn(0),
          timeout_ms=1000, key=None, payloads=_PAYLOADS, checksum=payloads_checksum(_PAYLOADS)),
    Seal(log_id=LogId(FUZZ_LOG), seal_epoch=Epoch(99), sealed_by=NodeId("seq1"),
         from_epoch=Epoch(1)),
    Release(log_id=LogId(FUZZ_LOG), release_lsn=Lsn(2**40)),
    GetDigest(log_id=LogId(FUZZ_LOG), epoch=Epoch(1), from_esn=Esn(0), seal_epoch=Epoch(99),
              records_max=10, bytes_max=1000),
]
_UNKNOWN_TYPES = st.integers(-5, 300).filter(lambda t: t not in {int(m) for m in MessageType})
_MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
    | st.binary(max_size=16), lambda inner: st.lists(inner, max_size=4), max_leaves=10)


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@st.composite
def hostile(draw: st.DrawFn) -> tuple[str, bytes]:
    """(expectation, bytes to send after a good HELLO): "close" the node must close the
    connection by itself; "answer" it must answer with an error status; "any" (incomplete
    input) it may wait for more, and must close once we stop sending."""
    kind = draw(st.sampled_from(["garbage", "huge", "truncated", "unknown", "node_only",
                                 "wrong_types", "forged_hops", "bad_values"]))
    good = encode(Append(log_id=LogId(FUZZ_LOG), payloads=(b"x",), key=None, hops=0), 7)
    if kind == "garbage":
        return "any", draw(st.binary(min_size=1, max_size=200))
    if kind == "huge":
        length = draw(st.integers(FRAME_BYTES_MAX + 1, 2**32 - 1))
        return "close", struct.pack(">I", length) + draw(st.binary(max_size=32))
    if kind == "truncated":
        return "any", good[:draw(st.integers(1, len(good) - 1))]
    if kind == "unknown":
        body = msgpack.packb([draw(_UNKNOWN_TYPES), 3, draw(st.lists(_MSGPACK_VALUES,
                                                                     max_size=6))])
        return "close", _frame(body)
    if kind == "node_only":
        return "close", encode(draw(st.sampled_from(NODE_ONLY)), draw(st.integers(0, 9)))
    if kind == "wrong_types":
        fields = draw(st.lists(_MSGPACK_VALUES, max_size=9))
        body = msgpack.packb([int(MessageType.APPEND), 5, fields])
        if decode(body) is not Status.BADMSG:
            return "any", _frame(body)  # happened to be a valid APPEND
        return "close", _frame(body)
    if kind == "forged_hops":
        return "close", encode(Append(log_id=LogId(FUZZ_LOG), payloads=(b"x",), key=None,
                                      hops=draw(st.integers(1, 2**32))), 5)
    bad = draw(st.sampled_from([
        {"log_id": LogId(0)}, {"log_id": LogId(2**62)}, {"payloads": ()},
        {"payloads": (b"x" * (2 * 1024 * 1024),)}, {"key": "k" * 5000},
        {"producer_id": ""}, {"producer_id": "p" * 300},
    ]))
    fields: dict[str, Any] = {"log_id": LogId(FUZZ_LOG), "payloads": (b"x",), "key": None,
                              "hops": 0, **bad}
    return "answer", encode(Append(**fields), 9)


def connect_and_hello(port: int, fingerprint: str, token: str = ""
                      ) -> tuple[socket.socket, FrameDecoder]:
    """``token``: the bearer token of a node with auth on (docs/SECURITY.md)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
    sock.sendall(encode(Hello(node_id=CLIENT_ID, protocol_version=PROTOCOL_VERSION,
                              cluster_fingerprint=fingerprint, token=token)))
    decoder = FrameDecoder()
    frames = _read_frames(sock, decoder, 1)
    decoded = decode(frames[0])
    assert not isinstance(decoded, Status) and isinstance(decoded[1], HelloReply)
    assert decoded[1].status is Status.OK
    return sock, decoder


def _read_frames(sock: socket.socket, decoder: FrameDecoder, count: int) -> list[bytes]:
    frames: list[bytes] = []
    while len(frames) < count:
        data = sock.recv(65536)
        assert data, "closed before answering"
        frames.extend(decoder.feed(data))
    return frames


def _closed(sock: socket.socket, decoder: FrameDecoder) -> list[bytes]:
    """Read until the node closes the connection (bounded); the frames it sent meanwhile."""
    frames: list[bytes] = []
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return frames
        except TimeoutError:
            raise AssertionError("the node kept the connection open") from None
        if not data:
            return frames
        frames.extend(decoder.feed(data))


def append_works(port: int, fingerprint: str, token: str = "") -> None:
    sock, decoder = connect_and_hello(port, fingerprint, token)
    try:
        sock.sendall(encode(Append(log_id=LogId(FUZZ_LOG), payloads=(b"ok",), key=None,
                                   hops=0), 1))
        decoded = decode(_read_frames(sock, decoder, 1)[0])
        assert not isinstance(decoded, Status)
        assert isinstance(decoded[1], Appended) and decoded[1].status is Status.OK, decoded
    finally:
        sock.close()




def check_case(port: int, fingerprint: str, case: tuple[str, bytes], token: str = "") -> None:
    """Send one hostile case on a fresh connection and check the node's reaction: a clear
    error answer ("answer"), or closing the connection, at once ("close") or once we stop
    sending ("any"); whatever it sent must be readable frames."""
    expectation, payload = case
    sock, decoder = connect_and_hello(port, fingerprint, token)
    try:
        sock.sendall(payload)
        if expectation == "answer":
            decoded = decode(_read_frames(sock, decoder, 1)[0])
            assert not isinstance(decoded, Status)
            answer = decoded[1]
            assert isinstance(answer, Appended) and decoded[0] == 9
            assert answer.status in (Status.INVALID_PARAM, Status.BADMSG, Status.TOOBIG)
            assert "nothing written" in answer.message
        if expectation != "close":
            sock.shutdown(socket.SHUT_WR)
        for frame in _closed(sock, decoder):
            assert not isinstance(decode(frame), Status)
    finally:
        sock.close()
