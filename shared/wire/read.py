"""READ of released records from one storage node, and GET_LOG_STATE for activation.

A storage node answers READ with its records in ``[from_lsn, until_lsn]`` that are at or
below ``max(its own release pointer, release_lsn)``: ``release_lsn`` comes from the log's
sequencer (or a reader that learnt it from another node), which is the authority on what is
released. Readers in the client send READs straight to storage nodes too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.authority import NonAuthoritative
from shared.status import Status
from shared.types import Epoch, LogId, Lsn
from shared.wire.extension import EXTENSION

WireRecord = tuple[int, int, str | None, bytes]
"""(lsn, timestamp_ms, key, payload): one record as it crosses the wire."""
Block = tuple[int, int, str | None, int, int, bytes]
"""(first_lsn, timestamp_ms, key, codec, records, blob): the records ``first_lsn ..
first_lsn + records - 1`` as the compressed batch they were appended as
(``shared.compression``); the reader expands it."""
Marker = tuple[int, int, int, int]
"""(first_lsn, last_lsn, flags, seal_epoch) of copies written by epoch recovery: a plugged
hole or bridge (not in ``records``), or a record recovery re-replicated (in ``records``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Read:
    log_id: LogId
    from_lsn: Lsn
    until_lsn: Lsn
    release_lsn: Lsn
    records_max: int
    bytes_max: int
    wait_ms: int = 0
    """Long poll: when nothing at or after ``from_lsn`` is released on the node yet, it holds
    the read until its release pointer passes ``from_lsn - 1`` or this much time has gone by
    (at most ``READ_WAIT_MS_MAX``), then answers as usual."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadReply:
    status: Status
    log_id: LogId
    release_lsn: Lsn
    records: tuple[WireRecord, ...]
    next_lsn: Lsn
    """The node has delivered everything it holds below this LSN (within the read's range)."""
    markers: tuple[Marker, ...] = ()
    trim_lsn: Lsn = Lsn(0)
    """The node's trim point: nothing at or below it is served."""
    blocks: tuple[Block, ...] = field(default=(), metadata=EXTENSION)
    """Records sent as compressed batches, beside ``records`` (never the same LSN in
    both): a node sends a stored compressed batch whole when the read covers it."""
    non_authoritative: NonAuthoritative = field(default=(), metadata=EXTENSION)
    """LSN ranges of the read where the node may have lost copies (``shared.authority``):
    what it sends there is real, but its silence there is no evidence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetLogState:
    log_id: LogId


@dataclass(frozen=True, slots=True, kw_only=True)
class LogState:
    status: Status
    log_id: LogId
    release_lsn: Lsn
    sealed_epoch: Epoch
    last_lsn: Lsn
    trim_lsn: Lsn = Lsn(0)
    non_authoritative: NonAuthoritative = field(default=(), metadata=EXTENSION)
    """LSN ranges of the log where the node may have lost copies (``shared.authority``)."""
    unclean: tuple[tuple[int, int, int], ...] = field(default=(), metadata=EXTENSION)
    """``(epoch, last_known_good_esn, last_esn)`` of the epochs (lowest first, a bounded
    number) in which the node holds copies above its last-known-good ESN and has applied no
    CLEAN: copies there may be strays that recovery decided against. A sequencer whose
    earlier epochs are all clean purges them (``sequencer.core.purge``)."""
