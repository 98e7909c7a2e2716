"""Server side of the node-to-node transport: accepts connections, checks each peer's HELLO,
then hands every request to a ``MessageHandler`` with a ``ReplyFn`` bound to its correlation id.

A connection must open with HELLO (correlation id 0) within ``connect_timeout_ms``. The server
answers ``HelloReply(OK, its node id)``, or ``HelloReply(PROTONOSUPPORT)`` followed by a close
when the protocol version or cluster fingerprint differs. Replies are coalesced like every
other frame (see ``shared.net.connection``). When the peer stops reading our replies
(``pause_writing``), we stop reading its requests until it catches up.
"""

from __future__ import annotations

import asyncio
import logging

from shared.config import TransportConfig
from shared.net.connection import FramedProtocol, wait_lost
from shared.net.types import Counters, MessageHandler
from shared.status import Status
from shared.types import NodeId, is_client_id, node_id_valid
from shared.wire.codec import Message, encode
from shared.wire.hello import PROTOCOL_VERSION, Hello, HelloReply
from shared.wire.read import GetLogState, Read
from shared.wire.trim import FindTime

log = logging.getLogger(__name__)

CLIENT_MESSAGES: frozenset[type] = frozenset({Read, GetLogState, FindTime})
"""What a client reader's connection may send; anything else closes it."""

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


class _ServerProtocol(FramedProtocol):
    __slots__ = (
        "_connections",
        "_fingerprint",
        "_handler",
        "_hello_timeout_s",
        "_hello_timer",
        "_node_id",
        "_peer",
    )

    def __init__(self, *, node_id: NodeId, cluster_fingerprint: str, handler: MessageHandler,
                 config: TransportConfig, counters: Counters,
                 connections: set[_ServerProtocol]) -> None:
        super().__init__(counters)
        self._node_id = node_id
        self._fingerprint = cluster_fingerprint
        self._handler = handler
        self._connections = connections
        self._hello_timeout_s = config.connect_timeout_ms / 1000
        self._hello_timer: asyncio.TimerHandle | None = None
        self._peer: NodeId | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._connections.add(self)
        self._hello_timer = self._loop.call_later(self._hello_timeout_s, self._on_hello_timeout)

    def _on_frame(self, correlation_id: int, message: Message) -> None:
        peer = self._peer
        if peer is None:
            self._on_hello(message)
            return
        if type(message) is Hello:
            self.desync("second HELLO")
            return
        if is_client_id(peer) and type(message) not in CLIENT_MESSAGES:
            # A reader's connection carries reads only: it must not store, seal or gossip.
            self.desync(f"client {peer} sent {type(message).__name__}")
            return
        reply = _Reply(self, correlation_id) if correlation_id else _no_reply
        try:
            self._handler.on_message(peer, message, reply)
        except Exception:
            # A handler bug: closing makes the peer fail its requests now instead of waiting
            # for replies that will never come.
            log.exception("handler failed on %s from %s; closing", type(message).__name__, peer)
            self.abort(Status.INTERNAL)

    def _on_hello(self, message: Message) -> None:
        self._cancel_hello_timer()
        if type(message) is not Hello:
            self.desync(f"expected HELLO, got {type(message).__name__}")
            return
        assert isinstance(message, Hello)
        accepted = (
            message.protocol_version == PROTOCOL_VERSION
            and message.cluster_fingerprint == self._fingerprint
            and node_id_valid(message.node_id)
        )
        status = Status.OK if accepted else Status.PROTONOSUPPORT
        self.send(encode(HelloReply(status=status, node_id=self._node_id)))
        if not accepted:
            log.warning("refusing peer %r at %s: protocol %d, fingerprint %r", message.node_id,
                        self.peer_address(), message.protocol_version,
                        message.cluster_fingerprint)
            self.close(Status.PROTONOSUPPORT)
            return
        self._peer = message.node_id

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
        self._connections.discard(self)

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

    def __init__(self, server: asyncio.Server, connections: set[_ServerProtocol],
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
                       handler: MessageHandler, config: TransportConfig) -> Server:
    """Listen on ``host:port`` (0 picks a free port, see ``Server.port``)."""
    loop = asyncio.get_running_loop()
    counters = Counters()
    connections: set[_ServerProtocol] = set()

    def make_protocol() -> _ServerProtocol:
        return _ServerProtocol(node_id=node_id, cluster_fingerprint=cluster_fingerprint,
                               handler=handler, config=config, counters=counters,
                               connections=connections)

    server = await loop.create_server(make_protocol, host, port)
    return Server(server, connections, counters)
