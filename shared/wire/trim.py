"""Log-position messages to storage nodes.

TRIM / TRIMMED: a node serving ``trim(log, lsn)`` asks each storage node of the log's nodeset
to raise its durable trim point; records at or below it are no longer served, and readers get
a ``TRIM`` gap instead. FIND_TIME / FOUND_TIME: the first LSN at or after a timestamp."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.authority import NonAuthoritative
from shared.status import Status
from shared.types import LogId, Lsn
from shared.wire.extension import EXTENSION


@dataclass(frozen=True, slots=True, kw_only=True)
class Trim:
    log_id: LogId
    trim_lsn: Lsn


@dataclass(frozen=True, slots=True, kw_only=True)
class Trimmed:
    status: Status
    """OK once the trim point is durable (also when it already was at or above)."""
    log_id: LogId
    trim_lsn: Lsn
    """The node's trim point now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FindTime:
    """Ask a storage node for the first LSN it holds a record of with a timestamp at or
    after ``timestamp_ms`` (from its index; no scan)."""

    log_id: LogId
    timestamp_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundTime:
    status: Status
    log_id: LogId
    lsn: Lsn
    """0 when the node holds no such record."""
    non_authoritative: NonAuthoritative = field(default=(), metadata=EXTENSION)
    """Where in the log the node may have lost records (``shared.authority``): its answer
    is then no evidence that no earlier record is that recent."""
