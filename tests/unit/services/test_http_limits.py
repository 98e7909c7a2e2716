"""Connection limits of the lean HTTP edge (docs/SECURITY.md, ``LimitsConfig``): one client
address holds at most ``http_connections_per_ip_max`` connections, the next is answered 503
OVERLOADED (nothing written) and closed; connections handed to aiohttp count until they
close, and not after; a connection that sends nothing is closed at the head deadline."""

from __future__ import annotations

import asyncio

import aiohttp

from shared.config import LimitsConfig
from tests.unit.services.http_fakes import DEADLINE_S, FakeLogService, serve

PER_IP = 4


async def _get(port: int, path: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True)) as session, session.get(
            f"http://127.0.0.1:{port}{path}") as answer:
        return answer.status, await answer.read()


async def test_one_address_holds_at_most_its_bound_and_the_next_gets_503() -> None:
    async with serve(FakeLogService(),
                     limits=LimitsConfig(http_connections_per_ip_max=PER_IP)) as client:
        held = [await asyncio.open_connection("127.0.0.1", client.port) for _ in range(PER_IP)]
        try:
            await asyncio.sleep(0.05)
            status, body = await _get(client.port, "/v1/logs/7/tail")
            assert status == 503 and b"OVERLOADED" in body, body
            _, writer = held.pop()
            writer.close()
            # The node sees the close at once; a client may still race it, so poll briefly.
            for _ in range(100):
                status, _ = await _get(client.port, "/v1/logs/7/tail")
                if status != 503:
                    break
                await asyncio.sleep(0.01)
            assert status == 200
        finally:
            for _, writer in held:
                writer.close()


async def test_connections_handed_to_aiohttp_stop_counting_when_they_close() -> None:
    async with serve(FakeLogService(),
                     limits=LimitsConfig(http_connections_per_ip_max=PER_IP)) as client:
        # /healthz is not a hot route: each of these connections is handed to aiohttp.
        statuses = [(await _get(client.port, "/healthz"))[0] for _ in range(4 * PER_IP)]
        assert statuses == [200] * (4 * PER_IP)


async def test_a_silent_connection_is_closed_at_the_head_deadline() -> None:
    async with serve(FakeLogService(), body_read_timeout_ms=5_000,
                     limits=LimitsConfig(request_head_timeout_ms=100)) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        try:
            async with asyncio.timeout(DEADLINE_S):
                assert await reader.read() == b""
        finally:
            writer.close()
