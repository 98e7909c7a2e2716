"""The client side of the binary protocol (docs/PROTOCOL.md): one pipelined, framed msgpack
connection per node's data port.

``BinaryConnection`` is an ``asyncio.Protocol`` (``shared.net.connection.FramedProtocol``):
requests leave with every other frame queued in the same loop iteration in one write, answers
come back by correlation id in any order, and each request's callback runs synchronously when
its answer is decoded, with no Task or timer per request. One sweep timer per connection
answers requests unanswered after ``timeout_ms`` with ``TIMEDOUT``. A connection that closes
fails what is pending with ``PEER_CLOSED`` (the node may have acted on it), whoever closed it.

``Connections`` keeps one connection per data address, connecting (TCP, then HELLO as
``client.<random>`` with the cluster fingerprint and ``PROTOCOL_VERSION``) on first use.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Callable, Hashable
from ssl import SSLContext
from typing import Any

from shared.net.connection import (
    OUTPUT_BUFFER_BYTES_MAX,
    FramedProtocol,
    TlsReads,
    wait_lost,
)
from shared.net.types import Counters
from shared.status import LogError, Status
from shared.types import CLIENT_ID_PREFIX, NodeId
from shared.wire.codec import Message, encode, encode_fields, encode_parts
from shared.wire.hello import (
    CLIENT_APPEND_MULTI_VERSION,
    CLIENT_APPEND_VERSION,
    PROTOCOL_VERSION,
    Hello,
    HelloReply,
)

log = logging.getLogger(__name__)

Callback = Callable[[Message | Status], None]
CLOSE_WAIT_S = 2.0
SWEEP_INTERVAL_S_MAX = 1.0
MARK_INTERVAL_S = 0.01
"""Requests sent within this long of each other share one deadline mark (that of the latest),
so timeouts cost no memory per request; a request times out at most this (plus the sweep
interval) late."""


def client_id() -> NodeId:
    """A fresh ``client.<random>`` name: the node lets such peers read and append only."""
    return NodeId(f"{CLIENT_ID_PREFIX}{os.urandom(6).hex()}")


def _invoke(callback: Callback, result: Message | Status) -> None:
    try:
        callback(result)
    except Exception:
        log.exception("binary request callback %r failed", callback)


HeldSender = Callable[["BinaryConnection", Any, list[Any]], None]
"""Turns the items held under one key during a loop iteration into requests
(``BinaryConnection.hold``)."""


class BinaryConnection(FramedProtocol):
    __slots__ = ("_held", "_held_sender", "_last_mark_s", "_marks", "_next_id", "_pending",
                 "_sweep", "_timeout_s", "hello_reply", "protocol_version")

    def __init__(self, counters: Counters, timeout_ms: int) -> None:
        super().__init__(counters)
        self._pending: dict[int, Callback] = {}
        """Callbacks by correlation id, in sending order (ids only grow)."""
        self._marks: collections.deque[tuple[float, int]] = collections.deque()
        """(deadline, first correlation id after the mark's requests): every request with a
        smaller id was sent by the deadline's send time, so it is due by the deadline."""
        self._last_mark_s = -MARK_INTERVAL_S
        self._next_id = 1
        self._timeout_s = timeout_ms / 1000
        self._sweep: asyncio.TimerHandle | None = None
        self._held: dict[Hashable, list[Any]] = {}
        """Items waiting for this loop iteration's flush, by key (``hold``)."""
        self._held_sender: HeldSender | None = None
        self.hello_reply: asyncio.Future[HelloReply | Status] = self._loop.create_future()
        self.protocol_version = PROTOCOL_VERSION
        """The version this connection's HELLO announced and the node accepted: at least
        ``CLIENT_APPEND_MULTI_VERSION`` lets it send APPEND_MULTI."""

    @property
    def multi(self) -> bool:
        """Whether the node takes APPEND_MULTI on this connection."""
        return self.protocol_version >= CLIENT_APPEND_MULTI_VERSION

    @property
    def inflight(self) -> int:
        return len(self._pending)

    def request(self, message: Message, callback: Callback) -> None:
        """Send ``message``; ``callback`` gets the answer, or the ``Status`` that ended the
        request: OVERLOADED (nothing sent: our output buffer is full), CONNFAILED (nothing
        sent: closed), PEER_CLOSED (sent, then the connection closed), TIMEDOUT."""
        if self._closed:
            self._loop.call_soon(callback, Status.CONNFAILED)
            return
        if self.buffered_bytes() >= OUTPUT_BUFFER_BYTES_MAX:
            self._loop.call_soon(callback, Status.OVERLOADED)
            return
        correlation_id = self._next_id
        self._next_id = correlation_id + 1
        self._pending[correlation_id] = callback
        now_s = self._loop.time()
        marks = self._marks
        mark = (now_s + self._timeout_s, correlation_id + 1)
        if marks and now_s - self._last_mark_s < MARK_INTERVAL_S:
            marks[-1] = mark  # the bucket's deadline is that of its latest request
        else:
            self._last_mark_s = now_s
            marks.append(mark)
        if self._sweep is None:
            self._arm_sweep()
        # As parts: a 1 MiB batch is not copied once more to join it to its header.
        self.send_parts(encode_parts(message, encode_fields(message), correlation_id))

    def hold(self, key: Hashable, item: Any, sender: HeldSender) -> int:
        """Keep ``item`` until this loop iteration's write, when ``sender(self, key, items)``
        gets every item held under ``key`` (in holding order) and sends them as it likes, in
        the same write. Returns how many items ``key`` holds now. Whatever is held is always
        handed to the sender, also when the connection closed meanwhile (its requests then
        fail with CONNFAILED: nothing sent)."""
        held = self._held
        items = held.get(key)
        if items is None:
            items = held[key] = [item]
        else:
            items.append(item)
        self._held_sender = sender
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return len(items)

    def release_held(self, key: Hashable) -> list[Any]:
        """Take the items held under ``key`` out now (the caller sends them itself)."""
        return self._held.pop(key, [])

    def send_held(self) -> None:
        """Hand everything held to its sender now (a request that must not overtake them)."""
        held = self._held
        if held:
            sender = self._held_sender
            assert sender is not None
            self._held = {}
            for key, items in held.items():
                sender(self, key, items)

    def _flush(self) -> None:
        self.send_held()
        super()._flush()

    def _arm_sweep(self) -> None:
        delay_s = min(self._timeout_s, SWEEP_INTERVAL_S_MAX)
        self._sweep = self._loop.call_later(delay_s, self._on_sweep)

    def _on_sweep(self) -> None:
        self._sweep = None
        now_s = self._loop.time()
        marks = self._marks
        pending = self._pending
        boundary = 0
        while marks and marks[0][0] <= now_s:
            boundary = marks.popleft()[1]
        expired: list[int] = []
        for correlation_id in pending:
            if correlation_id >= boundary:
                break
            expired.append(correlation_id)
        for correlation_id in expired:
            callback = pending.pop(correlation_id, None)
            if callback is not None:
                _invoke(callback, Status.TIMEDOUT)
        if pending and not self._closed:
            self._arm_sweep()

    def _on_frame(self, correlation_id: int, message: Message) -> None:
        if not self.hello_reply.done():
            if correlation_id == 0 and type(message) is HelloReply:
                assert isinstance(message, HelloReply)
                self.hello_reply.set_result(message)
            else:
                self.desync(f"expected HELLO_REPLY, got {type(message).__name__}")
            return
        callback = self._pending.pop(correlation_id, None)
        if callback is not None:
            _invoke(callback, message)
        elif correlation_id >= self._next_id:
            # Timed-out requests' late answers are expected; answers to nothing we sent are not.
            self.desync(f"answer with unknown correlation id {correlation_id}")

    def _on_closed(self, status: Status) -> None:
        if not self.hello_reply.done():
            self.hello_reply.set_result(status)
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        pending, self._pending = self._pending, {}
        self._marks.clear()
        # Every pending request was queued for sending: the node may have acted on it.
        for callback in pending.values():
            _invoke(callback, Status.PEER_CLOSED)


class _TlsBinaryConnection(BinaryConnection, TlsReads):
    """Over TLS: decrypted straight into the shared read buffer (``TlsReads``)."""

    __slots__ = ()


class Connections:
    """One ``BinaryConnection`` per data address, opened on first use."""

    def __init__(self, *, cluster_fingerprint: str, connect_timeout_ms: int,
                 timeout_ms: int, ssl: SSLContext | None = None, token: str = "") -> None:
        self.cluster_fingerprint = cluster_fingerprint
        self._ssl = ssl
        """TLS to the data ports (the nodes' certificates checked against the client's CA)."""
        self._token = token
        """The bearer token sent in HELLO (docs/SECURITY.md); empty: none."""
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._timeout_ms = timeout_ms
        self._node_id = client_id()
        self._ready: dict[str, BinaryConnection] = {}
        self._connecting: dict[str, asyncio.Future[BinaryConnection | LogError]] = {}
        self._closed = False
        self.counters = Counters()
        self.connected_once = False
        """Whether any HELLO succeeded: until then, failing to connect may mean the data ports
        are not reachable from here at all (behind a proxy that passes only HTTP)."""

    def ready(self, address: str) -> BinaryConnection | None:
        """The open connection to ``address``, if there is one (no waiting)."""
        conn = self._ready.get(address)
        if conn is not None and conn.closed:
            del self._ready[address]
            return None
        return conn

    async def get(self, address: str) -> BinaryConnection:
        """The connection to ``address``, connecting if needed. Raises ``LogError``:
        CONNFAILED (could not connect; nothing sent), PROTONOSUPPORT (the node refused our
        HELLO: too old, or another cluster), SHUTDOWN (closed)."""
        conn = self.ready(address)
        if conn is not None:
            return conn
        if self._closed:
            raise LogError(Status.SHUTDOWN, "client closed")
        waiter = self._connecting.get(address)
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._connecting[address] = waiter
            result: BinaryConnection | LogError = LogError(
                Status.CONNFAILED, f"{address}: connect failed")
            try:
                result = await self._connect(address)
            except asyncio.CancelledError:
                result = LogError(Status.CONNFAILED, f"{address}: connect cancelled")
                raise
            finally:
                del self._connecting[address]
                waiter.set_result(result)
        else:
            result = await asyncio.shield(waiter)
        if isinstance(result, LogError):
            raise result
        return result

    async def _connect(self, address: str) -> BinaryConnection | LogError:
        result = await self._connect_version(address, PROTOCOL_VERSION)
        if isinstance(result, LogError) and result.status is Status.PROTONOSUPPORT:
            # A node older than APPEND_MULTI refuses our version: APPENDs only.
            again = await self._connect_version(address, CLIENT_APPEND_VERSION)
            if not isinstance(again, LogError):
                return again
        return result

    async def _connect_version(self, address: str, version: int) -> BinaryConnection | LogError:
        host, _, port_text = address.rpartition(":")
        if not host or not port_text.isdigit():
            return LogError(Status.CONNFAILED, f"bad data address {address!r}")
        loop = asyncio.get_running_loop()
        conn: BinaryConnection | None = None
        kind = BinaryConnection if self._ssl is None else _TlsBinaryConnection
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: kind(self.counters, self._timeout_ms), host,
                    int(port_text), ssl=self._ssl)
                conn.protocol_version = version
                conn.send(encode(Hello(node_id=self._node_id, protocol_version=version,
                                       cluster_fingerprint=self.cluster_fingerprint,
                                       token=self._token)))
                reply = await conn.hello_reply
        except (OSError, TimeoutError) as exc:
            if conn is not None:
                conn.abort(Status.CONNFAILED)
            return LogError(Status.CONNFAILED, f"{address}: {exc!r}")
        if isinstance(reply, HelloReply) and reply.status is Status.OK and not conn.closed:
            if self._closed:
                conn.close(Status.SHUTDOWN)
                return LogError(Status.SHUTDOWN, "client closed")
            self._ready[address] = conn
            self.connected_once = True
            return conn
        conn.abort(Status.CONNFAILED)
        if isinstance(reply, HelloReply) and reply.status in (Status.UNAUTHENTICATED,
                                                              Status.RATE_LIMITED):
            return LogError(reply.status, f"{address} ({reply.node_id}) refused our HELLO: "
                                          f"{reply.status.description}")
        if isinstance(reply, HelloReply):
            return LogError(Status.PROTONOSUPPORT,
                            f"{address} ({reply.node_id}) refused our HELLO "
                            f"(protocol {version}): {reply.status.name}")
        return LogError(Status.CONNFAILED, f"{address}: closed during HELLO ({reply.name})")

    async def close(self) -> None:
        self._closed = True
        conns = list(self._ready.values())
        self._ready.clear()
        for conn in conns:
            conn.close(Status.SHUTDOWN)
        await wait_lost(conns, CLOSE_WAIT_S)
