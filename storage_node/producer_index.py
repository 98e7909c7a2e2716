"""Which idempotent appends a storage node holds copies of, per log and producer.

Every STORE of an idempotent append carries its producer tag (``shared.wire.store``); the node
remembers, per log, the tags of each producer's latest ``PRODUCER_SEQS_KEPT`` appends, for the
GET_PRODUCER a newly activated sequencer sends before it takes a known producer's appends.
Built by ``DurableState`` from the same fold as the record index (a restart's scan, then every
committed batch), so it is exactly what the files hold. Bounded: at most
``producer_ids_per_log_max`` producers per log, the least recently written one is forgotten.
Trimmed appends are filtered out when asked (their tags may outlive the records).

One ``(producer, seq)`` may have several LSN ranges here, and all of them are kept (up to
``PRODUCER_RANGES_PER_SEQ_MAX``, the newest): a copy that reached too few nodes and that
recovery plugged elsewhere stays here as a stray until a CLEAN purges it, while the client's
retry was written again at a later LSN, often on this node too. The lookup reads every range
back and takes the one that is a record; remembering only one of them (the stray) would make
the retry look unwritten, and the next retry would be written a second time.
"""

from __future__ import annotations

from collections import OrderedDict

from shared.limits import PRODUCER_RANGES_PER_SEQ_MAX, PRODUCER_SEQS_KEPT
from shared.types import LogId
from shared.wire.producer import ProducerEntry
from shared.wire.store import ProducerTag

_Range = tuple[int, int, int]
"""(first_lsn, last_lsn, timestamp_ms) of one copy's range."""


class ProducerIndex:
    def __init__(self, producer_ids_per_log_max: int,
                 seqs_kept: int = PRODUCER_SEQS_KEPT,
                 ranges_per_seq_max: int = PRODUCER_RANGES_PER_SEQ_MAX) -> None:
        self._producers_max = producer_ids_per_log_max
        self._seqs_kept = seqs_kept
        self._ranges_max = ranges_per_seq_max
        self._logs: dict[LogId, OrderedDict[str, dict[int, list[_Range]]]] = {}
        self.forgotten_count = 0
        """Producers dropped to stay within ``producer_ids_per_log_max``."""

    def add(self, log_id: LogId, tags: tuple[ProducerTag, ...], timestamp_ms: int) -> None:
        producers = self._logs.get(log_id)
        if producers is None:
            producers = self._logs[log_id] = OrderedDict()
        for producer_id, seq, first_lsn, last_lsn in tags:
            entries = producers.get(producer_id)
            if entries is None:
                if len(producers) >= self._producers_max:
                    producers.popitem(last=False)
                    self.forgotten_count += 1
                entries = producers[producer_id] = {}
            else:
                producers.move_to_end(producer_id)
            ranges = entries.get(seq)
            if ranges is None:
                entries[seq] = [(first_lsn, last_lsn, timestamp_ms)]
                if len(entries) > self._seqs_kept:
                    del entries[min(entries)]
                continue
            # The same copy stored again (a new wave, recovery) has the same range: nothing
            # new. Another range is another attempt of the same append (see the docstring).
            if any(known[0] == first_lsn for known in ranges):
                continue
            ranges.append((first_lsn, last_lsn, timestamp_ms))
            ranges.sort()
            if len(ranges) > self._ranges_max:
                # The newest attempts are the ones a retry can still be answered from: an
                # older one was looked up and found unwritten before a later one was made.
                del ranges[0]

    def entries(self, log_id: LogId, producer_id: str, trim_lsn: int) -> tuple[ProducerEntry, ...]:
        """The producer's remembered appends above ``trim_lsn``, by ``producer_seq`` (every
        range of one ``producer_seq``, lowest first)."""
        producers = self._logs.get(log_id)
        entries = producers.get(producer_id) if producers is not None else None
        if not entries:
            return ()
        return tuple((seq, first, last, timestamp_ms)
                     for seq, ranges in sorted(entries.items())
                     for first, last, timestamp_ms in ranges
                     if last > trim_lsn)

    @property
    def producers_count(self) -> int:
        return sum(len(producers) for producers in self._logs.values())
