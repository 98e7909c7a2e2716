"""A real standalone ZooKeeper server for the epoch store contract tests, started once per
session and stopped at the end (each test works under its own znode root)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epoch_store import zk_server
from epoch_store.zk_server import ServerHandle
from tests.zk_support import start_standalone


@pytest.fixture(scope="session")
def zk_server_handle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = start_standalone(tmp_path_factory.mktemp("zookeeper"))
    try:
        yield handle
    finally:
        zk_server.stop(handle)
