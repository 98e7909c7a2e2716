"""APPEND / APPENDED between sequencer nodes: a node that is not the log's sequencer forwards
the client's append over the node-to-node transport and relays the answer.
GET_SEQUENCER_STATE / SEQUENCER_STATE: a node serving a read for a log it does not sequence
asks the log's sequencer node for the authoritative release pointer."""

from __future__ import annotations

from dataclasses import dataclass

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class Append:
    log_id: LogId
    payloads: tuple[bytes, ...]
    key: str | None
    hops: int
    """How many nodes already forwarded this append; bounds forwarding loops."""
    producer_id: str | None = None
    producer_seq: int = 0
    """With ``producer_id``: the append is idempotent (``sequencer.core.producers``)."""
    compression: int = 0
    """``shared.compression.Codec`` of a compressed batch: then ``payloads`` is ``(blob,)``,
    the batch of ``records`` records as ``shared.compression`` packs it; 0: plain payloads."""
    records: int = 0
    """With ``compression``: how many records the blob holds (each gets its own LSN)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Appended:
    status: Status
    log_id: LogId
    first_lsn: Lsn
    last_lsn: Lsn
    timestamp_ms: int
    sequencer_node: NodeId | None
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetSequencerState:
    log_id: LogId


@dataclass(frozen=True, slots=True, kw_only=True)
class SequencerState:
    status: Status
    """OK when the node runs an active sequencer for the log; NOSEQUENCER otherwise."""
    log_id: LogId
    release_lsn: Lsn
    epoch: Epoch
