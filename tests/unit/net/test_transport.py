"""Request/reply, one-way messages, correlation, coalescing and the in-flight bound, over real
TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio

from shared.config import TransportConfig
from shared.net import PeerPool, Server
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.release import Release
from shared.wire.store import Stored
from tests.unit.net.transport_helpers import (
    CLIENT_ID,
    SERVER_ID,
    Handler,
    Results,
    make_pool,
    store,
    stored,
    wait_until,
)


async def test_request_reply_round_trip(handler: Handler, pool: PeerPool) -> None:
    reply = await pool.call(SERVER_ID, store(7, b"hello"), timeout_ms=5_000)

    assert reply == stored(7)
    assert pool.connected(SERVER_ID)
    [(peer, message)] = handler.received
    assert peer == CLIENT_ID
    assert message == store(7, b"hello")


async def test_out_of_order_replies_reach_their_requests(handler: Handler,
                                                         pool: PeerPool) -> None:
    handler.hold = True
    results = Results()
    for lsn in range(1, 11):
        pool.request(SERVER_ID, store(lsn), results.callback(lsn))
    await wait_until(lambda: len(handler.held) == 10)

    handler.reply_held(reverse=True)
    await wait_until(lambda: len(results.by_key) == 10)

    assert results.by_key == {lsn: stored(lsn) for lsn in range(1, 11)}
    assert pool.inflight(SERVER_ID) == 0


async def test_one_way_messages_arrive_and_cannot_be_answered(handler: Handler,
                                                              pool: PeerPool,
                                                              server: Server) -> None:
    release = Release(log_id=LogId(3), release_lsn=Lsn(99))
    assert pool.send(SERVER_ID, release)  # queued while the connection is being made
    await wait_until(lambda: len(handler.received) == 1)
    assert handler.received == [(CLIENT_ID, release)]

    handler.hold = True
    assert pool.send(SERVER_ID, release)
    await wait_until(lambda: len(handler.held) == 1)
    sent_before = server.counters.frames_sent
    handler.held[0][1](stored(1))  # the reply of a one-way message is a no-op
    handler.hold = False
    assert await pool.call(SERVER_ID, store(5), timeout_ms=5_000) == stored(5)
    assert server.counters.frames_sent == sent_before + 1
    assert pool.counters.desyncs == 0


async def test_requests_made_while_connecting_are_sent_in_order(handler: Handler,
                                                                pool: PeerPool) -> None:
    results = Results()
    for lsn in range(1, 4):
        pool.request(SERVER_ID, store(lsn), results.callback(lsn))
    assert not pool.connected(SERVER_ID)
    await wait_until(lambda: len(results.by_key) == 3)

    assert results.by_key == {lsn: stored(lsn) for lsn in range(1, 4)}
    assert handler.store_lsns() == [1, 2, 3]


async def test_frames_of_one_iteration_leave_in_one_write(handler: Handler, pool: PeerPool,
                                                          server: Server) -> None:
    assert await pool.call(SERVER_ID, store(0), timeout_ms=5_000) == stored(0)
    client_before = (pool.counters.writes, pool.counters.frames_sent)
    server_before = (server.counters.writes, server.counters.frames_sent)
    results = Results()

    for lsn in range(1, 101):
        pool.request(SERVER_ID, store(lsn, b"p" * 100), results.callback(lsn))
    await wait_until(lambda: len(results.by_key) == 100)

    assert all(isinstance(r, Stored) for r in results.by_key.values())
    assert pool.counters.writes - client_before[0] == 1
    assert pool.counters.frames_sent - client_before[1] == 100
    assert server.counters.frames_sent - server_before[1] == 100
    assert server.counters.writes - server_before[0] <= 3


async def test_replies_of_one_iteration_leave_in_one_write(handler: Handler, pool: PeerPool,
                                                           server: Server) -> None:
    handler.hold = True
    results = Results()
    for lsn in range(1, 101):
        pool.request(SERVER_ID, store(lsn), results.callback(lsn))
    await wait_until(lambda: len(handler.held) == 100)
    writes_before = server.counters.writes

    handler.reply_held()
    await wait_until(lambda: len(results.by_key) == 100)

    assert server.counters.writes - writes_before == 1


async def test_inflight_bound_answers_overloaded(handler: Handler, server: Server) -> None:
    pool = make_pool(server.port, config=TransportConfig(peer_requests_inflight_max=4))
    try:
        handler.hold = True
        results = Results()
        for lsn in range(1, 6):
            pool.request(SERVER_ID, store(lsn), results.callback(lsn))
        assert results.by_key == {}  # never called back synchronously
        await wait_until(lambda: 5 in results.by_key)
        assert results.by_key == {5: Status.OVERLOADED}

        await wait_until(lambda: len(handler.held) == 4)
        handler.reply_held()
        await wait_until(lambda: len(results.by_key) == 5)
        assert [results.by_key[lsn] for lsn in range(1, 5)] == [stored(n) for n in range(1, 5)]
        handler.hold = False
        assert await pool.call(SERVER_ID, store(9), timeout_ms=5_000) == stored(9)
    finally:
        await pool.close()


async def test_call_timeout_drops_the_late_reply(handler: Handler, pool: PeerPool) -> None:
    handler.hold = True
    assert await pool.call(SERVER_ID, store(1), timeout_ms=50) == Status.TIMEDOUT
    assert pool.inflight(SERVER_ID) == 0

    handler.reply_held()
    handler.hold = False
    assert await pool.call(SERVER_ID, store(2), timeout_ms=5_000) == stored(2)
    assert pool.counters.desyncs == 0
    assert pool.counters.connects == 1


async def test_unknown_node_fails_later_with_connfailed(pool: PeerPool) -> None:
    results = Results()
    pool.request(NodeId("nobody"), store(1), results.callback("x"))
    assert results.by_key == {}
    await wait_until(lambda: "x" in results.by_key)
    assert results.by_key == {"x": Status.CONNFAILED}
    assert not pool.send(NodeId("nobody"), store(1))


async def test_many_clients_share_one_server(handler: Handler, server: Server) -> None:
    pools = [make_pool(server.port) for _ in range(5)]
    try:
        replies = await asyncio.gather(
            *(p.call(SERVER_ID, store(i), timeout_ms=5_000) for i, p in enumerate(pools)))
        assert list(replies) == [stored(i) for i in range(5)]
        assert server.connection_count == 5
    finally:
        for p in pools:
            await p.close()
    await wait_until(lambda: server.connection_count == 0)
