"""Server side of the node's data port: accepts connections from nodes and binary clients,
checks each peer's HELLO, then hands every request to a ``MessageHandler`` with a ``ReplyFn``
bound to its correlation id.

A connection must open with HELLO (correlation id 0) within ``connect_timeout_ms``. The server
answers ``HelloReply(OK, its node id)``, or ``HelloReply(PROTONOSUPPORT)`` followed by a close
when the protocol version is outside ``PROTOCOL_VERSION_MIN .. PROTOCOL_VERSION`` or the
cluster fingerprint differs. Replies are coalesced like every other frame (see
``shared.net.connection``). When the peer stops reading our replies (``pause_writing``), we
stop reading its requests until it catches up.

Clients (``client.*`` peers) may send only ``CLIENT_MESSAGES``, and APPEND when they announced
``CLIENT_APPEND_VERSION``; anything else (a STORE, a SEAL, gossip, or an APPEND claiming
forwarding hops) closes the connection before a handler sees it. A client connection holds at
most ``client_appends_inflight_max`` appends unanswered; one more is answered OVERLOADED at
once and never reaches the handler, so nothing is written (docs/PROTOCOL.md).
"""

from __future__ import annotations

import asyncio
import logging

from shared.config import TransportConfig
from shared.net.connection import FramedProtocol, wait_lost
from shared.net.types import Counters, MessageHandler, ReplyFn
from shared.security.auth import Authenticator, Denied
from shared.security.data_port import ClientGuard, refusal
from shared.status import Status
from shared.types import Lsn, NodeId, is_client_id, node_id_valid
from shared.wire.append import Append, Appended
from shared.wire.codec import Message, encode
from shared.wire.hello import (
    CLIENT_APPEND_VERSION,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
    Hello,
    HelloReply,
)
from shared.wire.read import GetLogState, Read
from shared.wire.trim import FindTime

log = logging.getLogger(__name__)

CLIENT_MESSAGES: frozenset[type] = frozenset({Read, GetLogState, FindTime})
"""What any client connection may send; with ``CLIENT_APPEND_VERSION`` also APPEND. Anything
else closes it."""
CLIENT_APPEND_MESSAGES: frozenset[type] = CLIENT_MESSAGES | {Append}

CLOSE_WAIT_S = 5.0
"""How long ``Server.close`` waits for sockets to go away before giving up on them."""


def _no_reply(message: Message) -> None:
    """The ``ReplyFn`` of one-way messages."""


class _Reply:
    """Sends one reply with the request's correlation id; later calls are ignored."""

    __slots__ = ("_conn", "_correlation_id")

    def __init__(self, conn: _ServerProtocol, correlation_id: int) -> None:
        self._conn: _ServerProtocol | None = conn
        self._correlation_id = correlation_id

    def __call__(self, message: Message) -> None:
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.send(encode(message, self._correlation_id))


class _AppendReply(_Reply):
    """The reply of one client APPEND: also frees its place under the connection's in-flight
    bound."""

    __slots__ = ()

    def __call__(self, message: Message) -> None:
        conn = self._conn
        if conn is not None:
            conn.appends_inflight -= 1
            super().__call__(message)


class _ReadReply(_Reply):
    """The reply of one client READ, GET_LOG_STATE or FIND_TIME: also frees its place under
    the connection's in-flight bound."""

    __slots__ = ()

    def __call__(self, message: Message) -> None:
        conn = self._conn
        if conn is not None:
            conn.reads_inflight -= 1
            super().__call__(message)


def _overloaded(message: Append, inflight_max: int) -> Appended:
    return Appended(status=Status.OVERLOADED, log_id=message.log_id, first_lsn=Lsn(0),
                    last_lsn=Lsn(0), timestamp_ms=0, sequencer_node=None,
                    message=f"{inflight_max} appends already in flight on this connection; "
                            "nothing written")


