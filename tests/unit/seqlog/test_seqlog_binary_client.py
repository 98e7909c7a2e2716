"""``seqlog.Client`` over the binary protocol against fake nodes that serve the real transport
server: redirects, retries, the fallback to HTTP, and appends without a Task each."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from fake_seqlog_node import FakeCluster, FakeNode, error

from seqlog import Client, LogError, Status
from seqlog.binary_appends import GROUP_BYTES_MAX, GROUP_PAYLOAD_BYTES_MAX, GROUP_RECORDS_MAX
from shared.config import TransportConfig
from shared.routing import sequencer_for
from shared.types import LogId, NodeId

E1 = 1 << 32


def client(urls: list[str] | str, **kwargs: int) -> Client:
    options = {"retry_backoff_ms_min": 1, "retry_backoff_ms_max": 5, "timeout_ms": 5_000}
    options.update(kwargs)
    return Client(urls, **options)


async def start(*nodes: FakeNode) -> None:
    for node in nodes:
        await node.start()


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[FakeNode, FakeNode]]:
    cluster = FakeCluster()
    n1, n2 = FakeNode(cluster, "n1"), FakeNode(cluster, "n2")
    await start(n1, n2)
    yield n1, n2
    await n1.stop()
    await n2.stop()


def hashed_owner(log_id: int) -> str:
    owner = sequencer_for(LogId(log_id), [(NodeId("n1"), 1.0), (NodeId("n2"), 1.0)])
    assert owner is not None
    return owner


async def test_a_redirect_is_followed_once_then_appends_go_straight(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    by_id = {"n1": n1, "n2": n2}
    hashed = hashed_owner(1)
    real = "n2" if hashed == "n1" else "n1"
    n1.cluster.sequencer = real
    async with client(n1.url) as c:
        for i in range(4):
            assert (await c.append(1, b"x%d" % i)).lsn == E1 + i + 1
        assert c.protocol == "binary"
    assert by_id[hashed].hits["redirect"] == 1
    assert by_id[real].hits["binary"] == 4 and by_id[hashed].hits["binary"] == 0


async def test_idempotent_appends_are_retried_after_an_unknown_outcome(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = "n1"
    n1.canned = [error(504, "TIMEDOUT")]
    async with client(n1.url) as c:
        result = await c.append(1, b"a", producer_id="p", producer_seq=1)
        assert result.lsn == E1 + 1
        n1.canned = [error(504, "TIMEDOUT")]
        with pytest.raises(LogError) as info:
            await c.append(1, b"b")
    assert info.value.status is Status.TIMEDOUT
    assert n1.hits["binary"] == 3


async def test_overloaded_connections_write_nothing_and_are_retried() -> None:
    cluster = FakeCluster()
    cluster.sequencer = "n1"
    n1 = FakeNode(cluster, "n1", transport=TransportConfig(client_appends_inflight_max=2))
    await start(n1)
    n1.delay_s = 0.02
    try:
        async with client(n1.url, retries_max=50) as c:
            await c.append(1, b"warm")
            results = await asyncio.gather(*(c.append_future(1, b"%d" % i) for i in range(8)))
    finally:
        await n1.stop()
    assert sorted(r.lsn for r in results) == [E1 + 2 + i for i in range(8)]
    assert len(cluster.logs[1]) == 9  # OVERLOADED answers wrote nothing


async def test_append_future_needs_no_task_per_append(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = hashed_owner(1)
    async with client(n1.url) as c:
        await c.append(1, b"warm")  # connects and learns the route
        tasks_before = len(asyncio.all_tasks())
        futures = [c.append_future(1, b"%d" % i) for i in range(200)]
        assert len(asyncio.all_tasks()) == tasks_before
        results = await asyncio.gather(*futures)
    assert [r.lsn for r in results] == [E1 + 2 + i for i in range(200)]


async def test_a_cluster_without_the_binary_protocol_gets_http_appends() -> None:
    cluster = FakeCluster()
    n1 = FakeNode(cluster, "n1", binary=False)
    n2 = FakeNode(cluster, "n2", binary=False)
    await start(n1, n2)
    try:
        async with client(n1.url) as c:
            assert (await c.append(1, b"a")).lsn == E1 + 1
            assert c.protocol == "http"
    finally:
        await n1.stop()
        await n2.stop()


async def test_a_refused_hello_falls_back_to_http(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    n1.fingerprint_told = n2.fingerprint_told = "another-cluster"
    async with client(n1.url) as c:
        assert (await c.append(1, b"a")).lsn == E1 + 1
        assert c.protocol == "http"
        assert (await c.append_batch(1, [b"b", b"c"])).count == 2
    assert n1.hits["binary"] + n2.hits["binary"] == 0


async def test_closing_the_client_fails_appends_in_flight_as_outcome_unknown(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    n1.cluster.sequencer = hashed_owner(1)
    c = client(n1.url)
    await c.append(1, b"warm")
    n1.delay_s = n2.delay_s = 5.0
    pending = [c.append_future(1, b"slow"), c.append_future(1, b"slow", producer_id="p",
                                                            producer_seq=1)]
    await asyncio.sleep(0.05)
    async with asyncio.timeout(3):
        await c.close()
        for future in pending:
            with pytest.raises(LogError) as info:
                await future
            assert info.value.status in (Status.TIMEDOUT, Status.SHUTDOWN)


async def test_unreachable_data_ports_fall_back_to_http(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    for node in (n1, n2):
        node.data = f"127.0.0.1:{dead_port()}"
    async with client(n1.url) as c:
        assert (await c.append(1, b"a")).lsn == E1 + 1
        assert c.protocol == "http"


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_batch_too_big_for_one_frame_is_toobig_and_not_sent(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    big = b"x" * (33 * 1024 * 1024)
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        with pytest.raises(LogError) as info:
            await c.append_batch(1, [big, big])
        assert info.value.status is Status.TOOBIG and c.protocol == "binary"
    assert n1.hits["append-batch"] + n2.hits["append-batch"] == 0


async def test_a_late_answer_after_a_timeout_leaves_the_connection_usable(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = "n1"
    async with client(n1.url, timeout_ms=150) as c:
        await c.append(1, b"warm")
        n1.delay_s = 0.4
        with pytest.raises(LogError) as info:
            await c.append(1, b"slow")
        assert info.value.status is Status.TIMEDOUT
        n1.delay_s = 0.0
        await asyncio.sleep(0.4)  # the late answer arrives meanwhile
        assert (await c.append(1, b"after")).lsn == E1 + 3
        assert c._binary is not None and c._binary.connections.counters.desyncs == 0


async def test_single_appends_of_one_loop_iteration_travel_as_one_append(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = hashed_owner(1)
    owner = n1.cluster.nodes[n1.cluster.sequencer]
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        await c.append(2, b"warm")
        frames_before = owner.hits["binary"]
        plain = [c.append_future(1, b"a%d" % i) for i in range(300)]
        keyed = [c.append_future(2, b"k%d" % i, "key") for i in range(20)]
        big = c.append_future(1, b"b" * (GROUP_PAYLOAD_BYTES_MAX + 1))
        pair = c.append_future(1, b"p", producer_id="p", producer_seq=1)
        results = await asyncio.gather(*plain)
        keyed_results = await asyncio.gather(*keyed)
        await asyncio.gather(big, pair)
    # The first append alone (the connection was idle), then one APPEND per (log, key)
    # group; the big payload and the producer's append alone.
    assert owner.hits["binary"] - frames_before == 5
    # Each append its own LSN, consecutive in the order they were made.
    assert [r.lsn for r in results] == [E1 + 2 + i for i in range(300)]
    assert [r.lsn for r in keyed_results] == [E1 + 2 + i for i in range(20)]
    log1 = n1.cluster.logs[1]
    assert [p for _, p, _ in log1[1:301]] == [b"a%d" % i for i in range(300)]
    assert [p[:1] for _, p, _ in log1[301:]] == [b"b", b"p"]  # not ahead of the group
    assert all(k == "key" for _, _, k in n1.cluster.logs[2][1:])


async def test_a_group_is_split_at_its_bounds(nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = hashed_owner(1)
    owner = n1.cluster.nodes[n1.cluster.sequencer]
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        frames_before = owner.hits["binary"]
        many = [c.append_future(1, b"%d" % i) for i in range(GROUP_RECORDS_MAX + 2)]
        results = await asyncio.gather(*many)
        assert owner.hits["binary"] - frames_before == 3  # the first one alone

        payload = b"x" * GROUP_PAYLOAD_BYTES_MAX
        per_group = GROUP_BYTES_MAX // GROUP_PAYLOAD_BYTES_MAX
        sized = await asyncio.gather(*(c.append_future(1, payload)
                                       for _ in range(per_group + 2)))
        assert owner.hits["binary"] - frames_before == 6
    assert [r.lsn for r in results + sized] == [
        E1 + 2 + i for i in range(GROUP_RECORDS_MAX + 2 + per_group + 2)]


async def test_a_group_a_node_refuses_is_sent_one_append_at_a_time(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = hashed_owner(1)
    owner = n1.cluster.nodes[n1.cluster.sequencer]
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        frames_before = owner.hits["binary"]
        owner.canned_batches = [error(413, "TOOBIG")]  # a node with smaller batch limits
        results = await asyncio.gather(*(c.append_future(1, b"%d" % i) for i in range(6)))
        assert owner.hits["binary"] - frames_before == 1 + 1 + 5  # alone, group, 5 alone
        # The client stops grouping for good.
        await asyncio.gather(*(c.append_future(1, b"%d" % i) for i in range(3)))
        assert owner.hits["binary"] - frames_before == 1 + 1 + 5 + 3
    assert sorted(r.lsn for r in results) == [E1 + 2 + i for i in range(6)]


async def test_a_group_answered_nothing_written_is_retried_append_by_append(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = hashed_owner(1)
    owner = n1.cluster.nodes[n1.cluster.sequencer]
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        owner.canned_batches = [error(429, "SEQNOBUFS")]
        results = await asyncio.gather(*(c.append_future(1, b"%d" % i) for i in range(5)))
    assert sorted(r.lsn for r in results) == [E1 + 2 + i for i in range(5)]
    assert len(n1.cluster.logs[1]) == 6


async def test_a_group_with_an_unknown_outcome_fails_each_append_as_unknown(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, _ = nodes
    n1.cluster.sequencer = hashed_owner(1)
    owner = n1.cluster.nodes[n1.cluster.sequencer]
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        frames_before = owner.hits["binary"]
        owner.canned_batches = [error(504, "TIMEDOUT")]
        outcomes = await asyncio.gather(*(c.append_future(1, b"%d" % i) for i in range(5)),
                                        return_exceptions=True)
    assert not isinstance(outcomes[0], BaseException)  # alone: the connection was idle
    assert all(isinstance(o, LogError) and o.status is Status.TIMEDOUT for o in outcomes[1:])
    assert owner.hits["binary"] - frames_before == 2  # the group never resent: it may be written


async def test_a_redirected_group_is_resent_append_by_append_to_the_owner(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    by_id = {"n1": n1, "n2": n2}
    hashed = hashed_owner(1)
    other = "n2" if hashed == "n1" else "n1"
    n1.cluster.sequencer = hashed
    async with client(n1.url) as c:
        await c.append(1, b"warm")
        n1.cluster.sequencer = other  # the owner moved; the client does not know yet
        results = await asyncio.gather(*(c.append_future(1, b"%d" % i) for i in range(30)))
    assert sorted(r.lsn for r in results) == [E1 + 2 + i for i in range(30)]
    assert sorted(p for _, p, _ in n1.cluster.logs[1][1:]) == sorted(
        b"%d" % i for i in range(30))
    assert by_id[hashed].hits["redirect"] >= 2  # the lone first append and the group
    assert by_id[other].hits["binary"] >= 1


async def test_closing_the_client_fails_held_appends_as_not_sent_and_sent_ones_as_unknown(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    n1, n2 = nodes
    n1.cluster.sequencer = hashed_owner(1)
    owner = n1.cluster.nodes[n1.cluster.sequencer]
    c = client(n1.url)
    await c.append(1, b"warm")
    n1.delay_s = n2.delay_s = 5.0
    first = c.append_future(1, b"alone")  # the connection is busy from now on
    held = [c.append_future(1, b"held%d" % i) for i in range(3)]
    async with asyncio.timeout(3):
        await c.close()  # in the same loop iteration: the group has not left yet
        with pytest.raises(LogError) as info:
            await first
        assert info.value.status is Status.TIMEDOUT  # sent: the outcome is unknown
        for future in held:
            with pytest.raises(LogError) as info:
                await future
            assert info.value.status is Status.SHUTDOWN  # never sent: nothing written
    await asyncio.sleep(0.05)
    assert owner.hits["append-batch"] == 0


async def test_a_burst_of_first_appends_fetches_the_cluster_view_once(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    """256 appends at once on a new client: one GET /v1/cluster sets the binary path up (not
    one each, which over HTTPS was one new connection and TLS handshake per append)."""
    n1, _ = nodes
    async with client(n1.url, connections_max=256) as c:
        results = await asyncio.gather(*(c.append(1, b"x%d" % i) for i in range(256)))
        assert c.protocol == "binary"
    assert len({r.lsn for r in results}) == 256
    assert n1.hits["cluster"] == 1, n1.hits
