"""Transport failure handling over real TCP on 127.0.0.1: dead peers and backoff, servers dying
mid-flight, refused HELLOs, desynced streams, shutdown and peers that stop reading."""

from __future__ import annotations

import asyncio
import time

import pytest

from shared.config import TransportConfig
from shared.net import PeerPool, ReplyFn, Server, start_server
from shared.net import pool as pool_module
from shared.status import Status
from shared.types import NodeId
from shared.wire.codec import Message, decode, encode
from shared.wire.framing import HEADER_BYTES, frame
from shared.wire.hello import PROTOCOL_VERSION, Hello, HelloReply
from shared.wire.store import Store
from tests.unit.net.transport_helpers import (
    CLIENT_ID,
    CONFIG,
    FINGERPRINT,
    SERVER_ID,
    Handler,
    Results,
    ScriptedServer,
    close_writer,
    free_port,
    make_pool,
    serve,
    store,
    stored,
    wait_until,
)


async def test_dead_peer_fails_fast_then_succeeds_once_it_starts(
        handler: Handler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "RECONNECT_BACKOFF_MS_MIN", 300)
    port = free_port()
    pool = make_pool(port, config=TransportConfig(reconnect_backoff_ms_max=300))
    try:
        started = time.monotonic()
        assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == Status.CONNFAILED
        assert time.monotonic() - started < 0.5
        assert pool.counters.connect_failures == 1

        # Inside the backoff, requests fail without another connect attempt.
        assert await pool.call(SERVER_ID, store(2), timeout_ms=5_000) == Status.CONNFAILED
        assert not pool.send(SERVER_ID, store(3))
        assert pool.counters.connect_failures == 1

        server = await serve(handler, port=port)
        try:
            deadline = time.monotonic() + 5
            while (result := await pool.call(SERVER_ID, store(4), timeout_ms=5_000)) != stored(4):
                assert result == Status.CONNFAILED
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert pool.connected(SERVER_ID)
        finally:
            await server.close()
    finally:
        await pool.close()


async def test_server_killed_mid_flight_fails_pending_with_peer_closed(
        handler: Handler, server: Server, pool: PeerPool) -> None:
    handler.hold = True
    results = Results()
    for lsn in range(1, 11):
        pool.request(SERVER_ID, store(lsn), results.callback(lsn))
    await wait_until(lambda: len(handler.held) == 10)

    await server.close()
    await wait_until(lambda: len(results.by_key) == 10)

    # They were sent: the server may have acted on them, so the outcome is unknown.
    assert set(results.by_key.values()) == {Status.PEER_CLOSED}
    assert not pool.connected(SERVER_ID)
    handler.reply_held()  # replies after the connection closed are dropped quietly


async def test_bad_fingerprint_is_refused(handler: Handler, server: Server) -> None:
    pool = make_pool(server.port, fingerprint="other-cluster")
    try:
        assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == Status.PROTONOSUPPORT
        assert await pool.call(SERVER_ID, store(2), timeout_ms=5_000) == Status.PROTONOSUPPORT
        assert handler.received == []
        assert not pool.connected(SERVER_ID)
        assert pool.counters.connect_failures == 1
    finally:
        await pool.close()


async def _raw_connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _read_frame(reader: asyncio.StreamReader) -> object:
    async with asyncio.timeout(5):
        header = await reader.readexactly(HEADER_BYTES)
        body = await reader.readexactly(int.from_bytes(header, "big"))
    return decode(body)


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(5):
        return await reader.read()


@pytest.mark.parametrize("garbage", [
    b"\xff\xff\xff\xff" + b"x" * 64,                       # length over FRAME_BYTES_MAX
    frame(b"\x93\x01\x00\x92\x01\x02"),                    # HELLO with the wrong field count
    frame(b"not msgpack at all"),
])
async def test_garbage_closes_the_connection_and_others_keep_working(
        handler: Handler, server: Server, pool: PeerPool, garbage: bytes) -> None:
    reader, writer = await _raw_connect(server.port)
    writer.write(garbage)
    assert await _read_until_closed(reader) == b""
    await close_writer(writer)

    assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == stored(1)
    assert server.counters.desyncs == 1


async def test_garbage_after_hello_closes_only_that_connection(
        handler: Handler, server: Server, pool: PeerPool) -> None:
    assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == stored(1)
    reader, writer = await _raw_connect(server.port)
    hello = Hello(node_id=CLIENT_ID, protocol_version=PROTOCOL_VERSION,
                  cluster_fingerprint=FINGERPRINT)
    writer.write(encode(hello))
    assert await _read_frame(reader) == (0, HelloReply(status=Status.OK, node_id=SERVER_ID))
    writer.write(frame(b"\xc1"))
    assert await _read_until_closed(reader) == b""
    await close_writer(writer)

    assert await pool.call(SERVER_ID, store(2), timeout_ms=5_000) == stored(2)
    assert pool.counters.connects == 1


async def test_first_frame_must_be_hello(handler: Handler, server: Server) -> None:
    reader, writer = await _raw_connect(server.port)
    writer.write(encode(store(1), 5))
    assert await _read_until_closed(reader) == b""
    await close_writer(writer)
    assert handler.received == []