class _ServerProtocol(FramedProtocol):
    __slots__ = (
        "_allowed",
        "_appends_inflight_max",
        "_auth",
        "_connections",
        "_connections_max",
        "_fingerprint",
        "_guard",
        "_handler",
        "_hello_timeout_s",
        "_hello_timer",
        "_node_id",
        "_peer",
        "appends_inflight",
        "reads_inflight",
    )

    def __init__(self, *, node_id: NodeId, cluster_fingerprint: str, handler: MessageHandler,
                 config: TransportConfig, counters: Counters,
                 connections: dict[_ServerProtocol, None], auth: Authenticator | None = None,
                 connections_max: int = 0) -> None:
        super().__init__(counters)
        self._auth = auth if auth is not None and auth.enabled else None
        self._guard: ClientGuard | None = None
        """A client's credentials (docs/SECURITY.md), when auth is on."""
        self._connections_max = connections_max
        self._node_id = node_id
        self._fingerprint = cluster_fingerprint
        self._handler = handler
        self._connections = connections
        self._hello_timeout_s = config.connect_timeout_ms / 1000
        self._hello_timer: asyncio.TimerHandle | None = None
        self._peer: NodeId | None = None
        self._allowed: frozenset[type] | None = None
        """What the peer may send: None for a node (anything), a set for a client."""
        self._appends_inflight_max = config.client_appends_inflight_max
        self.appends_inflight = 0
        """Client APPENDs handed to the handler and not answered yet."""
        self.reads_inflight = 0
        """Other client requests (READ, GET_LOG_STATE, FIND_TIME) not answered yet."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._connections_max and len(self._connections) >= self._connections_max:
            # A flood must not lock clients out: make room by closing the oldest connection
            # that has not said HELLO yet (the dict keeps them in arrival order), else refuse
            # this one.
            waiting = next((c for c in self._connections if c._peer is None), None)
            if waiting is None:
                log.warning("refusing a connection from %s: %d connections open",
                            self.peer_address(), len(self._connections))
                self.abort(Status.OVERLOADED)
                return
            waiting.abort(Status.OVERLOADED)
        self._connections[self] = None
        self._hello_timer = self._loop.call_later(self._hello_timeout_s, self._on_hello_timeout)

    def _on_frame(self, correlation_id: int, message: Message) -> None:
        peer = self._peer
        if peer is None:
            self._on_hello(message)
            return
        if type(message) is Hello:
            self.desync("second HELLO")
            return
        allowed = self._allowed
        reply: ReplyFn
        if allowed is None:
            reply = _Reply(self, correlation_id) if correlation_id else _no_reply
        elif type(message) not in allowed:
            # A client reads and appends: it must not store, seal or gossip.
            self.desync(f"client {peer} sent {type(message).__name__}")
            return
        elif type(message) is Append:
            assert isinstance(message, Append)
            if message.hops != 0 or not correlation_id:
                # Only nodes forward: a client claiming hops could bypass the hop limit.
                self.desync(f"client {peer} sent APPEND with hops={message.hops} "
                            f"or without a correlation id")
                return
            if self.appends_inflight >= self._appends_inflight_max:
                self.send(encode(_overloaded(message, self._appends_inflight_max),
                                 correlation_id))
                return
            if self._guard is not None and (denied := self._guard.check(message)) is not None:
                self._refuse(correlation_id, message, denied)
                return
            self.appends_inflight += 1
            reply = _AppendReply(self, correlation_id)
        else:
            if self._guard is not None and (denied := self._guard.check(message)) is not None:
                self._refuse(correlation_id, message, denied)
                return
            if not correlation_id:
                reply = _no_reply
            elif self.reads_inflight >= self._appends_inflight_max:
                # Long-poll reads hold a node's memory: bounded per connection like appends.
                self._refuse(correlation_id, message, Denied(
                    Status.OVERLOADED, f"{self._appends_inflight_max} requests already in "
                                       "flight on this connection"))
                return
            else:
                self.reads_inflight += 1
                reply = _ReadReply(self, correlation_id)
        try:
            self._handler.on_message(peer, message, reply)
        except Exception:
            # A handler bug: closing makes the peer fail its requests now instead of waiting
            # for replies that will never come.
            log.exception("handler failed on %s from %s; closing", type(message).__name__, peer)
            self.abort(Status.INTERNAL)

    def _refuse(self, correlation_id: int, message: Message, denied: Denied) -> None:
        answer = refusal(message, denied)
        if answer is not None and correlation_id:
            self.send(encode(answer, correlation_id))
        if denied.status is Status.UNAUTHENTICATED:
            # Revoked or expired under a live connection: nothing more from it.
            log.warning("client %s at %s: %s; closing", self._peer, self.peer_address(),
                        denied.message)
            self.close(Status.UNAUTHENTICATED)

    def _on_hello(self, message: Message) -> None:
        self._cancel_hello_timer()
        if type(message) is not Hello:
            self.desync(f"expected HELLO, got {type(message).__name__}")
            return
        assert isinstance(message, Hello)
        accepted = (
            PROTOCOL_VERSION_MIN <= message.protocol_version <= PROTOCOL_VERSION
            and message.cluster_fingerprint == self._fingerprint
            and node_id_valid(message.node_id)
        )
        if not accepted:
            self.send(encode(HelloReply(status=Status.PROTONOSUPPORT, node_id=self._node_id)))
            log.warning("refusing peer %r at %s: protocol %d, fingerprint %r", message.node_id,
                        self.peer_address(), message.protocol_version,
                        message.cluster_fingerprint)
            self.close(Status.PROTONOSUPPORT)
            return
        if self._auth is not None and is_client_id(message.node_id):
            guard = ClientGuard.hello(self._auth, message.token)
            if isinstance(guard, Denied):
                self.send(encode(HelloReply(status=guard.status, node_id=self._node_id)))
                log.warning("refusing client %r at %s: %s", message.node_id,
                            self.peer_address(), guard.message)
                self.close(guard.status)
                return
            self._guard = guard
        self.send(encode(HelloReply(status=Status.OK, node_id=self._node_id)))
        self._peer = message.node_id
        if is_client_id(message.node_id):
            self._allowed = (CLIENT_APPEND_MESSAGES
                             if message.protocol_version >= CLIENT_APPEND_VERSION
                             else CLIENT_MESSAGES)

    def _on_hello_timeout(self) -> None:
        self._hello_timer = None
        log.warning("no HELLO from %s in time; closing", self.peer_address())
        self.abort(Status.TIMEDOUT)

    def _cancel_hello_timer(self) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None

    def _on_closed(self, status: Status) -> None:
        self._cancel_hello_timer()
        if self._guard is not None:
            self._guard.closed()
            self._guard = None
        self._connections.pop(self, None)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()


class Server:
    """A listening node-to-node endpoint; ``close()`` stops accepting and closes every
    connection."""

    def __init__(self, server: asyncio.Server, connections: dict[_ServerProtocol, None],
                 counters: Counters) -> None:
        self._server = server
        self._connections = connections
        self.counters = counters

    @property
    def port(self) -> int:
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def close(self) -> None:
        self._server.close()
        closing = list(self._connections)
        for conn in closing:
            conn.close(Status.SHUTDOWN)
        await wait_lost(closing, CLOSE_WAIT_S)
        await self._server.wait_closed()


async def start_server(host: str, port: int, *, node_id: NodeId, cluster_fingerprint: str,
                       handler: MessageHandler, config: TransportConfig,
                       auth: Authenticator | None = None, connections_max: int = 0) -> Server:
    """Listen on ``host:port`` (0 picks a free port, see ``Server.port``)."""
    loop = asyncio.get_running_loop()
    counters = Counters()
    connections: dict[_ServerProtocol, None] = {}

    def make_protocol() -> _ServerProtocol:
        return _ServerProtocol(node_id=node_id, cluster_fingerprint=cluster_fingerprint,
                               handler=handler, config=config, counters=counters,
                               connections=connections, auth=auth,
                               connections_max=connections_max)

    server = await loop.create_server(make_protocol, host, port)
    return Server(server, connections, counters)
