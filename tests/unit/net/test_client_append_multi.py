"""APPEND_MULTI on a node's data port (docs/PROTOCOL.md, protocol version 3): each entry
reaches the handler as the APPEND it stands for (hops 0, ``no_forward``) and is answered on
its own, all answers in one APPENDED_MULTI once the last is in; the in-flight bound counts
entries (one past it is answered OVERLOADED and never reaches the handler); a version-2
client may not send it; a malformed one closes the connection."""

from __future__ import annotations

import msgpack

from shared.config import TransportConfig
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.append_multi import AppendedMulti, AppendMulti, appended_multi_answers
from shared.wire.hello import CLIENT_APPEND_VERSION
from shared.wire.message_type import MessageType
from tests.unit.net.test_client_appends import AppendHandler, RawClient
from tests.unit.net.transport_helpers import SERVER_ID, serve, wait_until


def multi(*log_ids: int) -> AppendMulti:
    return AppendMulti(appends=tuple((log_id, (b"a%d" % log_id, b"b"), None)
                                     for log_id in log_ids))


async def test_each_entry_is_an_append_and_all_answers_leave_in_one_frame() -> None:
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    client, hello = await RawClient.connect(server.port)
    try:
        assert hello.status is Status.OK
        client.send(multi(5, 6, 7), 21)
        await wait_until(lambda: len(handler.held) == 3)
        assert [m for m, _ in handler.held] == [
            Append(log_id=LogId(log_id), payloads=(b"a%d" % log_id, b"b"), key=None, hops=0,
                   no_forward=True) for log_id in (5, 6, 7)]
        # Answered out of order, one refused: nothing leaves until the last answer.
        (m5, r5), (m6, r6), (m7, r7) = handler.held
        r7(Appended(status=Status.OK, log_id=m7.log_id, first_lsn=Lsn(70), last_lsn=Lsn(71),
                    timestamp_ms=9, sequencer_node=SERVER_ID, message=""))
        r6(Appended(status=Status.SEQNOBUFS, log_id=m6.log_id, first_lsn=Lsn(0),
                    last_lsn=Lsn(0), timestamp_ms=0, sequencer_node=SERVER_ID,
                    message="window full", retry_after_ms=1000))
        r6(Appended(status=Status.OK, log_id=m6.log_id, first_lsn=Lsn(1), last_lsn=Lsn(2),
                    timestamp_ms=1, sequencer_node=SERVER_ID, message=""))  # ignored
        assert client.frames == []
        r5(Appended(status=Status.OK, log_id=m5.log_id, first_lsn=Lsn(50), last_lsn=Lsn(51),
                    timestamp_ms=9, sequencer_node=SERVER_ID, message=""))
        cid, reply = await client.recv()
        assert cid == 21 and isinstance(reply, AppendedMulti)
        results = appended_multi_answers(reply, [(LogId(5), 2), (LogId(6), 2), (LogId(7), 2)])
        assert results is not None
        assert [(r.status, r.first_lsn, r.last_lsn) for r in results] == [
            (Status.OK, 50, 51), (Status.SEQNOBUFS, 0, 0), (Status.OK, 70, 71)]
        assert results[1].retry_after_ms == 1000 and results[0].sequencer_node == SERVER_ID
    finally:
        client.close()
        await server.close()


async def test_the_in_flight_bound_counts_entries_and_refuses_past_it_with_nothing_written(
) -> None:
    handler = AppendHandler()
    config = TransportConfig(connect_timeout_ms=2_000, client_appends_inflight_max=2)
    server = await serve(handler, config=config)  # type: ignore[arg-type]
    client, _ = await RawClient.connect(server.port)
    try:
        client.send(multi(1, 2, 3), 4)
        await wait_until(lambda: len(handler.held) == 2)
        for message, reply in handler.held:
            reply(Appended(status=Status.OK, log_id=message.log_id, first_lsn=Lsn(1),
                           last_lsn=Lsn(2), timestamp_ms=1, sequencer_node=SERVER_ID,
                           message=""))
        cid, reply = await client.recv()
        assert cid == 4 and isinstance(reply, AppendedMulti)
        results = appended_multi_answers(reply, [(LogId(1), 2), (LogId(2), 2), (LogId(3), 2)])
        assert results is not None
        assert [r.status for r in results] == [Status.OK, Status.OK, Status.OVERLOADED]
        assert [m.log_id for m, _ in handler.held] == [1, 2]  # the third never reached it
        client.send(multi(3), 5)  # the places are free again
        await wait_until(lambda: len(handler.held) == 3)
    finally:
        client.close()
        await server.close()


async def test_a_version_2_client_may_not_send_append_multi() -> None:
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    client, hello = await RawClient.connect(server.port, version=CLIENT_APPEND_VERSION)
    try:
        assert hello.status is Status.OK
        client.send(multi(1), 1)
        assert await client.closed_by_node()
        assert handler.received == []
    finally:
        client.close()
        await server.close()


async def test_a_malformed_append_multi_closes_the_connection_before_any_entry_runs() -> None:
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    client, _ = await RawClient.connect(server.port)
    try:
        bad = [[[1, [b"x"], None], [2, ["not bytes"], None]]]
        body = msgpack.packb([int(MessageType.APPEND_MULTI), 3, bad])
        client.writer.write(len(body).to_bytes(4, "big") + body)
        assert await client.closed_by_node()
        assert handler.received == []
        assert server.counters.desyncs == 1
    finally:
        client.close()
        await server.close()


async def test_nodes_may_not_claim_client_appends_with_append_multi() -> None:
    """A node (not a client.* peer) gets no special path: the handler sees the message."""
    handler = AppendHandler()
    server = await serve(handler)  # type: ignore[arg-type]
    node, hello = await RawClient.connect(server.port, version=1, node_id=NodeId("n9"))
    try:
        assert hello.status is Status.OK
        node.send(multi(1), 1)
        await wait_until(lambda: len(handler.received) == 1)
        assert type(handler.received[0][1]) is AppendMulti and handler.held == []
    finally:
        node.close()
        await server.close()
