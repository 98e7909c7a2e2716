"""APPEND / APPENDED: a node that is not the log's sequencer forwards the client's append over
the node-to-node transport and relays the answer; binary clients (``client.*`` peers, protocol
version 2) send APPEND themselves (docs/PROTOCOL.md).
GET_SEQUENCER_STATE / SEQUENCER_STATE: a node serving a read for a log it does not sequence
asks the log's sequencer node for the authoritative release pointer."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.extension import EXTENSION


@dataclass(frozen=True, slots=True, kw_only=True)
class Append:
    log_id: LogId
    payloads: tuple[bytes, ...]
    key: str | None
    hops: int
    """How many nodes already forwarded this append; bounds forwarding loops. Always 0 from a
    client (the node closes a client connection that sends more)."""
    producer_id: str | None = None
    producer_seq: int = 0
    """With ``producer_id``: the append is idempotent (``sequencer.core.producers``)."""
    compression: int = field(default=0, metadata=EXTENSION)
    """``shared.compression.Codec`` of a compressed batch: then ``payloads`` is ``(blob,)``,
    the batch of ``records`` records as ``shared.compression`` packs it; 0: plain payloads."""
    records: int = field(default=0, metadata=EXTENSION)
    """With ``compression``: how many records the blob holds (each gets its own LSN)."""
    no_forward: bool = field(default=False, metadata=EXTENSION)
    """From a client: a node that does not sequence the log answers NOSEQUENCER with the
    owner's data address (``Appended.redirect_data``) instead of forwarding."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Appended:
    status: Status
    log_id: LogId
    first_lsn: Lsn
    last_lsn: Lsn
    timestamp_ms: int
    sequencer_node: NodeId | None
    message: str
    redirect_data: str | None = field(default=None, metadata=EXTENSION)
    """With NOSEQUENCER to a ``no_forward`` append: ``host:port`` of the data port of
    ``sequencer_node``, which sequences the log; nothing was written."""
    retry_after_ms: int = field(default=0, metadata=EXTENSION)
    """To clients, with a status after which nothing was written and a retry may succeed
    later (those HTTP answers 429 or 503 with ``Retry-After``): wait at least this long."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetSequencerState:
    log_id: LogId
    activate: bool = field(default=False, metadata=EXTENSION)
    """Activate the log's sequencer if it is not active (a tail asked for a log whose last
    epoch is not clean: only recovery can tell what it released)."""
    all_logs: bool = field(default=False, metadata=EXTENSION)
    """Also answer ``tails`` for every log this node's sequencer has active (rebuilding's
    plan: ``storage_node.core.rebuild``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SequencerState:
    status: Status
    """OK when the node runs an active sequencer for the log; NOSEQUENCER otherwise."""
    log_id: LogId
    release_lsn: Lsn
    epoch: Epoch
    tail_lsn: Lsn = field(default=Lsn(0), metadata=EXTENSION)
    """With OK: the highest LSN the sequencer has handed out, in flight or not (at least
    ``release_lsn``); rebuilding's donors wait until the release pointer reaches it."""
    tails: tuple[tuple[int, int, int], ...] = field(default=(), metadata=EXTENSION)
    """Asked ``all_logs``: ``(log_id, release_lsn, tail_lsn)`` of every log active here."""
