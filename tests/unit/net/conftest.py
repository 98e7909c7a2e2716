"""Fixtures for the transport tests: a started server with a scriptable handler and a pool.
Every test runs on both the default asyncio loop and uvloop, since nodes may use either."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import pytest
import uvloop

from shared.net import PeerPool, Server
from tests.unit.net.transport_helpers import Handler, make_pool, serve

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def pytest_asyncio_loop_factories(config: pytest.Config,
                                  item: pytest.Item) -> Mapping[str, LoopFactory]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
async def server(handler: Handler) -> AsyncIterator[Server]:
    server = await serve(handler)
    yield server
    await server.close()


@pytest.fixture
async def pool(server: Server) -> AsyncIterator[PeerPool]:
    pool = make_pool(server.port)
    yield pool
    await pool.close()
