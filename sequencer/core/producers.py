"""Idempotent appends: what a log's sequencer knows about each producer's latest appends.

An append may name its producer (``producer_id``) and that producer's sequence number for it
(``producer_seq``). A retry of the same pair must get the original LSNs instead of a second
copy, also when another sequencer took the log over in between (API.md). The rules:

- The cluster remembers each producer's latest ``PRODUCER_SEQS_KEPT`` appends per log. A pair
  among them is a duplicate: answered OK with the original LSNs, nothing written. A pair whose
  append is still in flight joins it and gets its answer. A pair older than every remembered one
  (when all ``PRODUCER_SEQS_KEPT`` are taken) is refused with STALE: whether it was written can
  no longer be told. Any other pair is a new append. A retry's payload is not compared.
- The sequencer's table is a cache. Where it may be missing appends -- after any activation
  but a log's first epoch, and for a producer it dropped to stay within
  ``producers_per_log_max`` -- it looks the producer up before taking its appends: every copy
  of an idempotent append carries its producer tag, storage nodes index them, and the driver
  asks the nodeset once earlier epochs are recovered (every surviving record then has R copies,
  so an f-majority of answers sees it) and keeps only tags whose records read back as records.
  Meanwhile the producer's appends wait in a bounded queue.
- An epoch that ends with appends in flight leaves their outcome unknown: the table is dropped
  and the next epoch looks producers up again.

Pure: the ``Sequencer`` core asks this table, the driver performs the lookups.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from shared.limits import PRODUCER_SEQS_KEPT
from shared.types import Lsn
from shared.wire.producer import ProducerEntry

P = TypeVar("P")
"""A waiting append (the sequencer's ``PendingAppend``)."""

PRODUCER_APPENDS_QUEUED_MAX = 4 * PRODUCER_SEQS_KEPT
"""Appends of one producer that may wait for its lookup (or join one in-flight append)."""


class Verdict(Enum):
    NEW = "NEW"
    """Write it: the pair is now in flight."""
    DUPLICATE = "DUPLICATE"
    """Answer OK with ``Admission.entry``'s LSNs."""
    JOINED = "JOINED"
    """Answered together with the in-flight append of the same pair."""
    STALE = "STALE"
    """Older than every remembered append: refused."""
    QUEUED = "QUEUED"
    """Waits for the producer's lookup."""
    LOOKUP = "LOOKUP"
    """Waits for the producer's lookup, which the driver must start now."""
    BUSY = "BUSY"
    """Refused (SEQNOBUFS): too many producers or waiting appends; nothing written."""


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: Verdict
    entry: ProducerEntry | None = None


@dataclass(slots=True)
class _Producer(Generic[P]):
    entries: dict[int, tuple[Lsn, Lsn, int]] = field(default_factory=dict)
    """``producer_seq`` -> (first LSN, last LSN, timestamp) of completed appends."""
    in_flight: dict[int, list[P]] = field(default_factory=dict)
    """``producer_seq`` of appends being written -> the retries that joined them."""
    queued: deque[P] | None = None
    """While the producer is looked up: its appends, in arrival order."""

    def busy(self) -> bool:
        return bool(self.in_flight) or self.queued is not None


class ProducerTable(Generic[P]):
    def __init__(self, producers_max: int, seqs_kept: int = PRODUCER_SEQS_KEPT) -> None:
        self._producers: OrderedDict[str, _Producer[P]] = OrderedDict()
        self._producers_max = producers_max
        self._seqs_kept = seqs_kept
        self.complete = False
        """True while the table holds every producer's appends to the log (a first epoch that
        dropped nobody): an unknown producer then has none and needs no lookup."""

    def __len__(self) -> int:
        return len(self._producers)

    def waiting(self) -> bool:
        """Whether any producer has appends in flight or waiting for its lookup (walks the
        table: for the rare idle check, not for each append)."""
        return any(producer.busy() for producer in self._producers.values())

    def reset(self, complete: bool) -> tuple[list[P], list[P]]:
        """Forget everything (a new epoch). Returns the appends that waited for lookups
        (nothing written) and the retries that had joined in-flight appends (outcome
        unknown), which the caller must answer."""
        queued: list[P] = []
        joined: list[P] = []
        for producer in self._producers.values():
            queued.extend(producer.queued or ())
            for retries in producer.in_flight.values():
                joined.extend(retries)
        self._producers.clear()
        self.complete = complete
        return queued, joined

    def admit(self, producer_id: str, seq: int, append: P) -> Admission:
        producer = self._producers.get(producer_id)
        if producer is None:
            if not self._make_room():
                return Admission(Verdict.BUSY)
            producer = self._producers[producer_id] = _Producer()
            if not self.complete:
                producer.queued = deque([append])
                return Admission(Verdict.LOOKUP)
        else:
            self._producers.move_to_end(producer_id)
        if producer.queued is not None:
            if len(producer.queued) >= PRODUCER_APPENDS_QUEUED_MAX:
                return Admission(Verdict.BUSY)
            producer.queued.append(append)
            return Admission(Verdict.QUEUED)
        known = producer.entries.get(seq)
        if known is not None:
            return Admission(Verdict.DUPLICATE, (seq, *known))
        joined = producer.in_flight.get(seq)
        if joined is not None:
            if len(joined) >= PRODUCER_APPENDS_QUEUED_MAX:
                return Admission(Verdict.BUSY)
            joined.append(append)
            return Admission(Verdict.JOINED)
        if len(producer.entries) >= self._seqs_kept and seq < min(producer.entries):
            return Admission(Verdict.STALE)
        producer.in_flight[seq] = []
        return Admission(Verdict.NEW)

    def _make_room(self) -> bool:
        if len(self._producers) < self._producers_max:
            return True
        for producer_id, producer in self._producers.items():
            if not producer.busy():
                del self._producers[producer_id]
                self.complete = False  # its appends are now only on storage nodes
                return True
        return False

    def completed(self, producer_id: str, seq: int, first_lsn: Lsn, last_lsn: Lsn,
                  timestamp_ms: int) -> list[P]:
        """The pair's append is acknowledged; returns the retries that joined it."""
        producer = self._producers.get(producer_id)
        if producer is None:
            return []
        joined = producer.in_flight.pop(seq, [])
        producer.entries[seq] = (first_lsn, last_lsn, timestamp_ms)
        if len(producer.entries) > self._seqs_kept:
            del producer.entries[min(producer.entries)]
        return joined

    def failed(self, producer_id: str, seq: int) -> list[P]:
        """The pair's append ended with nothing written, or went back to wait without an LSN:
        it is no longer in flight. Returns the retries that joined it (they get the same answer,
        or wait again behind it)."""
        producer = self._producers.get(producer_id)
        return producer.in_flight.pop(seq, []) if producer is not None else []

    def looked_up(self, producer_id: str, entries: list[ProducerEntry] | None) -> list[P]:
        """The lookup ended: with the producer's verified appends, or None if it failed (the
        producer is forgotten; its waiting appends must be refused). Returns those appends."""
        producer = self._producers.get(producer_id)
        if producer is None or producer.queued is None:
            return []
        waiting = list(producer.queued)
        if entries is None:
            del self._producers[producer_id]
            return waiting
        producer.queued = None
        for seq, first_lsn, last_lsn, timestamp_ms in sorted(entries)[-self._seqs_kept:]:
            producer.entries[seq] = (Lsn(first_lsn), Lsn(last_lsn), timestamp_ms)
        return waiting


def lookup_candidates(answers: list[tuple[ProducerEntry, ...]],
                      seqs_kept: int = PRODUCER_SEQS_KEPT) -> dict[int, list[ProducerEntry]]:
    """The storage nodes' answers merged: per ``producer_seq`` of the latest ``seqs_kept``,
    every distinct LSN range some node holds a copy of, lowest first. Each must still be
    checked by reading: a copy can be a stray that recovery decided against."""
    candidates: dict[int, set[ProducerEntry]] = {}
    for answer in answers:
        for entry in answer:
            candidates.setdefault(entry[0], set()).add(entry)
    kept = sorted(candidates)[-seqs_kept:]
    return {seq: sorted(candidates[seq], key=lambda e: (e[1], e[2])) for seq in kept}
