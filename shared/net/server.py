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

A peer naming itself a node must prove it belongs to the cluster when the node has a CA or a
cluster secret (``shared.net.node_auth``): with a node certificate (mutual TLS), or by
answering the HELLO_REPLY's challenge with AUTH before anything else. Until then it is not a
peer: its frames reach no handler. With ``NodeSecurity.tls`` every connection starts with a TLS
handshake with the certificates current at accept time (``shared.tls``).

One client address holds at most ``addresses_max`` connections (and, with TLS, as many
handshakes under way): past it a new socket is closed before HELLO, so one flooding host cannot
take the connection slots of the others (``shared.net.address_limit``). A peer that proves it is
a node gives its address's slot back.
"""

from __future__ import annotations

import asyncio
import logging

from shared.config import TransportConfig
from shared.net.address_limit import AddressLimit, peer_ip
from shared.net.connection import FramedProtocol, TlsReads, wait_lost
from shared.net.node_auth import NONCE_BYTES, Exchange, NodeSecurity, new_nonce
from shared.net.tls_listener import TlsListener, start_tls_listener
from shared.net.types import Counters, MessageHandler, ReplyFn
from shared.security.auth import Authenticator, Denied
from shared.security.data_port import ClientGuard, refusal
from shared.status import Status
from shared.tls import is_node_cert
from shared.types import Lsn, NodeId, is_client_id, node_id_valid
from shared.wire.append import Append, Appended
from shared.wire.codec import Message, encode
from shared.wire.hello import (
    CLIENT_APPEND_VERSION,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
    Auth,
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
        "_address",
        "_addresses",
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
        "_node_cert",
        "_node_id",
        "_peer",
        "_pending_auth",
        "_security",
        "appends_inflight",
        "reads_inflight",
    )

    def __init__(self, *, node_id: NodeId, cluster_fingerprint: str, handler: MessageHandler,
                 config: TransportConfig, counters: Counters,
                 connections: dict[_ServerProtocol, None], security: NodeSecurity,
                 auth: Authenticator | None = None, connections_max: int = 0,
                 addresses: AddressLimit | None = None) -> None:
        super().__init__(counters)
        self._addresses = addresses
        self._address: str | None = None
        """The client address whose slot this connection holds, until it closes."""
        self._security = security
        self._node_cert = False
        """Whether the peer showed a node certificate signed by the cluster CA."""
        self._pending_auth: tuple[NodeId, Exchange] | None = None
        """A node peer that must send AUTH next: its id, the exchange its proof covers."""
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
        if self._security.tls is not None:
            self._node_cert = is_node_cert(transport.get_extra_info("peercert"))
        addresses = self._addresses
        if addresses is not None:
            ip = peer_ip(transport.get_extra_info("peername"))
            if not addresses.acquire(ip):
                self._counters.refused_per_address += 1
                self.abort(Status.OVERLOADED)
                return
            self._address = ip
        if self._connections_max and len(self._connections) >= self._connections_max:
            # A flood must not lock clients out: make room by closing the oldest connection
            # that has not said HELLO yet (the dict keeps them in arrival order), else refuse
            # this one.
            waiting = next((c for c in self._connections if c._peer is None), None)
            if waiting is None:
                log.warning("refusing a connection from %s: %d connections open",
                            self.peer_address(), len(self._connections))
                self._counters.refused_full += 1
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
            self._security.failures.add("client_sent_node_message", self.peer_address(),
                                        f"client {peer} sent {type(message).__name__}")
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
        if self._pending_auth is not None:
            self._on_auth(message)
            return
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
        allowed: frozenset[type] | None = None
        if self._auth is not None and is_client_id(message.node_id):
            guard = ClientGuard.hello(self._auth, message.token)
            if isinstance(guard, Denied):
                self.send(encode(HelloReply(status=guard.status, node_id=self._node_id)))
                log.warning("refusing client %r at %s: %s", message.node_id,
                            self.peer_address(), guard.message)
                self.close(guard.status)
                return
            self._guard = guard
        if is_client_id(message.node_id):
            allowed = (CLIENT_APPEND_MESSAGES if message.protocol_version >= CLIENT_APPEND_VERSION
                       else CLIENT_MESSAGES)
        security = self._security
        if allowed is not None or not security.required:
            self.send(encode(HelloReply(status=Status.OK, node_id=self._node_id)))
            self._accept(message.node_id, allowed)
            return
        # A node: it proves itself with its certificate, or with the cluster secret.
        nonce = message.auth_nonce
        exchange = Exchange(fingerprint=self._fingerprint, client_id=message.node_id,
                            server_id=self._node_id, client_nonce=nonce,
                            server_nonce=b"" if self._node_cert else new_nonce())
        server_proof = (security.prove(exchange, server_side=True)
                        if len(nonce) == NONCE_BYTES else b"")
        if self._node_cert:
            self.send(encode(HelloReply(status=Status.OK, node_id=self._node_id,
                                        auth_proof=server_proof)))
            self._accept(message.node_id, None)
            return
        if not server_proof:
            reason = "not_node_cert" if security.tls is not None else "no_proof"
            security.failures.add(reason, self.peer_address(),
                                  f"{message.node_id!r} claims to be a node without a node "
                                  "certificate or a cluster secret challenge")
            self.send(encode(HelloReply(status=Status.PROTONOSUPPORT, node_id=self._node_id)))
            self.close(Status.PROTONOSUPPORT)
            return
        self.send(encode(HelloReply(status=Status.OK, node_id=self._node_id,
                                    auth_nonce=exchange.server_nonce, auth_proof=server_proof)))
        self._pending_auth = (message.node_id, exchange)
        self._hello_timer = self._loop.call_later(self._hello_timeout_s,
                                                  self._on_hello_timeout)

    def _on_auth(self, message: Message) -> None:
        """The frame after a challenge: must be AUTH with a good proof, else the peer goes."""
        pending = self._pending_auth
        assert pending is not None
        self._pending_auth = None
        self._cancel_hello_timer()
        node_id, exchange = pending
        if type(message) is not Auth:
            self._security.failures.add("no_proof", self.peer_address(),
                                        f"{node_id!r} sent {type(message).__name__} "
                                        "instead of AUTH")
            self.abort(Status.PROTONOSUPPORT)
            return
        assert isinstance(message, Auth)
        if not self._security.check(message.proof, exchange, server_side=False):
            self._security.failures.add("bad_proof", self.peer_address(),
                                        f"{node_id!r} does not know the cluster secret")
            self.abort(Status.PROTONOSUPPORT)
            return
        self._accept(node_id, None)

    def _accept(self, node_id: NodeId, allowed: frozenset[type] | None) -> None:
        self._peer = node_id
        self._allowed = allowed
        if allowed is None and self._security.required:
            self._release_address()

    def _release_address(self) -> None:
        if self._address is not None and self._addresses is not None:
            self._addresses.release(self._address)
        self._address = None

    def _on_hello_timeout(self) -> None:
        self._hello_timer = None
        if self._pending_auth is not None:
            self._security.failures.add("no_proof", self.peer_address(),
                                        f"{self._pending_auth[0]!r} sent no AUTH in time")
        log.warning("no HELLO from %s in time; closing", self.peer_address())
        self.abort(Status.TIMEDOUT)

    def _cancel_hello_timer(self) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None

    def _on_closed(self, status: Status) -> None:
        self._cancel_hello_timer()
        self._release_address()
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


class _TlsServerProtocol(_ServerProtocol, TlsReads):
    __slots__ = ()


class Server:
    """A listening node-to-node endpoint; ``close()`` stops accepting and closes every
    connection."""

    def __init__(self, server: asyncio.Server | TlsListener,
                 connections: dict[_ServerProtocol, None], counters: Counters,
                 security: NodeSecurity) -> None:
        self._server = server
        self._connections = connections
        self.counters = counters
        self.security = security

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
                       security: NodeSecurity | None = None,
                       auth: Authenticator | None = None, connections_max: int = 0,
                       addresses_max: int = 0, counters: Counters | None = None) -> Server:
    """Listen on ``host:port`` (0 picks a free port, see ``Server.port``). Without
    ``security`` the port is open: any peer may claim to be a node. ``auth`` checks clients'
    credentials; ``connections_max`` bounds the connections open at once, ``addresses_max``
    those from one address (0: no bound). ``counters``: where to count (the caller's, to
    export them)."""
    loop = asyncio.get_running_loop()
    counters = counters if counters is not None else Counters()
    addresses = AddressLimit(addresses_max, "connections") if addresses_max else None
    connections: dict[_ServerProtocol, None] = {}
    guard = security if security is not None else NodeSecurity.open()

    kind = _ServerProtocol if guard.tls is None else _TlsServerProtocol

    def make_protocol() -> _ServerProtocol:
        return kind(node_id=node_id, cluster_fingerprint=cluster_fingerprint,
                               handler=handler, config=config, counters=counters,
                               connections=connections, security=guard, auth=auth,
                               connections_max=connections_max, addresses=addresses)

    def count_refusal() -> None:
        counters.refused_per_address += 1

    tls = guard.tls
    server: asyncio.Server | TlsListener
    if tls is None:
        server = await loop.create_server(make_protocol, host, port)
    else:
        server = await start_tls_listener(
            host, port, make_protocol, lambda: tls.data_server,
            handshake_timeout_s=config.connect_timeout_ms / 1000,
            on_failure=lambda peer, exc: guard.failures.add("tls_handshake", peer, repr(exc)),
            handshakes_per_address_max=addresses_max, on_address_full=count_refusal)
    return Server(server, connections, counters, guard)
