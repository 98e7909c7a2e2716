"""Vocabulary of the node-to-node transport: the handler protocol, reply and request callbacks,
and the counters that let tests and metrics see how frames map onto socket writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shared.status import Status
from shared.types import NodeId
from shared.wire.codec import Message

ReplyFn = Callable[[Message], None]
"""Sends the reply to one request. A no-op for one-way messages; dropped after the connection
closed; only the first call of a given ``ReplyFn`` sends anything."""

RequestCallback = Callable[[Message | Status], None]
"""Receives either the peer's reply or the ``Status`` that ended the request."""


class MessageHandler(Protocol):
    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        """Called synchronously on the event loop for every decoded frame except HELLO.

        ``reply`` may be called later (after an fsync, say), even after the connection closed.
        """
        ...


@dataclass(slots=True)
class Counters:
    """Monotonic totals over every connection of one pool or one server."""

    frames_sent: int = 0
    writes: int = 0
    """``transport.write`` calls: with coalescing, far fewer than ``frames_sent``."""
    bytes_sent: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    connects: int = 0
    """Connections that completed the HELLO exchange."""
    connect_failures: int = 0
    desyncs: int = 0
    """Connections closed because a frame could not be decoded or was unexpected."""
    refused_per_address: int = 0
    """Server: sockets closed at once because their address held all its connection (or TLS
    handshake) slots (``LimitsConfig.data_connections_per_ip_max``)."""
    refused_full: int = 0
    """Server: sockets closed at once because the node held ``data_connections_max`` and none
    could be evicted."""
