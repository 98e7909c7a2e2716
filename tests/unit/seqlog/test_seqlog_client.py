"""The public client against scripted fake nodes: round trips, routing, retries, errors.

Every test runs with appends over the binary protocol (the default) and over HTTP, except
those about HTTP bodies and headers themselves (``http_only``)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fake_seqlog_node import Canned, FakeCluster, FakeNode, error

from seqlog import Client, Gap, LogError, Record, Status
from seqlog.demo import coverage_problems
from seqlog.results import ReadResult
from shared.types import Lsn

E1 = 1 << 32
_protocol = ["binary"]


@pytest.fixture(params=["binary", "http"], autouse=True)
def protocol(request: pytest.FixtureRequest) -> Iterator[str]:
    _protocol[0] = request.param
    yield request.param
    _protocol[0] = "binary"


def http_only(protocol: str) -> None:
    if protocol != "http":
        pytest.skip("about HTTP answers themselves")


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[FakeNode, FakeNode]]:
    cluster = FakeCluster()
    n1, n2 = FakeNode(cluster, "n1"), FakeNode(cluster, "n2")
    await n1.start()
    await n2.start()
    yield n1, n2
    await n1.stop()
    await n2.stop()


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def fast_client(urls: list[str] | str, **kwargs: Any) -> Client:
    options: dict[str, Any] = {"retry_backoff_ms_min": 1, "retry_backoff_ms_max": 5,
                               "timeout_ms": 5_000, "protocol": _protocol[0]}
    options.update(kwargs)
    return Client(urls, **options)


async def test_round_trip(nodes: tuple[FakeNode, FakeNode], protocol: str) -> None:
    n1, n2 = nodes
    async with fast_client(n1.url) as client:
        first = await client.append(7, b"one", key="k")
        batch = await client.append_batch(7, [b"two", b"three"])
        assert client.protocol == protocol
        assert n1.hits["binary"] + n2.hits["binary"] == (2 if protocol == "binary" else 0)
        assert first.lsn == E1 + 1 and first.timestamp_ms == 1000
        assert (batch.first_lsn, batch.last_lsn, batch.count) == (E1 + 2, E1 + 3, 2)
        result = await client.read(7)
        assert [r.payload for r in result.records] == [b"one", b"two", b"three"]
        assert result.records[0].key == "k" and result.records[1].key is None
        assert result.gaps == [Gap(type="BRIDGE", lo=Lsn(1), hi=Lsn(E1))]
        assert coverage_problems(1, result) == []
        assert isinstance(result.entries()[0], Gap)
        tail = await client.tail(7)
        assert tail.release_lsn == E1 + 3 and tail.sequencer == "n2"
        info = await client.cluster()
        assert {n.node_id for n in info.nodes} == {"n1", "n2"}


async def test_appends_go_straight_to_the_named_sequencer(
    nodes: tuple[FakeNode, FakeNode], protocol: str,
) -> None:
    http_only(protocol)  # binary: tests/unit/seqlog/test_seqlog_binary_client.py
    n1, n2 = nodes
    async with fast_client(n1.url) as client:
        await client.append(1, b"a")
        assert n1.hits["append"] == 1
        for _ in range(3):
            await client.append(1, b"b")
        assert n2.hits["append"] == 3 and n1.hits["append"] == 1
        assert n1.hits["cluster"] + n2.hits["cluster"] == 1


async def test_unreachable_node_is_skipped(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    async with fast_client([dead_url(), n1.url]) as client:
        result = await client.append(1, b"a")
        assert result.lsn == E1 + 1
        assert client.urls[0] == n1.url


async def test_no_reachable_node_is_connfailed() -> None:
    async with fast_client([dead_url(), dead_url()]) as client:
        with pytest.raises(LogError) as info:
            await client.append(1, b"a")
    assert info.value.status is Status.CONNFAILED


async def test_seqnobufs_is_retried_within_the_budget(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    n2.cluster.sequencer = "n1"
    n1.canned = [error(429, "SEQNOBUFS", headers={"Retry-After": "1"})] * 2
    async with fast_client(n1.url, retries_max=2) as client:
        assert (await client.append(1, b"a")).lsn == E1 + 1
        assert n1.hits["append"] == 3
        n1.canned = [error(429, "SEQNOBUFS")] * 3
        with pytest.raises(LogError) as info:
            await client.append(1, b"b")
    assert info.value.status is Status.SEQNOBUFS
    assert n1.hits["append"] == 6


@pytest.mark.parametrize(
    ("http_status", "name", "expected"),
    [(504, "TIMEDOUT", Status.TIMEDOUT), (500, "INTERNAL", Status.INTERNAL)],
)
async def test_unknown_outcome_is_never_retried(
    nodes: tuple[FakeNode, FakeNode], http_status: int, name: str, expected: Status
) -> None:
    n1, n2 = nodes
    n2.cluster.sequencer = "n1"
    n1.canned = [error(http_status, name)]
    async with fast_client(n1.url) as client:
        with pytest.raises(LogError) as info:
            await client.append(1, b"a")
    assert info.value.status is expected
    assert n1.hits["append"] == 1 and n2.hits["append"] == 0


async def test_client_timeout_on_append_is_timedout(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    n2.cluster.sequencer = "n1"
    n1.delay_s = 1.0
    async with fast_client([n1.url, n2.url], timeout_ms=100) as client:
        with pytest.raises(LogError) as info:
            await client.append(1, b"a")
    assert info.value.status is Status.TIMEDOUT
    assert n2.hits["append"] == 0


async def test_reads_retry_on_another_node_after_a_timeout(
    nodes: tuple[FakeNode, FakeNode],
) -> None:
    n1, n2 = nodes
    n1.delay_s = 1.0
    async with fast_client([n1.url, n2.url], timeout_ms=100) as client:
        result = await client.read(1)
    assert result.records == [] and n2.hits["records"] == 1


async def test_error_answers_map_to_status(nodes: tuple[FakeNode, FakeNode],
                                          protocol: str) -> None:
    http_only(protocol)
    n1, n2 = nodes
    n2.cluster.sequencer = "n1"
    n1.canned = [
        error(400, "INVALID_PARAM", "limit must be positive"),
        Canned(413, b"Request Entity Too Large", content_type="text/plain"),
        error(404, "NO_SUCH_NAME_IN_OUR_ENUM"),
        Canned(200, b"\x93\x01\x02\x03", content_type="application/msgpack"),
        Canned(200, b'{"lsn": "x", "timestamp_ms": 1}'),
    ]
    expected = [Status.INVALID_PARAM, Status.TOOBIG, Status.NOTFOUND, Status.BADMSG,
                Status.BADMSG]
    async with fast_client(n1.url) as client:
        for status in expected:
            with pytest.raises(LogError) as info:
                await client.append(1, b"a")
            assert info.value.status is status
    assert n1.hits["append"] == len(expected)


async def test_json_answers_are_decoded(nodes: tuple[FakeNode, FakeNode],
                                       protocol: str) -> None:
    http_only(protocol)
    n1, n2 = nodes
    n1.json_answers = n2.json_answers = True
    async with fast_client(n1.url) as client:
        await client.append(3, b"\x00\xffbin")
        result = await client.read(3)
    assert [r.payload for r in result.records] == [b"\x00\xffbin"]


async def test_follow_yields_everything_in_order(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    async with fast_client(n1.url) as client:
        await client.append_batch(5, [b"%d" % i for i in range(5)])
        seen: list[Record | Gap] = []
        async for entry in client.follow(5, limit=2):
            seen.append(entry)
            if len(seen) == 6:
                break
    assert isinstance(seen[0], Gap)
    assert [e.payload for e in seen[1:] if isinstance(e, Record)] == [b"%d" % i for i in range(5)]


@pytest.mark.parametrize("log_id", [0, -1, 2**62, True])
async def test_bad_arguments_are_invalid_param(log_id: int) -> None:
    async with fast_client(dead_url()) as client:
        with pytest.raises(LogError) as info:
            await client.append(log_id, b"a")
        assert info.value.status is Status.INVALID_PARAM
        with pytest.raises(LogError):
            await client.append(1, "text")  # type: ignore[arg-type]
        with pytest.raises(LogError):
            await client.append_batch(1, [])


def test_coverage_problems_finds_holes_and_overlaps() -> None:
    def rec(lsn: int) -> Record:
        return Record(lsn=Lsn(lsn), timestamp_ms=0, key=None, payload=b"")

    good = ReadResult(records=[rec(3)], gaps=[Gap(type="HOLE", lo=Lsn(1), hi=Lsn(2))],
                      next_lsn=Lsn(4), release_lsn=Lsn(3))
    assert coverage_problems(1, good) == []
    hole = ReadResult(records=[rec(3)], next_lsn=Lsn(4), release_lsn=Lsn(3))
    assert coverage_problems(1, hole)
    past_release = ReadResult(records=[rec(1)], next_lsn=Lsn(2), release_lsn=Lsn(0))
    assert coverage_problems(1, past_release)
    empty = ReadResult(next_lsn=Lsn(5), release_lsn=Lsn(4))
    assert coverage_problems(5, empty) == []