async def test_unknown_correlation_id_desyncs_the_client() -> None:
    """A server that answers with a correlation id nobody asked for."""

    async def serve_confused(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_frame(reader)  # HELLO
        writer.write(encode(HelloReply(status=Status.OK, node_id=SERVER_ID)))
        await _read_frame(reader)  # the request
        writer.write(encode(stored(1), 999_999))
        await reader.read()

    async with ScriptedServer(serve_confused) as port:
        pool = make_pool(port)
        try:
            assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == Status.BADMSG
            assert pool.counters.desyncs == 1
            assert not pool.connected(SERVER_ID)
        finally:
            await pool.close()


async def test_wrong_node_behind_the_address_is_not_used(handler: Handler) -> None:
    server = await start_other_node(handler)
    pool = make_pool(server.port)
    try:
        assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == Status.CONNFAILED
        assert handler.received == []
    finally:
        await pool.close()
        await server.close()


async def start_other_node(handler: Handler) -> Server:
    return await start_server("127.0.0.1", 0, node_id=NodeId("s2"),
                              cluster_fingerprint=FINGERPRINT, handler=handler, config=CONFIG)


async def test_close_fails_pending_with_shutdown(handler: Handler, pool: PeerPool) -> None:
    handler.hold = True
    results = Results()
    pool.request(SERVER_ID, store(1), results.callback("sent"))
    await wait_until(lambda: len(handler.held) == 1)
    pool.request(SERVER_ID, store(2), results.callback("queued"))

    await pool.close()

    assert results.by_key == {"sent": Status.SHUTDOWN, "queued": Status.SHUTDOWN}
    pool.request(SERVER_ID, store(3), results.callback("after"))
    assert "after" not in results.by_key
    await wait_until(lambda: "after" in results.by_key)
    assert results.by_key["after"] == Status.SHUTDOWN
    assert not pool.send(SERVER_ID, store(4))


async def test_close_while_connecting_fails_queued_requests(handler: Handler,
                                                            server: Server) -> None:
    pool = make_pool(server.port)
    results = Results()
    pool.request(SERVER_ID, store(1), results.callback(1))
    await pool.close()
    assert results.by_key == {1: Status.SHUTDOWN}


async def test_peer_that_stops_reading_gets_overloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames pile up for a peer that never reads; past the output limit requests are refused
    instead of growing our buffer."""
    monkeypatch.setattr(pool_module, "OUTPUT_BUFFER_BYTES_MAX", 1024 * 1024)
    stalled = asyncio.Event()

    async def serve_stalled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_frame(reader)
        writer.write(encode(HelloReply(status=Status.OK, node_id=SERVER_ID)))
        await stalled.wait()

    async with ScriptedServer(serve_stalled) as port:
        pool = make_pool(port)
        try:
            assert await pool.call(SERVER_ID, store(0), timeout_ms=50) == Status.TIMEDOUT
            results = Results()
            for lsn in range(1, 2000):
                pool.request(SERVER_ID, store(lsn, b"z" * 64 * 1024), results.callback(lsn))
                await asyncio.sleep(0)
                if Status.OVERLOADED in results.by_key.values():
                    break
            assert Status.OVERLOADED in results.by_key.values()
        finally:
            stalled.set()
            await pool.close()


async def test_silent_connection_is_dropped_after_the_hello_timeout(handler: Handler) -> None:
    server = await serve(handler, config=TransportConfig(connect_timeout_ms=50))
    try:
        reader, writer = await _raw_connect(server.port)
        assert await _read_until_closed(reader) == b""
        await close_writer(writer)
        await wait_until(lambda: server.connection_count == 0)
    finally:
        await server.close()


class _Exploding(Handler):
    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        if isinstance(message, Store) and message.lsn == 13:
            raise RuntimeError("handler bug")
        super().on_message(peer, message, reply)


async def test_handler_exception_fails_that_connection_not_the_server() -> None:
    server = await serve(_Exploding())
    pool = make_pool(server.port)
    try:
        assert await pool.call(SERVER_ID, store(1), timeout_ms=5_000) == stored(1)
        assert await pool.call(SERVER_ID, store(13), timeout_ms=5_000) == Status.PEER_CLOSED
        assert await pool.call(SERVER_ID, store(2), timeout_ms=5_000) == stored(2)
    finally:
        await pool.close()
        await server.close()


async def test_a_failing_callback_does_not_hurt_other_requests(handler: Handler,
                                                               pool: PeerPool) -> None:
    def explode(result: Message | Status) -> None:
        raise RuntimeError("caller bug")

    results = Results()
    pool.request(SERVER_ID, store(1), explode)
    pool.request(SERVER_ID, store(2), results.callback(2))
    await wait_until(lambda: 2 in results.by_key)
    assert results.by_key[2] == stored(2)
    assert pool.connected(SERVER_ID)
    assert await pool.call(SERVER_ID, store(3), timeout_ms=5_000) == stored(3)
