"""One framed node-to-node TCP connection, an asyncio protocol (``data_received``).

``FramedProtocol`` owns the byte stream of one socket: it splits received bytes into frames
(``shared.wire.framing``), decodes them (``shared.wire.codec``) and hands each
``(correlation_id, message)`` to its subclass; in the other direction it coalesces every frame
queued during one event-loop iteration into a single ``transport.write``. The client
(``shared.net.pool``) and server (``shared.net.server``) sides subclass it.

Lifecycle: OPEN -> CLOSED, forward only. ``_on_closed(status)`` runs exactly once, at the
moment the connection stops being usable: when we close or abort it ourselves, or when the
peer goes away. A desync (undecodable or oversized frame) aborts the connection at once,
because nothing after a bad frame can be trusted.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from typing import cast

from shared.net.types import Counters
from shared.status import Status
from shared.wire.codec import Message, decode
from shared.wire.framing import FrameDecoder, FrameTooBig

log = logging.getLogger(__name__)

OUTPUT_BUFFER_BYTES_MAX = 64 * 1024 * 1024
"""Bytes queued for one connection (ours plus the transport's, while it is paused) above which
new requests are refused with OVERLOADED: a peer that does not read must not grow our memory."""


JOIN_BYTES_MAX = 256 * 1024
"""Queued frames smaller than this in total are joined into one buffer before writing."""

TLS_READ_BYTES = 256 * 1024
_tls_read_buffer = bytearray(TLS_READ_BYTES)
_tls_read_view = memoryview(_tls_read_buffer)
"""Where the TLS layer decrypts received bytes for every ``TlsReads`` connection of the
process: one buffer is enough, because each fill is handed on (copied out) before the event
loop does anything else."""


class FramedProtocol(asyncio.BaseProtocol):
    """Frames, decoding, write coalescing and close bookkeeping shared by both sides.

    An ``asyncio.Protocol`` by its methods, not by its base class: uvloop hands a protocol
    its bytes through ``get_buffer`` only if it is *not* an ``asyncio.Protocol`` subclass,
    and the TLS subclasses (``TlsReads``) want exactly that."""

    __slots__ = (
        "_closed",
        "_counters",
        "_decoder",
        "_flush_scheduled",
        "_loop",
        "_lost",
        "_out",
        "_out_bytes",
        "_out_bytes_last",
        "_out_frames",
        "_tls",
        "_transport",
        "_write_paused",
    )

    def __init__(self, counters: Counters) -> None:
        self._loop = asyncio.get_running_loop()
        self._counters = counters
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder()
        self._out: list[bytes] = []
        """Frames, or frame parts, waiting for this loop iteration's single write."""
        self._out_bytes = 0
        self._out_bytes_last = 0
        self._out_frames = 0
        self._flush_scheduled = False
        self._write_paused = False
        self._closed = False
        self._tls = False
        self._lost: asyncio.Future[None] = self._loop.create_future()

    # ----- subclass hooks

    def _on_frame(self, correlation_id: int, message: Message) -> None:
        raise NotImplementedError

    def _on_closed(self, status: Status) -> None:
        raise NotImplementedError

    # ----- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but implement its interface.
        self._transport = cast(asyncio.Transport, transport)
        self._tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        counters = self._counters
        counters.bytes_received += len(data)
        try:
            bodies = self._decoder.feed(data)
        except FrameTooBig as error:
            self.desync(str(error))
            return
        counters.frames_received += len(bodies)
        for body in bodies:
            if self._closed:
                return
            decoded = decode(body)
            if isinstance(decoded, Status):
                self.desync("undecodable frame")
                return
            self._on_frame(decoded[0], decoded[1])

    def eof_received(self) -> bool | None:
        return None  # close our side too: a half-open node-to-node connection is useless

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        if not self._closed:
            self._closed = True
            self._out = []
            self._out_bytes = 0
            self._on_closed(Status.CONNFAILED)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._out and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    # ----- sending

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, frame: bytes) -> None:
        """Queue one encoded frame; it leaves with every other frame of this loop iteration.
        Silently dropped once the connection is closed."""
        if self._closed:
            return
        self._out.append(frame)
        self._out_bytes += len(frame)
        self._out_frames += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_parts(self, parts: tuple[bytes, ...]) -> None:
        """Queue one frame given as consecutive parts (written without joining them)."""
        if self._closed:
            return
        self._out.extend(parts)
        self._out_bytes += sum(map(len, parts))
        self._out_frames += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_many(self, frames: list[tuple[bytes, ...]]) -> None:
        for parts in frames:
            self.send_parts(parts)

    def buffered_bytes(self) -> int:
        """Bytes accepted but not yet handed to the kernel, as far as we can tell cheaply."""
        buffered = self._out_bytes
        if self._write_paused and self._transport is not None:
            buffered += self._transport.get_write_buffer_size()
        return buffered

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._write_paused or self._closed:
            return
        self._write_out()

    def _write_out(self) -> None:
        out = self._out
        transport = self._transport
        if not out or transport is None:
            return
        counters = self._counters
        counters.frames_sent += self._out_frames
        counters.writes += 1
        counters.bytes_sent += self._out_bytes
        self._out_bytes_last = self._out_bytes
        self._out = []
        self._out_bytes = 0
        self._out_frames = 0
        if len(out) == 1:
            transport.write(out[0])
        elif self._out_bytes_last < JOIN_BYTES_MAX or self._tls:
            # One write call: uvloop's writelines issues a send per part, and every extra
            # segment costs the receiver a wake-up; copying small frames is far cheaper.
            # Over TLS always: every part written is encrypted as a TLS record of its own.
            transport.write(b"".join(out))
        else:
            # Big batches: skip the copy of their payload parts.
            transport.writelines(out)

    # ----- closing

    def close(self, status: Status) -> None:
        """Send what is queued, then close; pending work on this connection ends with
        ``status``."""
        if self._closed:
            return
        self._write_out()
        self._closed = True
        if self._transport is not None:
            self._transport.close()
        self._on_closed(status)

    def abort(self, status: Status) -> None:
        """Drop what is queued and reset the connection at once."""
        if self._closed:
            return
        self._closed = True
        self._out = []
        self._out_bytes = 0
        self._out_frames = 0
        if self._transport is not None:
            self._transport.abort()
        self._on_closed(status)

    def reset(self) -> None:
        """Abort the socket even if a graceful close is still flushing (shutdown deadline)."""
        if self._transport is not None:
            self._transport.abort()

    def desync(self, reason: str) -> None:
        """The byte stream cannot be trusted any more: abort and fail everything pending."""
        if self._closed:
            return
        self._counters.desyncs += 1
        log.warning("closing desynced connection to %s: %s", self.peer_address(), reason)
        self.abort(Status.BADMSG)

    def peer_address(self) -> object:
        if self._transport is None:
            return None
        return self._transport.get_extra_info("peername")

    def transport_extra(self, name: str) -> object:
        """``get_extra_info(name)`` of the transport (``peercert`` over TLS), or None."""
        if self._transport is None:
            return None
        return self._transport.get_extra_info(name)

    async def wait_lost(self) -> None:
        """Wait until the socket is really gone (``connection_lost`` ran)."""
        await asyncio.shield(self._lost)


async def wait_lost(connections: Sequence[FramedProtocol], timeout_s: float) -> None:
    """Wait for closing connections to go away; reset whichever outlive ``timeout_s``."""
    if not connections:
        return
    waiters = [asyncio.ensure_future(conn.wait_lost()) for conn in connections]
    _, late = await asyncio.wait(waiters, timeout=timeout_s)
    for waiter in late:
        waiter.cancel()
    if late:
        for conn in connections:
            conn.reset()


class TlsReads(asyncio.BufferedProtocol):
    """Makes a ``FramedProtocol`` subclass a buffered protocol for TLS connections
    (``class X(Framed, TlsReads)``): uvloop's and asyncio's TLS layers then decrypt straight
    into one shared buffer, many TLS records per call, instead of allocating a 256 KiB buffer
    per TLS record and joining them. Plain TCP keeps ``data_received`` (``FramedProtocol``
    has no ``get_buffer``, so both loops take their simple path)."""

    __slots__ = ()

    def get_buffer(self, sizehint: int) -> memoryview:
        return _tls_read_view

    def buffer_updated(self, nbytes: int) -> None:
        cast(FramedProtocol, self).data_received(bytes(_tls_read_view[:nbytes]))
