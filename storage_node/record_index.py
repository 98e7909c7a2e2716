"""In-memory index of the record store: per log, the STORE entries sorted by first LSN.

Each entry maps a batch ``[first_lsn, last_lsn]`` to where its bytes are in the segment files.
Entries of one log never overlap: a STORE of LSNs that are already stored (a later wave of the
same append, or a copy written by epoch recovery) replaces them. An older entry only partly
covered by a newer one stays visible for the LSNs the newer one does not cover.
Rebuilt from the segments at open; lives on the event loop only.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from shared.types import LogId, Lsn


@dataclass(frozen=True, slots=True)
class Location:
    segment_id: int
    offset: int
    length: int
    """Header plus body bytes of the entry."""
    first_lsn: Lsn
    last_lsn: Lsn
    """The LSNs this location serves: all of the entry's, or part of them once a newer
    entry covers the rest."""
    entry_first_lsn: Lsn = Lsn(0)
    """The first LSN of the entry in the file (0: ``first_lsn``)."""
    timestamp_ms: int = -1
    """The records' timestamp (one per STORE); -1 for holes, which find-time skips."""

    @property
    def stored_first_lsn(self) -> Lsn:
        return self.entry_first_lsn or self.first_lsn

    def narrowed(self, first_lsn: int, last_lsn: int) -> Location:
        return Location(self.segment_id, self.offset, self.length, Lsn(first_lsn),
                        Lsn(last_lsn), self.stored_first_lsn, self.timestamp_ms)


class LogIndex:
    """One log's entries; ``_firsts`` is sorted and parallel to ``_locations``."""

    __slots__ = ("_firsts", "_locations", "_times")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._locations: list[Location] = []
        self._times: list[int] | None = []
        """Running maximum of the timestamps in LSN order (None: rebuild before use), so that
        find-time is a binary search, never a scan of the log."""

    def __len__(self) -> int:
        return len(self._firsts)

    @property
    def last_lsn(self) -> Lsn:
        return self._locations[-1].last_lsn if self._locations else Lsn(0)

    def insert(self, location: Location) -> int:
        """Add ``location``; returns how many overlapping entries it replaced."""
        firsts = self._firsts
        if not firsts or (location.first_lsn > firsts[-1]
                          and location.first_lsn > self._locations[-1].last_lsn):
            firsts.append(location.first_lsn)
            self._locations.append(location)
            if self._times is not None:
                self._times.append(max(location.timestamp_ms,
                                       self._times[-1] if self._times else -1))
            return 0
        self._times = None
        start = bisect.bisect_left(firsts, location.first_lsn)
        if start > 0 and self._locations[start - 1].last_lsn >= location.first_lsn:
            start -= 1
        end = bisect.bisect_right(firsts, location.last_lsn, lo=start)
        replaced = end - start
        kept: list[Location] = []
        if replaced:
            head, tail = self._locations[start], self._locations[end - 1]
            if head.first_lsn < location.first_lsn:
                kept.append(head.narrowed(head.first_lsn, location.first_lsn - 1))
            kept.append(location)
            if tail.last_lsn > location.last_lsn:
                kept.append(tail.narrowed(location.last_lsn + 1, tail.last_lsn))
        else:
            kept.append(location)
        firsts[start:end] = [k.first_lsn for k in kept]
        self._locations[start:end] = kept
        return replaced - len(kept) + 1

    def find_time(self, timestamp_ms: int) -> Lsn | None:
        """The first LSN of a record with a timestamp at or after ``timestamp_ms`` (timestamps
        taken as non-decreasing in LSN order, as one sequencer's clock gives), or None."""
        if self._times is None:
            times: list[int] = []
            for location in self._locations:
                times.append(max(location.timestamp_ms, times[-1] if times else -1))
            self._times = times
        index = bisect.bisect_left(self._times, timestamp_ms)
        if index == len(self._times):
            return None
        return self._locations[index].first_lsn

    def ranges(self, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        """The LSN ranges held within ``[from_lsn, until_lsn]``."""
        return [(Lsn(max(loc.first_lsn, from_lsn)), Lsn(min(loc.last_lsn, until_lsn)))
                for loc in self.locate(from_lsn, until_lsn, 2**62)]

    def locate(self, from_lsn: Lsn, until_lsn: Lsn, records_max: int) -> list[Location]:
        """Entries holding LSNs in ``[from_lsn, until_lsn]``, in LSN order, enough to cover
        ``records_max`` records."""
        firsts = self._firsts
        index = bisect.bisect_right(firsts, from_lsn) - 1
        if index < 0 or self._locations[index].last_lsn < from_lsn:
            index += 1
        found: list[Location] = []
        records_count = 0
        while index < len(firsts) and firsts[index] <= until_lsn and records_count < records_max:
            location = self._locations[index]
            records_count += (min(location.last_lsn, until_lsn)
                              - max(location.first_lsn, from_lsn) + 1)
            found.append(location)
            index += 1
        return found


class RecordIndex:
    """Every log's ``LogIndex``."""

    __slots__ = ("_logs", "entries_count")

    def __init__(self) -> None:
        self._logs: dict[LogId, LogIndex] = {}
        self.entries_count = 0

    def insert(self, log_id: LogId, location: Location) -> None:
        log = self._logs.get(log_id)
        if log is None:
            log = self._logs[log_id] = LogIndex()
        self.entries_count += 1 - log.insert(location)

    def locate(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn,
               records_max: int) -> list[Location]:
        log = self._logs.get(log_id)
        if log is None or from_lsn > until_lsn:
            return []
        return log.locate(from_lsn, until_lsn, records_max)

    def find_time(self, log_id: LogId, timestamp_ms: int) -> Lsn | None:
        log = self._logs.get(log_id)
        return log.find_time(timestamp_ms) if log is not None else None

    def ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        log = self._logs.get(log_id)
        return log.ranges(from_lsn, until_lsn) if log is not None else []

    def last_lsn(self, log_id: LogId) -> Lsn:
        log = self._logs.get(log_id)
        return log.last_lsn if log is not None else Lsn(0)
