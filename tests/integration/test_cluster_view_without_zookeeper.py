"""``GET /v1/cluster`` is how clients discover the cluster, and it also shows the storage
shards' state, which lives in the epoch store. With the cluster's ZooKeeper frozen (SIGSTOP:
every read hangs until the session times out), the view must still answer at once, with the
shards last read, rather than wait for ZooKeeper (a rolling restart saw peers' views take
4-8 s right after the ZooKeeper pod's restart)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services import local_cluster as lc

pytestmark = pytest.mark.integration

READY_TIMEOUT_MS = 60_000
VIEW_ANSWER_MAX_S = 1.5
"""Well under the ZooKeeper session timeout: an answer this fast did not wait for it."""


async def _cluster_view(session: aiohttp.ClientSession, url: str) -> tuple[float, Any]:
    started_s = time.monotonic()
    async with session.get(f"{url}/v1/cluster", headers={"Accept": "application/json"},
                           timeout=aiohttp.ClientTimeout(total=30)) as resp:
        assert resp.status == 200
        return time.monotonic() - started_s, await resp.json()


async def test_the_cluster_view_answers_while_zookeeper_is_frozen(tmp_path: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=tmp_path / "cluster", storage_nodes=2, sequencers=1, replication=2,
        base_port=lc.free_base_port(4), with_zookeeper=True), ready_timeout_ms=READY_TIMEOUT_MS)
    zookeeper = state.zookeeper
    assert zookeeper is not None
    url = state.sequencer_urls[0]
    try:
        async with aiohttp.ClientSession() as session:
            _, before = await _cluster_view(session, url)
            assert {s["node_id"] for s in before["shards"]} == {"st1", "st2"}
            os.kill(zookeeper.pid, signal.SIGSTOP)
            try:
                for _ in range(3):
                    took_s, view = await _cluster_view(session, url)
                    assert took_s < VIEW_ANSWER_MAX_S, took_s
                    assert {n["node_id"] for n in view["nodes"]} >= {"st1", "st2"}
                    assert view["shards"] == before["shards"]
                    await asyncio.sleep(0.2)
            finally:
                os.kill(zookeeper.pid, signal.SIGCONT)
    finally:
        lc.down(tmp_path / "cluster")
