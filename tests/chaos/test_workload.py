"""How the chaos workload classifies an append's answer: only answers that promise nothing
was written count as failed; everything that may have written is unknown."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.chaos import workload
from tests.chaos.workload import (
    Outcome,
    WorkloadSettings,
    append,
    reader_placement,
    writer_placement,
)

ANSWERS: dict[str, tuple[int, object]] = {
    "1": (200, {"lsn": 42, "timestamp_ms": 1}),
    "2": (200, {"first_lsn": 7, "last_lsn": 9, "count": 3, "timestamp_ms": 1}),
    "3": (429, {"status": "SEQNOBUFS", "message": "full"}),
    "4": (503, {"status": "NOSEQUENCER", "message": "none"}),
    "5": (504, {"status": "TIMEDOUT", "message": "unknown"}),
    "6": (500, {"status": "INTERNAL", "message": "bug"}),
    "7": (307, {"status": "NOSEQUENCER", "message": "go there"}),
    "8": (502, "not json"),
}


@pytest.fixture
async def node() -> AsyncIterator[str]:
    released = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        log = request.match_info["log"]
        if log == "9":
            await released.wait()  # silent until the test ends: the client's timeout ends it
        code, doc = ANSWERS[log]
        text = doc if isinstance(doc, str) else json.dumps(doc)
        return web.Response(status=code, text=text, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/logs/{log}/append", answer)
    app.router.add_post("/v1/logs/{log}/append-batch", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        released.set()
        await runner.cleanup()


@pytest.mark.parametrize(("log", "payloads", "expected"), [
    (1, [b"a"], Outcome("ok", (42,), http=200)),
    (2, [b"a", b"b", b"c"], Outcome("ok", (7, 8, 9), http=200)),
    (3, [b"a"], Outcome("fail", status="SEQNOBUFS", http=429)),
    (4, [b"a"], Outcome("fail", status="NOSEQUENCER", http=503)),
    (5, [b"a"], Outcome("unknown", status="TIMEDOUT", http=504)),
    (6, [b"a"], Outcome("unknown", status="INTERNAL", http=500)),
    (7, [b"a"], Outcome("fail", status="NOSEQUENCER", http=307)),
    (8, [b"a"], Outcome("unknown", status="HTTP502", http=502)),
])
async def test_answers_are_classified_by_what_they_promise(
        node: str, log: int, payloads: list[bytes], expected: Outcome) -> None:
    async with aiohttp.ClientSession() as session:
        assert await append(session, node, log, payloads) == expected


async def test_a_refused_connection_failed_and_a_silent_node_is_unknown(
        node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # bound, not listening: connections are refused
        async with aiohttp.ClientSession() as session:
            refused = await append(session, f"127.0.0.1:{closed_port}", 1, [b"a"])
    assert refused == Outcome("fail", status="CONNECT_FAILED")
    monkeypatch.setattr(workload, "APPEND_TIMEOUT_S", 0.2)
    async with aiohttp.ClientSession() as session:
        assert await append(session, node, 9, [b"a"]) == Outcome(
            "unknown", status="CLIENT_TIMEOUT")


def test_each_log_is_written_and_read_through_different_nodes() -> None:
    nodes = ["seq1", "seq2", "st1", "st2", "st3"]
    settings = WorkloadSettings()
    writers = writer_placement(settings, nodes)
    readers = reader_placement(settings, nodes)
    assert len(writers) == len(settings.logs) * settings.writers_per_log
    for log in settings.logs:
        via = [node for _, lg, node in writers if lg == log]
        assert len(set(via)) == settings.writers_per_log, (log, via)
        read_via = [node for _, lg, node in readers if lg == log]
        assert len(set(read_via)) == settings.readers_per_log, (log, read_via)
    assert {node for _, _, node in writers} == set(nodes)
    assert len({name for name, _, _ in writers + readers}) == len(writers) + len(readers)
