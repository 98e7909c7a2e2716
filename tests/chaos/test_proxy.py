"""The per-link TCP proxy of the chaos suite, against a local echo server: pass, delay, drop,
blackhole (and what healing does to connections that lost bytes), a dead target, and the
proxy process driven over its stdin."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.chaos.proxy import LinkMode, LinkProxy, ProxyProcess

ROOT = Path(__file__).resolve().parents[2]
IO_TIMEOUT_S = 5.0
SILENCE_S = 0.3
"""How long a blackholed echo must stay unanswered: proving an absence needs some window."""

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


@pytest.fixture
async def link(echo_port: int) -> AsyncIterator[LinkProxy]:
    proxy = LinkProxy("a>b", "127.0.0.1", echo_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def _connect(port: int) -> Conn:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), IO_TIMEOUT_S)


async def _echo(conn: Conn, data: bytes) -> bytes:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), IO_TIMEOUT_S)


async def _is_cut(conn: Conn) -> bool:
    """True once the proxy closed or reset the connection (bounded wait)."""
    reader, _ = conn
    try:
        return await asyncio.wait_for(reader.read(100), IO_TIMEOUT_S) == b""
    except ConnectionError:
        return True


async def _silent(conn: Conn, data: bytes) -> bool:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    try:
        await asyncio.wait_for(reader.read(100), SILENCE_S)
    except TimeoutError:
        return True
    return False


async def _wait_until(predicate: object, what: str) -> None:
    deadline = time.monotonic() + IO_TIMEOUT_S
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_pass_forwards_both_ways(link: LinkProxy) -> None:
    conn = await _connect(link.port)
    assert await _echo(conn, b"hello") == b"hello"
    assert await _echo(conn, b"x" * 200_000) == b"x" * 200_000
    assert link.stats.connections_accepted == 1
    assert link.stats.bytes_forwarded == 2 * 200_005
    conn[1].close()


async def test_delay_holds_every_chunk_in_order(link: LinkProxy) -> None:
    conn = await _connect(link.port)
    await _echo(conn, b"warm")
    link.set_mode(LinkMode("delay", 100))
    start = time.monotonic()
    reader, writer = conn
    for i in range(5):
        writer.write(b"%d," % i)
    await writer.drain()
    got = b""
    while len(got) < 10:
        got += await asyncio.wait_for(reader.read(100), IO_TIMEOUT_S)
    assert got == b"0,1,2,3,4,"
    assert time.monotonic() - start >= 0.2  # once each way
    link.set_mode(LinkMode("pass"))
    assert await _echo(conn, b"fast") == b"fast"
    writer.close()


async def test_drop_resets_open_connections_and_refuses_new_ones(link: LinkProxy) -> None:
    conn = await _connect(link.port)
    await _echo(conn, b"before")
    link.set_mode(LinkMode("drop"))
    assert await _is_cut(conn)
    later = await _connect(link.port)
    assert await _is_cut(later)
    assert link.stats.connections_aborted == 2
    link.set_mode(LinkMode("pass"))
    healed = await _connect(link.port)
    assert await _echo(healed, b"after") == b"after"
    healed[1].close()


async def test_blackhole_swallows_and_healing_cuts_the_damaged_streams(
        link: LinkProxy) -> None:
    old = await _connect(link.port)
    await _echo(old, b"before")
    link.set_mode(LinkMode("blackhole"))
    assert await _silent(old, b"lost")
    during = await _connect(link.port)  # accepted, never forwarded
    assert await _silent(during, b"also lost")
    await _wait_until(lambda: link.stats.bytes_blackholed >= len(b"lostalso lost"),
                      "the proxy to read the swallowed bytes")
    link.set_mode(LinkMode("pass"))
    # A stream with a hole must not resume: both are cut, and new connections work.
    assert await _is_cut(old)
    assert await _is_cut(during)
    fresh = await _connect(link.port)
    assert await _echo(fresh, b"fresh") == b"fresh"
    fresh[1].close()


async def test_untouched_connection_survives_a_blackhole(link: LinkProxy) -> None:
    conn = await _connect(link.port)
    await _echo(conn, b"idle")
    link.set_mode(LinkMode("blackhole"))
    link.set_mode(LinkMode("pass"))
    assert await _echo(conn, b"still here") == b"still here"
    conn[1].close()


async def test_a_dead_target_closes_the_client_connection() -> None:
    proxy = LinkProxy("a>dead", "127.0.0.1", 1)  # nothing listens on port 1
    await proxy.start()
    try:
        conn = await _connect(proxy.port)
        assert await _is_cut(conn)
    finally:
        await proxy.close()


async def test_proxy_process_is_driven_over_stdin(echo_port: int) -> None:
    proxy = await ProxyProcess.start(str(ROOT))
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            chosen = sock.getsockname()[1]
        ports = await proxy.add_links({"a>b": ("127.0.0.1", echo_port),
                                       "b>a": ("127.0.0.1", echo_port)}, {"b>a": chosen})
        assert ports["b>a"] == chosen and ports["a>b"] not in (0, chosen)
        conn = await _connect(ports["a>b"])
        assert await _echo(conn, b"via process") == b"via process"
        await proxy.set_mode(["a>b"], LinkMode("blackhole"))
        assert await _silent(conn, b"gone")
        await proxy.set_mode(["a>b"], LinkMode("delay", 20))
        assert await _is_cut(conn)
        stats = await proxy.stats()
        assert stats["a>b"]["mode"] == "delay" and stats["a>b"]["delay_ms"] == 20
        assert stats["a>b"]["bytes_forwarded"] == 2 * len(b"via process")
        assert stats["b>a"]["connections_accepted"] == 0
        with pytest.raises(RuntimeError, match="unknown links"):
            await proxy.set_mode(["x>y"], LinkMode("drop"))
        with pytest.raises(RuntimeError, match="unknown link mode"):
            await proxy.request({"op": "set", "links": ["a>b"], "mode": "flaky"})
    finally:
        await proxy.close()
