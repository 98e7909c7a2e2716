"""APPEND / APPENDED between sequencer nodes: a node that is not the log's sequencer forwards
the client's append over the node-to-node transport and relays the answer."""

from __future__ import annotations

from dataclasses import dataclass

from shared.status import Status
from shared.types import LogId, Lsn, NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class Append:
    log_id: LogId
    payloads: tuple[bytes, ...]
    key: str | None
    hops: int
    """How many nodes already forwarded this append; bounds forwarding loops."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Appended:
    status: Status
    log_id: LogId
    first_lsn: Lsn
    last_lsn: Lsn
    timestamp_ms: int
    sequencer_node: NodeId | None
    message: str
