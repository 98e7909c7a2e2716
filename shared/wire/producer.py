"""GET_PRODUCER / PRODUCER_STATE: a sequencer that has not seen a producer since it activated
asks the storage nodes which of that producer's appends to a log they hold copies of (see
``sequencer.core.producers``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.authority import NonAuthoritative
from shared.status import Status
from shared.types import LogId
from shared.wire.extension import EXTENSION

ProducerEntry = tuple[int, int, int, int]
"""``(producer_seq, first_lsn, last_lsn, timestamp_ms)`` of one idempotent append."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetProducer:
    log_id: LogId
    producer_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerState:
    status: Status
    log_id: LogId
    producer_id: str
    entries: tuple[ProducerEntry, ...]
    """The node's copies' tags of the producer's latest appends (above its trim point),
    highest ``producer_seq`` last; at most ``PRODUCER_SEQS_KEPT`` pairs, each with up to
    ``PRODUCER_RANGES_PER_SEQ_MAX`` LSN ranges (attempts of the same append)."""
    non_authoritative: NonAuthoritative = field(default=(), metadata=EXTENSION)
    """Where in the log the node may have lost copies (``shared.authority``): its list is
    then no evidence that an append is not written."""
