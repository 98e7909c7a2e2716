"""The binary client protocol (docs/PROTOCOL.md) on real node processes: ``seqlog.Client``
appends over it across both sequencer nodes; a node that does not own a log forwards a client's
APPEND, or with ``no_forward`` names the owner's data address and writes nothing; and a fuzz
run of hostile input on a node's data port (truncated frames, wrong types, huge lengths,
unknown message types, node-only messages, forged hops) gets clear answers or a closed
connection, with the node serving appends after every case."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seqlog_cluster_support import RunningCluster

from seqlog import Client
from seqlog.binary import Connections, client_id
from shared.limits import FRAME_BYTES_MAX
from shared.routing import sequencer_for
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import Message, decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.hello import PROTOCOL_VERSION, Hello, HelloReply
from shared.wire.message_type import MessageType
from shared.wire.recovery import GetDigest, Seal
from shared.wire.release import Release
from shared.wire.store import Store, payloads_checksum

pytestmark = pytest.mark.integration

ANSWER_TIMEOUT_S = 5.0


async def _cluster_view(urls: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """(fingerprint, data address by node id, sequencer node ids) from GET /v1/cluster."""
    async with Client(urls, protocol="http") as client:
        info = await client.cluster()
    data = {n.node_id: n.data for n in info.nodes}
    sequencers = [n.node_id for n in info.nodes if "sequencer" in n.roles]
    assert info.cluster_fingerprint and all(data.values())
    return info.cluster_fingerprint, data, sequencers


async def _request(connections: Connections, address: str, message: Append) -> Message | Status:
    conn = await connections.get(address)
    answer: asyncio.Future[Message | Status] = asyncio.get_running_loop().create_future()
    conn.request(message, answer.set_result)
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        return await answer


async def test_client_appends_over_the_binary_protocol_across_nodes(
        local_cluster: RunningCluster) -> None:
    logs = range(2001, 2013)
    async with Client(local_cluster.sequencer_urls) as client:
        singles = {log: [await client.append(log, b"%d-%d" % (log, i)) for i in range(3)]
                   for log in logs}
        batches = {log: await client.append_batch(log, [b"b%d" % i for i in range(4)],
                                                  key="k") for log in logs}
        futures = [client.append_future(log, b"f%d" % log) for log in logs]
        tails = [(await f).lsn for f in futures]
        assert client.protocol == "binary"
        owners = set()
        for log, tail in zip(logs, tails, strict=True):
            lsns = [r.lsn for r in singles[log]]
            batch = batches[log]
            assert lsns == sorted(lsns) and batch.first_lsn > lsns[-1] and batch.count == 4
            assert batch.last_lsn == batch.first_lsn + 3 and tail == batch.last_lsn + 1
            result = await client.read(log, lsns[0], wait_ms=2_000)
            assert [r.payload for r in result.records] == [
                *(b"%d-%d" % (log, i) for i in range(3)), *(b"b%d" % i for i in range(4)),
                b"f%d" % log]
            owners.add((await client.tail(log)).sequencer)
    assert len(owners) == 2, owners  # both sequencer nodes took binary appends


async def test_a_non_owner_forwards_or_redirects_to_the_owners_data_address(
        local_cluster: RunningCluster) -> None:
    fingerprint, data, sequencers = await _cluster_view(local_cluster.sequencer_urls)
    connections = Connections(cluster_fingerprint=fingerprint, connect_timeout_ms=2_000,
                              timeout_ms=10_000)
    try:
        log = LogId(2101)
        owner = sequencer_for(log, [(NodeId(n), 1.0) for n in sequencers])
        assert owner is not None
        other = next(n for n in sequencers if n != owner)
        redirect = await _request(connections, data[other], Append(
            log_id=log, payloads=(b"r",), key=None, hops=0, no_forward=True))
        assert isinstance(redirect, Appended), redirect
        assert (redirect.status, redirect.sequencer_node, redirect.redirect_data) == (
            Status.NOSEQUENCER, owner, data[owner])
        first = await _request(connections, data[owner], Append(
            log_id=log, payloads=(b"first",), key=None, hops=0, no_forward=True))
        assert isinstance(first, Appended) and first.status is Status.OK
        assert first.first_lsn & 0xFFFFFFFF == 1  # the redirect wrote nothing
        forwarded = await _request(connections, data[other], Append(
            log_id=log, payloads=(b"fwd",), key=None, hops=0))
        assert isinstance(forwarded, Appended) and forwarded.status is Status.OK
        assert forwarded.sequencer_node == owner and forwarded.first_lsn == first.first_lsn + 1
    finally:
        await connections.close()


# ---- fuzzing a node's data port ----------------------------------------------------------

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


def _connect_and_hello(port: int, fingerprint: str) -> tuple[socket.socket, FrameDecoder]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
    sock.sendall(encode(Hello(node_id=client_id(), protocol_version=PROTOCOL_VERSION,
                              cluster_fingerprint=fingerprint)))
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


def _append_works(port: int, fingerprint: str) -> None:
    sock, decoder = _connect_and_hello(port, fingerprint)
    try:
        sock.sendall(encode(Append(log_id=LogId(FUZZ_LOG), payloads=(b"ok",), key=None,
                                   hops=0), 1))
        decoded = decode(_read_frames(sock, decoder, 1)[0])
        assert not isinstance(decoded, Status)
        assert isinstance(decoded[1], Appended) and decoded[1].status is Status.OK, decoded
    finally:
        sock.close()


def test_hostile_input_on_the_data_port_gets_clear_errors_and_the_node_stays_healthy(
        local_cluster: RunningCluster) -> None:
    fingerprint, data, sequencers = asyncio.run(_cluster_view(local_cluster.sequencer_urls))
    port = int(data[sequencers[0]].rpartition(":")[2])
    _append_works(port, fingerprint)  # activates the log before the clock starts

    @settings(max_examples=120, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(hostile())
    def check(case: tuple[str, bytes]) -> None:
        expectation, payload = case
        sock, decoder = _connect_and_hello(port, fingerprint)
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
                assert not isinstance(decode(frame), Status)  # whatever it said is readable
        finally:
            sock.close()
        _append_works(port, fingerprint)

    check()
