"""Fuzz of the HELLO / AUTH exchange (shared.net.node_auth) on a data port that requires the
cluster secret: whatever a peer without the secret sends first (HELLOs with any node id,
version, fingerprint and challenge, AUTH frames with any proof, malformed HELLO and AUTH
bodies, node-only messages pipelined behind them), no node-only message reaches the handler,
the connection ends, nothing crashes, and a node that knows the secret is served right after."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.certs import make_secret
from shared.config import TransportConfig
from shared.net import Server, start_server
from shared.net.node_auth import NONCE_BYTES, Exchange, NodeSecurity, load_secrets, proof
from shared.status import Status
from shared.types import NodeId
from shared.wire.codec import decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.hello import Auth, Hello, HelloReply
from shared.wire.message_type import MessageType
from shared.wire.store import Stored
from tests.unit.net.transport_helpers import Handler, store

FINGERPRINT = "fp-auth-fuzz"
SERVER = NodeId("n1")
ANSWER_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, bytes, Handler]]:
    """A secret-protected server on its own loop in a thread; the test talks plain sockets."""
    secret_file = make_secret(tmp_path_factory.mktemp("auth-fuzz") / "secret")
    loop = asyncio.new_event_loop()
    handler = Handler()
    holder: list[Server] = []

    async def serve() -> None:
        holder.append(await start_server(
            "127.0.0.1", 0, node_id=SERVER, cluster_fingerprint=FINGERPRINT, handler=handler,
            config=TransportConfig(connect_timeout_ms=2_000),
            security=NodeSecurity(secret_file=str(secret_file))))

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=10)
    yield holder[0].port, load_secrets(str(secret_file))[0], handler
    asyncio.run_coroutine_threadsafe(holder[0].close(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def _raw(message_type: int, fields: list[Any]) -> bytes:
    body = msgpack.packb([message_type, 0, fields], use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


_node_ids = st.sampled_from(["n2", "st1", "seq1", "client.x", "", "client.", "x" * 80,
                             "bad id", "n1"])
_bytes = st.binary(max_size=40) | st.just(b"n" * NONCE_BYTES)
_fields = st.lists(st.one_of(st.integers(-2, 2**40), st.text(max_size=8), st.binary(max_size=8),
                             st.none(), st.booleans()), max_size=6)

_hello = st.builds(
    lambda node_id, version, fingerprint, nonce: encode(Hello(
        node_id=NodeId(node_id), protocol_version=version, cluster_fingerprint=fingerprint,
        auth_nonce=nonce)),
    _node_ids, st.integers(0, 3), st.sampled_from([FINGERPRINT, "other", ""]), _bytes)
_auth = st.builds(lambda p: encode(Auth(proof=p)), _bytes)
_malformed = st.builds(_raw, st.sampled_from([int(MessageType.HELLO), int(MessageType.AUTH),
                                              int(MessageType.HELLO_REPLY)]), _fields)
_node_only = st.builds(lambda lsn, cid: encode(store(lsn), cid), st.integers(1, 9),
                       st.integers(0, 3))
_frames = st.lists(st.one_of(_hello, _auth, _malformed, _node_only), min_size=1, max_size=4)


def _exchange(sock: socket.socket, frames: bytes) -> list[Any]:
    """Send ``frames``, then read until the server closes or goes quiet; the messages read."""
    sock.sendall(frames)
    decoder = FrameDecoder()
    messages: list[Any] = []
    sock.settimeout(0.3)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break  # still open, waiting for more (a client after its HELLO, say)
        except OSError:
            break
        if not data:
            break
        for body in decoder.feed(data):
            decoded = decode(body)
            assert not isinstance(decoded, Status)
            messages.append(decoded[1])
    return messages


def _node_with_the_secret_stores(port: int, secret: bytes, handler: Handler) -> None:
    before = len(handler.store_lsns())
    nonce = b"c" * NONCE_BYTES
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S) as sock:
        sock.sendall(encode(Hello(node_id=NodeId("n2"), protocol_version=1,
                                  cluster_fingerprint=FINGERPRINT, auth_nonce=nonce)))
        decoder = FrameDecoder()
        reply = None
        while reply is None:
            for body in decoder.feed(sock.recv(65536)):
                decoded = decode(body)
                assert not isinstance(decoded, Status)
                reply = decoded[1]
        assert isinstance(reply, HelloReply) and reply.status is Status.OK
        exchange = Exchange(fingerprint=FINGERPRINT, client_id="n2", server_id=SERVER,
                            client_nonce=nonce, server_nonce=reply.auth_nonce)
        assert reply.auth_proof == proof(secret, exchange, server_side=True)
        sock.sendall(encode(Auth(proof=proof(secret, exchange, server_side=False)))
                     + encode(store(100), 1))
        answers: list[Any] = []
        while not answers:
            for body in decoder.feed(sock.recv(65536)):
                decoded = decode(body)
                assert not isinstance(decoded, Status)
                answers.append(decoded[1])
        assert isinstance(answers[0], Stored)
    assert len(handler.store_lsns()) == before + 1


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(frames=_frames)
def test_no_node_message_without_the_secret(served: tuple[int, bytes, Handler],
                                            frames: list[bytes]) -> None:
    port, secret, handler = served
    handler.received.clear()
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S) as sock:
        answers = _exchange(sock, b"".join(frames))
    assert all(isinstance(a, HelloReply) for a in answers), answers
    # Only a client may have got through, and a client's STOREs are refused.
    assert handler.store_lsns() == [], handler.received
    assert all(peer.startswith("client.") for peer, _ in handler.received)
    _node_with_the_secret_stores(port, secret, handler)


def test_the_honest_exchange(served: tuple[int, bytes, Handler], tmp_path: Path) -> None:
    port, secret, handler = served
    _node_with_the_secret_stores(port, secret, handler)
