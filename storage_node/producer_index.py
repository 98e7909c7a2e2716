"""Which idempotent appends a storage node holds copies of, per log and producer.

Every STORE of an idempotent append carries its producer tag (``shared.wire.store``); the node
remembers, per log, the tags of each producer's latest ``PRODUCER_SEQS_KEPT`` appends, for the
GET_PRODUCER a newly activated sequencer sends before it takes a known producer's appends.
Built by ``DurableState`` from the same fold as the record index (a restart's scan, then every
committed batch), so it is exactly what the files hold. Bounded: at most
``producer_ids_per_log_max`` producers per log, the least recently written one is forgotten.
Trimmed appends are filtered out when asked (their tags may outlive the records).
"""

from __future__ import annotations

from collections import OrderedDict

from shared.limits import PRODUCER_SEQS_KEPT
from shared.types import LogId
from shared.wire.producer import ProducerEntry
from shared.wire.store import ProducerTag


class ProducerIndex:
    def __init__(self, producer_ids_per_log_max: int,
                 seqs_kept: int = PRODUCER_SEQS_KEPT) -> None:
        self._producers_max = producer_ids_per_log_max
        self._seqs_kept = seqs_kept
        self._logs: dict[LogId, OrderedDict[str, dict[int, tuple[int, int, int]]]] = {}
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
            known = entries.get(seq)
            # The same append stored again (a new wave, recovery) has the same range; two
            # ranges for one pair can only come from a producer that outran the window, and
            # the first one is the original.
            if known is None or first_lsn < known[0]:
                entries[seq] = (first_lsn, last_lsn, timestamp_ms)
                if len(entries) > self._seqs_kept:
                    del entries[min(entries)]

    def entries(self, log_id: LogId, producer_id: str, trim_lsn: int) -> tuple[ProducerEntry, ...]:
        """The producer's remembered appends above ``trim_lsn``, by ``producer_seq``."""
        producers = self._logs.get(log_id)
        entries = producers.get(producer_id) if producers is not None else None
        if not entries:
            return ()
        return tuple((seq, first, last, timestamp_ms)
                     for seq, (first, last, timestamp_ms) in sorted(entries.items())
                     if last > trim_lsn)

    @property
    def producers_count(self) -> int:
        return sum(len(producers) for producers in self._logs.values())
