"""Fixtures shared by the HTTP edge tests: an in-memory LogService behind a real aiohttp
test server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from http_fakes import ApiClient, FakeLogService, serve


@pytest.fixture
def fake() -> FakeLogService:
    return FakeLogService()


@pytest.fixture
async def client(fake: FakeLogService) -> AsyncIterator[ApiClient]:
    async with serve(fake) as api_client:
        yield api_client
