"""Client side of the node-to-node transport: one persistent connection per peer node.

``PeerPool`` connects lazily on the first message for a peer, sends HELLO, and queues requests
(at most ``peer_requests_inflight_max`` per peer) until the HELLO reply arrives. Each request
gets a fresh correlation id and exactly one callback, always from a later loop iteration: the
reply, or the ``Status`` that ended it. A failed connect puts the peer into a backoff (doubling
from ``RECONNECT_BACKOFF_MS_MIN`` up to ``reconnect_backoff_ms_max``) during which requests
fail at once, so that a dead node never stalls its callers. A lost connection fails everything
pending on it; the next request reconnects.

Per peer: IDLE -> CONNECTING -> CONNECTED -> IDLE, or CONNECTING -> BACKOFF -> IDLE.

A node's pool (``security`` given) proves itself to its peers and checks that they are nodes
too (``shared.net.node_auth``): over TLS with its node certificate, and with the cluster secret
when it has one (the AUTH frame goes out right behind the HELLO_REPLY, ahead of the queued
requests, so the challenge costs no extra round trip). A client's pool (``client_ssl``) only
verifies the nodes' certificates and host names.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from shared.config import TransportConfig
from shared.net.connection import (
    OUTPUT_BUFFER_BYTES_MAX,
    FramedProtocol,
    TlsReads,
    wait_lost,
)
from shared.net.node_auth import Exchange, NodeSecurity, new_nonce
from shared.net.types import Counters, RequestCallback
from shared.status import Status
from shared.tls import is_node_cert
from shared.types import NodeId
from shared.wire.codec import (
    Message,
    encode,
    encode_fields,
    encode_parts,
    encode_store_batch_parts,
)
from shared.wire.hello import NODE_PROTOCOL_VERSION, Auth, Hello, HelloReply
from shared.wire.store_batch import StoreBatch

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_MS_MIN = 10
CLOSE_WAIT_S = 5.0

AddressFn = Callable[[NodeId], "tuple[str, int] | None"]


def _invoke(callback: RequestCallback, result: Message | Status) -> None:
    # One caller's bug must not tear down the connection that carries everyone's replies.
    try:
        callback(result)
    except Exception:
        log.exception("request callback %r failed", callback)


class _ClientProtocol(FramedProtocol):
    __slots__ = ("_peer", "hello_reply")

    def __init__(self, peer: _Peer, counters: Counters) -> None:
        super().__init__(counters)
        self._peer = peer
        self.hello_reply: asyncio.Future[HelloReply | Status] = self._loop.create_future()

    def _on_frame(self, correlation_id: int, message: Message) -> None:
        if self.hello_reply.done():
            self._peer.on_reply(self, correlation_id, message)
        elif correlation_id == 0 and type(message) is HelloReply:
            assert isinstance(message, HelloReply)
            self.hello_reply.set_result(message)
        else:
            self.desync(f"expected HELLO_REPLY, got {type(message).__name__}")

    def _on_closed(self, status: Status) -> None:
        if not self.hello_reply.done():
            self.hello_reply.set_result(status)
        else:
            self._peer.on_connection_closed(self, status)


class _TlsClientProtocol(_ClientProtocol, TlsReads):
    __slots__ = ()


class _Peer:
    """Connection state, pending requests and backoff for one remote node."""

    __slots__ = (
        "_abandoned",
        "_backoff_ms",
        "_failure_status",
        "_loop",
        "_next_correlation_id",
        "_outbox",
        "_pending",
        "_pool",
        "_retry_at_s",
        "_timers",
        "conn",
        "connect_task",
        "node",
    )

    def __init__(self, node: NodeId, pool: PeerPool) -> None:
        self.node = node
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self.conn: _ClientProtocol | None = None
        self.connect_task: asyncio.Task[None] | None = None
        self._pending: dict[int, RequestCallback] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._abandoned: set[int] = set()
        """Correlation ids whose caller timed out: their late replies are dropped, not a
        desync."""
        self._outbox: list[tuple[bytes, ...]] = []
        """Frames waiting for the HELLO exchange to finish."""
        self._next_correlation_id = 1
        self._backoff_ms = 0
        self._retry_at_s = 0.0
        self._failure_status = Status.CONNFAILED

    @property
    def inflight(self) -> int:
        return len(self._pending)

    def request(self, message: Message, callback: RequestCallback,
                timeout_ms: int | None) -> None:
        loop = self._loop
        if len(self._pending) >= self._pool.config.peer_requests_inflight_max:
            loop.call_soon(callback, Status.OVERLOADED)
            return
        conn = self.conn
        if conn is None:
            status = self._start_connecting() if self.connect_task is None else None
            if status is None and len(self._outbox) >= self._pool.config.peer_requests_inflight_max:
                status = Status.OVERLOADED
            if status is not None:
                loop.call_soon(callback, status)
                return
        elif conn.buffered_bytes() >= OUTPUT_BUFFER_BYTES_MAX:
            loop.call_soon(callback, Status.OVERLOADED)
            return
        correlation_id = self._next_correlation_id
        if type(message) is StoreBatch:
            # Its STOREs' packed fields go out as parts, not joined into one copy.
            frame: tuple[bytes, ...] = encode_store_batch_parts(message, correlation_id)
        else:
            frame = encode_parts(message, self._pool.fields_of(message), correlation_id)
        self._next_correlation_id = correlation_id + 1
        self._pending[correlation_id] = callback
        if timeout_ms is not None:
            self._timers[correlation_id] = loop.call_later(
                timeout_ms / 1000, self._on_request_timeout, correlation_id)
        if conn is None:
            self._outbox.append(frame)
        else:
            conn.send_parts(frame)

    def send(self, message: Message) -> bool:
        conn = self.conn
        if conn is None:
            if self.connect_task is None and self._start_connecting() is not None:
                return False
            if len(self._outbox) >= self._pool.config.peer_requests_inflight_max:
                return False
            self._outbox.append((encode(message),))
            return True
        if conn.buffered_bytes() >= OUTPUT_BUFFER_BYTES_MAX:
            return False
        conn.send(encode(message))
        return True

    def on_reply(self, conn: _ClientProtocol, correlation_id: int, message: Message) -> None:
        callback = self._pending.pop(correlation_id, None)
        if callback is None:
            if correlation_id in self._abandoned:
                self._abandoned.discard(correlation_id)
            else:
                conn.desync(f"reply with unknown correlation id {correlation_id}")
            return
        if self._timers:
            timer = self._timers.pop(correlation_id, None)
            if timer is not None:
                timer.cancel()
        _invoke(callback, message)

    def on_connection_closed(self, conn: _ClientProtocol, status: Status) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        # These requests reached a live connection: the peer may have acted on them.
        self.fail_all(Status.PEER_CLOSED if status is Status.CONNFAILED else status)

    def fail_all(self, status: Status) -> None:
        pending = self._pending
        self._pending = {}
        for timer in self._timers.values():
            timer.cancel()
        self._timers = {}
        self._abandoned = set()
        self._outbox = []
        for callback in pending.values():
            _invoke(callback, status)

    def _on_request_timeout(self, correlation_id: int) -> None:
        self._timers.pop(correlation_id, None)
        callback = self._pending.pop(correlation_id, None)
        if callback is None:
            return
        self._abandoned.add(correlation_id)
        if len(self._abandoned) > self._pool.config.peer_requests_inflight_max:
            # The peer leaves that many requests unanswered: treat it as dead, not slow.
            log.warning("%s left %d requests unanswered; reconnecting", self.node,
                        len(self._abandoned))
            if self.conn is not None:
                self.conn.abort(Status.CONNFAILED)
        _invoke(callback, Status.TIMEDOUT)

    # ----- connecting

    def _start_connecting(self) -> Status | None:
        """Start a connect attempt, or say why requests must fail right now."""
        if self._loop.time() < self._retry_at_s:
            return self._failure_status
        address = self._pool.addresses(self.node)
        if address is None:
            return Status.CONNFAILED
        self.connect_task = self._loop.create_task(self._connect(address[0], address[1]))
        return None

    async def _connect(self, host: str, port: int) -> None:
        pool = self._pool
        conn: _ClientProtocol | None = None
        result: HelloReply | Status = Status.CONNFAILED
        security = pool.security
        nonce = new_nonce() if security.secrets else b""
        hello = Hello(node_id=pool.node_id, protocol_version=NODE_PROTOCOL_VERSION,
                      cluster_fingerprint=pool.cluster_fingerprint, auth_nonce=nonce,
                      token=pool.token)
        context = pool.ssl_context()
        try:
            async with asyncio.timeout(pool.config.connect_timeout_ms / 1000):
                kind = _ClientProtocol if context is None else _TlsClientProtocol
                _, conn = await self._loop.create_connection(
                    lambda: kind(self, pool.counters), host, port, ssl=context)
                conn.send(encode(hello))
                result = await conn.hello_reply
        except (OSError, TimeoutError) as error:
            log.debug("connect to %s at %s:%d failed: %r", self.node, host, port, error)
        except Exception:
            log.exception("connect to %s at %s:%d failed", self.node, host, port)
        except asyncio.CancelledError:
            self.connect_task = None
            if conn is not None:
                conn.abort(Status.SHUTDOWN)
            raise
        self.connect_task = None
        if (conn is not None and isinstance(result, HelloReply) and result.status == Status.OK
                and result.node_id == self.node and not conn.closed):
            auth = self._authenticate(conn, result, nonce, f"{host}:{port}")
            if auth is not None:
                self._on_connected(conn, auth)
                return
            result = Status.PROTONOSUPPORT
        if conn is not None:
            conn.abort(Status.CONNFAILED)
        self._on_connect_failed(result, host, port)

    def _authenticate(self, conn: _ClientProtocol, reply: HelloReply, nonce: bytes,
                      address: str) -> list[tuple[bytes, ...]] | None:
        """Check that the peer is a cluster node, when we are one that must; the frames that
        prove us in turn (AUTH, or nothing); None if the peer did not prove itself."""
        security = self._pool.security
        if not security.required:
            return []
        if security.tls is not None and is_node_cert(
                conn.transport_extra("peercert")):
            proven = True
        else:
            exchange = Exchange(fingerprint=self._pool.cluster_fingerprint,
                                client_id=self._pool.node_id, server_id=self.node,
                                client_nonce=nonce, server_nonce=reply.auth_nonce)
            proven = bool(nonce) and security.check(reply.auth_proof, exchange, server_side=True)
            if not proven:
                reason = "not_node_cert" if security.tls is not None else "bad_server_proof"
                security.failures.add(reason, address,
                                      f"{self.node} did not prove it is a cluster node")
                return None
        if not reply.auth_nonce:
            return []
        exchange = Exchange(fingerprint=self._pool.cluster_fingerprint,
                            client_id=self._pool.node_id, server_id=self.node,
                            client_nonce=nonce, server_nonce=reply.auth_nonce)
        proof = security.prove(exchange, server_side=False)
        if not proof:
            log.warning("%s at %s wants the cluster secret, which we do not have", self.node,
                        address)
            return None
        return [(encode(Auth(proof=proof)),)]

    def _on_connected(self, conn: _ClientProtocol, first: list[tuple[bytes, ...]]) -> None:
        self.conn = conn
        self._backoff_ms = 0
        self._retry_at_s = 0.0
        self._pool.counters.connects += 1
        outbox = self._outbox
        self._outbox = []
        conn.send_many(first + outbox if first else outbox)

    def _on_connect_failed(self, result: HelloReply | Status, host: str, port: int) -> None:
        status = Status.PROTONOSUPPORT if result is Status.PROTONOSUPPORT else Status.CONNFAILED
        if isinstance(result, HelloReply) and result.status != Status.OK:
            status = result.status
            log.warning("%s at %s:%d refused our HELLO: %s", self.node, host, port,
                        result.status.name)
        elif isinstance(result, HelloReply) and result.node_id != self.node:
            log.warning("expected %s at %s:%d but found %s", self.node, host, port,
                        result.node_id)
        config = self._pool.config
        self._pool.counters.connect_failures += 1
        self._backoff_ms = min(max(self._backoff_ms * 2, RECONNECT_BACKOFF_MS_MIN),
                               config.reconnect_backoff_ms_max)
        self._retry_at_s = self._loop.time() + self._backoff_ms / 1000
        self._failure_status = status
        self.fail_all(status)


class PeerPool:
    """Client side: one persistent connection per peer node, created lazily, reconnected with
    capped backoff."""

    def __init__(self, *, node_id: NodeId, cluster_fingerprint: str, config: TransportConfig,
                 addresses: AddressFn, security: NodeSecurity | None = None,
                 client_ssl: ssl.SSLContext | None = None, token: str = "") -> None:
        self.node_id = node_id
        self.cluster_fingerprint = cluster_fingerprint
        self.token = token
        """A client's bearer token for its HELLO (docs/SECURITY.md); empty from nodes."""
        self.config = config
        self.addresses = addresses
        self.security = security if security is not None else NodeSecurity.open()
        self._client_ssl = client_ssl
        self.counters = Counters()
        self._peers: dict[NodeId, _Peer] = {}
        self._closed = False
        self._last_fields: tuple[Message | None, bytes] = (None, b"")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context of the next connection: the node's current one (reloadable), or the
        client's, or None for plain TCP."""
        if self.security.tls is not None:
            return self.security.tls.node_client
        return self._client_ssl

    def fields_of(self, message: Message) -> bytes:
        """The packed fields of ``message``, packed once when it goes to several peers in a row
        (a STORE to its copyset): a one-entry cache keyed by the message object itself."""
        last, packed = self._last_fields
        if last is not message:
            packed = encode_fields(message)
            self._last_fields = (message, packed)
        return packed

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None:
        """Send a request; ``callback`` runs exactly once, always in a later loop iteration.

        It gets the reply, or: CONNFAILED (unknown node, could not connect, connection lost
        while pending), PROTONOSUPPORT (the peer refused our HELLO), OVERLOADED
        (``peer_requests_inflight_max`` pending for that peer, or its output buffer is full),
        BADMSG (the connection desynced), SHUTDOWN (pool closed), TIMEDOUT (only with
        ``timeout_ms``; a late reply is then dropped).
        """
        if self._closed:
            asyncio.get_running_loop().call_soon(callback, Status.SHUTDOWN)
            return
        peer = self._peers.get(node)
        if peer is None:
            peer = self._add_peer(node)
            if peer is None:
                asyncio.get_running_loop().call_soon(callback, Status.CONNFAILED)
                return
        peer.request(message, callback, timeout_ms)

    async def call(self, node: NodeId, message: Message, timeout_ms: int) -> Message | Status:
        """``request`` as a coroutine; TIMEDOUT after ``timeout_ms``. Cancelling it abandons
        the request (its reply is dropped)."""
        future: asyncio.Future[Message | Status] = asyncio.get_running_loop().create_future()

        def done(result: Message | Status) -> None:
            if not future.done():
                future.set_result(result)

        self.request(node, message, done, timeout_ms=timeout_ms)
        return await future

    def send(self, node: NodeId, message: Message) -> bool:
        """One-way, best effort: False if dropped now (closed, unknown node, in backoff, or
        too much queued); True does not mean the peer got it."""
        if self._closed:
            return False
        peer = self._peers.get(node) or self._add_peer(node)
        return peer is not None and peer.send(message)

    def connected(self, node: NodeId) -> bool:
        peer = self._peers.get(node)
        return peer is not None and peer.conn is not None

    def inflight(self, node: NodeId) -> int:
        peer = self._peers.get(node)
        return 0 if peer is None else peer.inflight

    def _add_peer(self, node: NodeId) -> _Peer | None:
        # Only nodes with an address get state, so bogus ids cannot grow the pool.
        if self.addresses(node) is None:
            return None
        peer = _Peer(node, self)
        self._peers[node] = peer
        return peer

    async def close(self) -> None:
        """Fail every pending request with SHUTDOWN and close every connection."""
        if self._closed:
            return
        self._closed = True
        connections: list[FramedProtocol] = []
        tasks: list[asyncio.Task[None]] = []
        for peer in self._peers.values():
            if peer.connect_task is not None:
                peer.connect_task.cancel()
                tasks.append(peer.connect_task)
            if peer.conn is not None:
                connections.append(peer.conn)
                peer.conn.close(Status.SHUTDOWN)
            peer.fail_all(Status.SHUTDOWN)
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        await wait_lost(connections, CLOSE_WAIT_S)
