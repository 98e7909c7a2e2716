"""``GET /v1/logs/{id}/tail`` never goes backwards (issue 16 item 4), on real processes: a
poller asks every sequencer node for the tail while the log's sequencer is killed with -9 and
restarted, and while every node is, with a new sequencer activated (recovering) before the
storage nodes are back. Every 200 answer must be at least the highest release pointer any node
reported before; while nobody can vouch for it the answer is 503 NOTREADY, never 0."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from services import local_cluster as lc

pytestmark = pytest.mark.integration

LOG = 31
READY_TIMEOUT_MS = 60_000


class TailWatch:
    """Polls the tail through every sequencer node; keeps the highest pointer reported and
    every 200 answer below it."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.high = 0
        self.regressions: list[tuple[str, int, int]] = []
        self.answers: dict[int, int] = {}
        self._stop = asyncio.Event()

    async def run(self, session: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                await self.poll_once(session, url)
            await asyncio.sleep(0.02)

    async def poll_once(self, session: aiohttp.ClientSession, url: str) -> int | None:
        try:
            async with session.get(f"{url}/v1/logs/{LOG}/tail",
                                   timeout=aiohttp.ClientTimeout(total=3)) as response:
                self.answers[response.status] = self.answers.get(response.status, 0) + 1
                if response.status != 200:
                    return None
                release = int((await response.json())["release_lsn"])
        except (aiohttp.ClientError, TimeoutError):
            return None
        if release < self.high:
            self.regressions.append((url, release, self.high))
        self.high = max(self.high, release)
        return release

    def stop(self) -> None:
        self._stop.set()


async def _append(session: aiohttp.ClientSession, url: str, payload: bytes,
                  timeout_s: float) -> int | None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.post(f"{url}/v1/logs/{LOG}/append",
                                json={"payload": base64.b64encode(payload).decode()},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status == 200:
                return int((await response.json())["lsn"])
    return None


async def _until_appended(session: aiohttp.ClientSession, urls: list[str], payload: bytes,
                          timeout_s: float) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        for url in urls:
            lsn = await _append(session, url, payload, 5)
            if lsn is not None:
                return lsn
        await asyncio.sleep(0.1)
    raise AssertionError(f"no append of {payload!r} succeeded in {timeout_s} s")


async def _until_tail_reaches(watch: TailWatch, session: aiohttp.ClientSession, lsn: int,
                              timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if watch.high >= lsn:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"tail never reached {lsn:#x} (highest {watch.high:#x})")


async def test_tail_never_goes_backwards_across_kills_and_full_restart(
        cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=3,
        base_port=lc.free_base_port(5), fsync="always"), ready_timeout_ms=READY_TIMEOUT_MS)
    urls = [f"http://{n.http}" for n in state.nodes if "sequencer" in n.roles]
    async with aiohttp.ClientSession() as session:
        watch = TailWatch(urls)
        last = 0
        for i in range(30):
            last = await _until_appended(session, urls, b"before %d" % i, 20)
        poller = asyncio.create_task(watch.run(session))
        try:
            await _until_tail_reaches(watch, session, last, 10)
            # 1. kill -9 of the log's sequencer; the other one takes over (recovers).
            async with session.get(f"{urls[0]}/v1/logs/{LOG}/tail") as response:
                owner = (await response.json())["sequencer"]
            victim = next(n for n in state.nodes if n.node_id == owner)
            os.kill(victim.pid, signal.SIGKILL)
            last = await _until_appended(session, urls, b"after sequencer kill", 60)
            await _until_tail_reaches(watch, session, last, 30)
            await asyncio.to_thread(lc.restart, cluster_dir, owner)
            # 2. kill -9 of every node; the sequencers come back first and one activates the
            # log (its recovery waits for the storage nodes), then the storage nodes.
            state = lc.load_state(cluster_dir) or state
            for node in state.nodes:
                os.kill(node.pid, signal.SIGKILL)
            for node in state.nodes:
                if "sequencer" in node.roles:
                    await asyncio.to_thread(lc.restart, cluster_dir, node.node_id)
            activations = [asyncio.create_task(_append(session, url, b"activate", 3))
                           for url in urls]
            await asyncio.sleep(2)  # the poller asks while the new sequencer recovers
            for node in state.nodes:
                if "storage" in node.roles:
                    await asyncio.to_thread(lc.restart, cluster_dir, node.node_id)
            await asyncio.gather(*activations)
            last = await _until_appended(session, urls, b"after full restart", 60)
            await _until_tail_reaches(watch, session, last, 30)
        finally:
            watch.stop()
            await poller
    assert not watch.regressions, (watch.regressions[:5], watch.answers)
    assert watch.answers.get(200, 0) > 0
