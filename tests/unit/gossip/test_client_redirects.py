"""The Python client against two fake nodes whose views disagree: it follows a redirect to
the owner, and when the nodes bounce it back and forth it stops asking for ``no_forward``
and lets them forward, so it is never bounced forever."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgpack
import pytest
from aiohttp import web

from seqlog import Client
from shared.types import LogId

SEQ_HEADER = "X-Seqlog-Sequencer"
NO_FORWARD = "X-Seqlog-No-Forward"


@dataclass
class Fake:
    node_id: str
    owner_of_everything: str
    """The node this fake believes sequences every log."""
    peers: dict[str, str] = field(default_factory=dict)
    """node id -> host:port of every fake."""
    appends: list[bool] = field(default_factory=list)
    """One entry per append received: whether it asked for no_forward."""
    lsn: int = 0

    def cluster_doc(self) -> dict[str, object]:
        return {"cluster": "fake", "nodes": [
            {"node_id": n, "roles": ["sequencer"], "http": http, "state": "ALIVE",
             "sequencer_weight": 1.0, "storage_capacity": 1.0}
            for n, http in self.peers.items()]}

    async def on_append(self, request: web.Request) -> web.Response:
        no_forward = request.headers.get(NO_FORWARD) == "1"
        self.appends.append(no_forward)
        owner = self.owner_of_everything
        if no_forward and owner != self.node_id:
            body = {"status": "NOSEQUENCER", "message": "not here", "sequencer_node": owner,
                    "sequencer_http": self.peers[owner]}
            return web.Response(status=307, body=msgpack.packb(body),
                                content_type="application/msgpack",
                                headers={SEQ_HEADER: owner,
                                         "Location": f"http://{self.peers[owner]}{request.path}"})
        self.lsn += 1
        return web.Response(body=msgpack.packb({"lsn": (1 << 32) + self.lsn,
                                                "timestamp_ms": 1}),
                            content_type="application/msgpack", headers={SEQ_HEADER: owner})

    async def on_cluster(self, request: web.Request) -> web.Response:
        return web.Response(body=msgpack.packb(self.cluster_doc()),
                            content_type="application/msgpack")


async def _serve(fakes: list[Fake]) -> AsyncIterator[list[str]]:
    runners = []
    urls = []
    for fake in fakes:
        app = web.Application()
        app.router.add_post("/v1/logs/{log_id}/append", fake.on_append)
        app.router.add_get("/v1/cluster", fake.on_cluster)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        runners.append(runner)
        urls.append(f"127.0.0.1:{port}")
    for fake in fakes:
        fake.peers.update({f.node_id: u for f, u in zip(fakes, urls, strict=True)})
    try:
        yield urls
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def disagreeing() -> AsyncIterator[tuple[Fake, Fake, list[str]]]:
    # a thinks b owns every log, b thinks a does: a redirect loop.
    a, b = Fake("a", "b"), Fake("b", "a")
    async for urls in _serve([a, b]):
        yield a, b, urls


@pytest.fixture
async def agreeing() -> AsyncIterator[tuple[Fake, Fake, list[str]]]:
    a, b = Fake("a", "b"), Fake("b", "b")
    async for urls in _serve([a, b]):
        yield a, b, urls


async def test_redirect_is_followed_to_the_owner(agreeing: tuple[Fake, Fake, list[str]]) -> None:
    a, b, urls = agreeing
    async with Client(urls[0], retry_backoff_ms_min=1, retry_backoff_ms_max=5,
                      cluster_refresh_ms_min=1) as client:
        await client.cluster()
        client._router.learn_route(LogId(7), "a")  # a stale route
        result = await client.append(7, b"x")
        assert result.lsn > 0
        assert a.appends == [True] and b.appends == [True]
        assert client._router.owner(LogId(7)) == "b"


async def test_redirect_loop_falls_back_to_forwarding(
        disagreeing: tuple[Fake, Fake, list[str]]) -> None:
    a, b, urls = disagreeing
    async with Client(urls[0], retry_backoff_ms_min=1, retry_backoff_ms_max=5,
                      cluster_refresh_ms_min=1) as client:
        await client.cluster()
        client._router.learn_route(LogId(3), "a")
        result = await client.append(3, b"x")
        assert result.lsn > 0
    # a redirected to b, b back to a (already tried): then one plain append, which the
    # nodes forward.
    assert a.appends[0] is True and b.appends[0] is True
    assert sorted(a.appends + b.appends) == [False, True, True]
