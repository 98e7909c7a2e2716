"""Fuzz of the binary protocol against the transport server (the integration twin runs the
same cases against a real node): hostile input after a good HELLO gets a clear error answer or
a closed connection, and the server keeps serving appends after every case. The handler
checks appends with the node's rules (``shared.append_validation``), as the front end does."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from shared.append_validation import check_append
from shared.config import ApiConfig, TransportConfig
from shared.net import ReplyFn, Server, start_server
from shared.status import Status
from shared.types import Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import Message
from tests.unit.net.hostile_frames import append_works, check_case, hostile

FINGERPRINT = "fp-fuzz"
API = ApiConfig()


class ValidatingHandler:
    def __init__(self) -> None:
        self.lsn = 0

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        assert isinstance(message, Append), message  # the transport let nothing else through
        producer_seq = None if message.producer_id is None else message.producer_seq
        invalid = check_append(message.log_id, message.payloads, message.key,
                               message.producer_id, producer_seq, API)
        self.lsn += 1
        reply(Appended(
            status=Status.OK if invalid is None else invalid.status, log_id=message.log_id,
            first_lsn=Lsn(self.lsn), last_lsn=Lsn(self.lsn), timestamp_ms=1,
            sequencer_node=NodeId("n1"),
            message="" if invalid is None else f"{invalid.message}; nothing written"))


@pytest.fixture(scope="module")
def server_port() -> Iterator[int]:
    """The server runs on its own loop in a thread: the test talks to it with plain sockets."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: list[Server] = []

    async def serve() -> None:
        holder.append(await start_server(
            "127.0.0.1", 0, node_id=NodeId("n1"), cluster_fingerprint=FINGERPRINT,
            handler=ValidatingHandler(), config=TransportConfig(connect_timeout_ms=5_000)))
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=10)
    assert started.wait(10)
    yield holder[0].port
    asyncio.run_coroutine_threadsafe(holder[0].close(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=hostile())
def test_hostile_input_gets_clear_errors_and_the_server_keeps_serving(
        server_port: int, case: tuple[str, bytes]) -> None:
    check_case(server_port, FINGERPRINT, case)
    append_works(server_port, FINGERPRINT)
