"""Binary clients on a node's data port (docs/PROTOCOL.md): a ``client.*`` peer that announced
protocol version 2 may send APPEND; answers come by correlation id in any order; past the
connection's in-flight bound the server answers OVERLOADED itself (the handler never sees the
append, so nothing is written); a client may not claim forwarding hops nor send node-only
messages (the connection closes before the handler sees them)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from shared.config import TransportConfig
from shared.net import ReplyFn
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import Message, decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.gossip import Gossip
from shared.wire.hello import PROTOCOL_VERSION, Hello, HelloReply
from shared.wire.read import Read
from shared.wire.recovery import Seal
from tests.unit.net.transport_helpers import FINGERPRINT, SERVER_ID, serve, store, wait_until

CLIENT = NodeId("client.test-1")
GOSSIP = Gossip(sender=NodeId("n1"), instance_id=1, sent_wall_ms=1, node_ids=(NodeId("n1"),),
                heartbeats=(0,), instance_ids=(1,), failover=(False,))
READ = Read(log_id=LogId(1), from_lsn=Lsn(1), until_lsn=Lsn(10), release_lsn=Lsn(0),
            records_max=10, bytes_max=1000)


def append(log_id: int = 1, *, hops: int = 0, payload: bytes = b"x") -> Append:
    return Append(log_id=LogId(log_id), payloads=(payload,), key=None, hops=hops)


def appended(message: Append, lsn: int) -> Appended:
    return Appended(status=Status.OK, log_id=message.log_id, first_lsn=Lsn(lsn),
                    last_lsn=Lsn(lsn), timestamp_ms=1, sequencer_node=SERVER_ID, message="")


@dataclass
class AppendHandler:
    """Holds every APPEND until the test answers it."""

    received: list[tuple[NodeId, Message]] = field(default_factory=list)
    held: list[tuple[Append, ReplyFn]] = field(default_factory=list)

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        self.received.append((peer, message))
        if isinstance(message, Append):
            self.held.append((message, reply))


class RawClient:
    """A hand-driven data-port connection: HELLO, then frames in and out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()
        self.frames: list[bytes] = []

    @classmethod
    async def connect(cls, port: int, *, version: int = PROTOCOL_VERSION,
                      node_id: NodeId = CLIENT) -> tuple[RawClient, HelloReply]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        client.send(Hello(node_id=node_id, protocol_version=version,
                          cluster_fingerprint=FINGERPRINT), 0)
        _, reply = await client.recv()
        assert isinstance(reply, HelloReply)
        return client, reply

    def send(self, message: Message, correlation_id: int) -> None:
        self.writer.write(encode(message, correlation_id))

    async def recv(self, timeout_s: float = 5.0) -> tuple[int, Message]:
        async with asyncio.timeout(timeout_s):
            while not self.frames:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionResetError("closed by the node")
                self.frames.extend(self.decoder.feed(data))
        decoded = decode(self.frames.pop(0))
        assert not isinstance(decoded, Status)
        return decoded

    async def closed_by_node(self, timeout_s: float = 5.0) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    data = await self.reader.read(65536)
                    if not data:
                        return True
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.writer.close()


async def test_a_client_appends_and_gets_answers_by_correlation_id_in_any_order() -> None:
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    client, hello = await RawClient.connect(server.port)
    try:
        assert hello.status is Status.OK
        for cid in (11, 12, 13):
            client.send(append(payload=b"%d" % cid), cid)
        await wait_until(lambda: len(handler.held) == 3)
        assert {peer for peer, _ in handler.received} == {CLIENT}
        for lsn, (message, reply) in enumerate(reversed(handler.held), start=1):
            reply(appended(message, lsn))
        answers = dict([await client.recv() for _ in range(3)])
        assert {cid: a.first_lsn for cid, a in answers.items()  # type: ignore[union-attr]
                } == {13: 1, 12: 2, 11: 3}
    finally:
        client.close()
        await server.close()


async def test_past_the_in_flight_bound_the_node_answers_overloaded_and_writes_nothing(
) -> None:
    handler = AppendHandler()
    config = TransportConfig(connect_timeout_ms=2_000, client_appends_inflight_max=2)
    server = await serve(handler, config=config)  # type: ignore[arg-type]
    client, _ = await RawClient.connect(server.port)
    try:
        for cid in (1, 2, 3):
            client.send(append(), cid)
        cid, answer = await client.recv()
        assert cid == 3 and isinstance(answer, Appended)
        assert answer.status is Status.OVERLOADED
        assert len(handler.held) == 2  # the third never reached the handler
        message, reply = handler.held.pop(0)
        reply(appended(message, 1))
        assert (await client.recv())[0] == 1
        client.send(append(), 4)  # a place is free again
        await wait_until(lambda: len(handler.held) == 2)
        assert [m for _, m in handler.received].count(append()) == 3
    finally:
        client.close()
        await server.close()


@pytest.mark.parametrize("message", [
    store(1),
    append(hops=1),
    Seal(log_id=LogId(1), seal_epoch=Epoch(2), sealed_by=NodeId("n1"), from_epoch=Epoch(1)),
    GOSSIP,
], ids=["store", "forged-hops", "seal", "gossip"])
async def test_node_only_messages_and_forged_hops_close_a_client_connection(
        message: Message) -> None:
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    client, _ = await RawClient.connect(server.port)
    try:
        client.send(message, 5)
        assert await client.closed_by_node()
        assert handler.received == []
        assert server.counters.desyncs == 1
    finally:
        client.close()
        await server.close()


async def test_a_version_1_client_may_read_but_not_append() -> None:
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    client, hello = await RawClient.connect(server.port, version=1)
    try:
        assert hello.status is Status.OK
        client.send(READ, 1)
        client.send(append(), 2)
        assert await client.closed_by_node()
        assert [type(m) for _, m in handler.received] == [Read]
    finally:
        client.close()
        await server.close()


async def test_versions_outside_the_supported_range_are_refused() -> None:
    server = await serve(AppendHandler())  # type: ignore[arg-type]
    try:
        for version in (0, PROTOCOL_VERSION + 1):
            client, hello = await RawClient.connect(server.port, version=version)
            assert hello.status is Status.PROTONOSUPPORT
            assert await client.closed_by_node()
            client.close()
        node, hello = await RawClient.connect(server.port, version=1, node_id=NodeId("n9"))
        assert hello.status is Status.OK  # nodes announce version 1 to each other
        node.close()
    finally:
        await server.close()


def test_extension_fields_stay_off_the_wire_at_their_defaults() -> None:
    """A version 1 peer gets frames it can decode: no trailing extension fields."""
    import msgpack

    plain = append()
    body = FrameDecoder().feed(encode(plain, 1))[0]
    assert len(msgpack.unpackb(body)[2]) == 6
    assert decode(body) == (1, plain)
    asked = Append(log_id=LogId(1), payloads=(b"x",), key=None, hops=0, no_forward=True)
    body = FrameDecoder().feed(encode(asked, 1))[0]
    # compression and records (at their defaults) go before no_forward.
    assert len(msgpack.unpackb(body)[2]) == 9 and decode(body) == (1, asked)
    # A field this build does not know is refused, not dropped (it could change what the
    # others mean); a missing version-1 field is refused too.
    fields = [*msgpack.unpackb(body)[2], "future"]
    assert decode(msgpack.packb([10, 1, fields])) is Status.BADMSG
    assert decode(msgpack.packb([10, 1, fields[:5]])) is Status.BADMSG



async def test_reads_past_the_in_flight_bound_are_answered_overloaded() -> None:
    """Long-poll reads hold memory on the node: a connection may hold as many unanswered as
    appends, and one more is refused at once without reaching the handler."""
    handler = AppendHandler()
    config = TransportConfig(connect_timeout_ms=2_000, client_appends_inflight_max=2)
    server = await serve(handler, config=config)  # type: ignore[arg-type]
    client, _ = await RawClient.connect(server.port)
    try:
        for cid in (1, 2, 3):
            client.send(READ, cid)
        cid, answer = await client.recv()
        assert cid == 3 and answer.status is Status.OVERLOADED  # type: ignore[union-attr]
        await wait_until(lambda: len(handler.received) == 2)
        assert [m for _, m in handler.received] == [READ, READ]
    finally:
        client.close()
        await server.close()
