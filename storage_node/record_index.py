"""In-memory index of the record store: per log, the STORE entries sorted by first LSN.

Each entry maps a batch ``[first_lsn, last_lsn]`` to where its bytes are in the segment files.
Entries of one log never overlap: a STORE of LSNs that are already stored (a later wave of the
same append, or a copy written by epoch recovery) replaces them. An older entry only partly
covered by a newer one stays visible for the LSNs the newer one does not cover.
Rebuilt from the segments at open; lives on the event loop only.

The index also counts, per segment, the bytes of the entries it still points at (``SegmentRefs``):
an entry no LSN above the trim point resolves to any more is dead, so a segment with no live
bytes can be deleted and one with few can be compacted. Records at or below a log's trim point
are dropped from the index (``drop_through``), so the index only ever holds what may be served.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from shared.types import LogId, Lsn


@dataclass(slots=True)
class Location:
    """Never changed once built (``narrowed`` and ``moved`` make new ones). Not a frozen
    dataclass only because that makes ``__init__`` about four times slower, and one is built
    per STORE written."""

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
    version: int = 0
    """Which file of ``segment_id``: compaction replaces a segment's file by a new one with
    the entries at other offsets (in memory only; a restart starts again from 0)."""

    @property
    def stored_first_lsn(self) -> Lsn:
        return self.entry_first_lsn or self.first_lsn

    def narrowed(self, first_lsn: int, last_lsn: int) -> Location:
        return Location(self.segment_id, self.offset, self.length, Lsn(first_lsn),
                        Lsn(last_lsn), self.stored_first_lsn, self.timestamp_ms, self.version)

    def moved(self, offset: int, version: int) -> Location:
        return Location(self.segment_id, offset, self.length, self.first_lsn, self.last_lsn,
                        self.stored_first_lsn, self.timestamp_ms, version)


class SegmentRefs:
    """Per segment, the entries the index points at: ``offset -> [pieces, length, log_id,
    first_lsn, last_lsn]`` (a re-STORE can split an entry into two pieces; the LSNs are the
    entry's whole range, where its pieces are), and their total bytes."""

    __slots__ = ("entries", "live_bytes")

    def __init__(self) -> None:
        self.entries: dict[int, dict[int, list[int]]] = {}
        self.live_bytes: dict[int, int] = {}

    def add(self, log_id: int, location: Location) -> None:
        segment = self.entries.get(location.segment_id)
        if segment is None:
            segment = self.entries[location.segment_id] = {}
        entry = segment.get(location.offset)
        if entry is None:
            segment[location.offset] = [1, location.length, log_id, location.first_lsn,
                                        location.last_lsn]
            self.live_bytes[location.segment_id] = (
                self.live_bytes.get(location.segment_id, 0) + location.length)
        else:
            # A piece re-added after its entry's other pieces went (a split): the range must
            # still cover every piece.
            entry[0] += 1
            entry[3] = min(entry[3], location.first_lsn)
            entry[4] = max(entry[4], location.last_lsn)

    def remove(self, location: Location) -> None:
        segment = self.entries[location.segment_id]
        entry = segment[location.offset]
        entry[0] -= 1
        if entry[0] == 0:
            del segment[location.offset]
            self.live_bytes[location.segment_id] -= location.length
            if not segment:
                del self.entries[location.segment_id]
                del self.live_bytes[location.segment_id]

    def forget_segment(self, segment_id: int) -> None:
        """The segment's file was deleted (it held no live entry)."""
        assert segment_id not in self.entries, segment_id
        self.live_bytes.pop(segment_id, None)


class LogIndex:
    """One log's entries; ``_firsts`` is sorted and parallel to ``_locations``."""

    __slots__ = ("_firsts", "_locations", "_log_id", "_refs", "_times")

    def __init__(self, log_id: int = 0, refs: SegmentRefs | None = None) -> None:
        self._log_id = log_id
        self._refs = refs if refs is not None else SegmentRefs()
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
            self._refs.add(self._log_id, location)
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
        refs = self._refs
        for old in self._locations[start:end]:
            refs.remove(old)
        for new in kept:
            refs.add(self._log_id, new)
        firsts[start:end] = [k.first_lsn for k in kept]
        self._locations[start:end] = kept
        return replaced - len(kept) + 1

    def drop_through(self, trim_lsn: Lsn) -> int:
        """Forget every LSN at or below ``trim_lsn``; returns how many entries went."""
        end = bisect.bisect_right(self._firsts, trim_lsn)
        if end == 0:
            return 0
        refs = self._refs
        dropped = self._locations[:end]
        for old in dropped:
            refs.remove(old)
        straddling = dropped[-1]
        kept: list[Location] = []
        if straddling.last_lsn > trim_lsn:
            kept.append(straddling.narrowed(trim_lsn + 1, straddling.last_lsn))
            refs.add(self._log_id, kept[0])
        self._firsts[:end] = [k.first_lsn for k in kept]
        self._locations[:end] = kept
        if self._times is not None:
            # A running maximum stays one after cutting a prefix off: the values kept are
            # those of the same locations.
            del self._times[: end - len(kept)]
        return end - len(kept)

    def relocate(self, segment_id: int, first_lsn: int, last_lsn: int, old_offset: int,
                 new_offset: int, version: int) -> None:
        """Point the pieces of the entry at ``old_offset`` of ``segment_id`` (LSNs within
        ``[first_lsn, last_lsn]``) at its copy in the compacted file."""
        index = max(bisect.bisect_right(self._firsts, first_lsn) - 1, 0)
        locations = self._locations
        while index < len(locations) and locations[index].first_lsn <= last_lsn:
            location = locations[index]
            if location.segment_id == segment_id and location.offset == old_offset:
                locations[index] = location.moved(new_offset, version)
            index += 1

    def last_before_time(self, timestamp_ms: int) -> Lsn | None:
        """The last LSN of the entries up to the first whose running-maximum timestamp is at
        or after ``timestamp_ms``: every record held up to there is older. None when the first
        entry already is not older."""
        index = bisect.bisect_left(self._running_times(), timestamp_ms)
        return self._locations[index - 1].last_lsn if index > 0 else None

    def _running_times(self) -> list[int]:
        if self._times is None:
            times: list[int] = []
            for location in self._locations:
                times.append(max(location.timestamp_ms, times[-1] if times else -1))
            self._times = times
        return self._times

    def find_time(self, timestamp_ms: int) -> Lsn | None:
        """The first LSN of a record with a timestamp at or after ``timestamp_ms`` (timestamps
        taken as non-decreasing in LSN order, as one sequencer's clock gives), or None."""
        times = self._running_times()
        index = bisect.bisect_left(times, timestamp_ms)
        if index == len(times):
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

    __slots__ = ("_logs", "entries_count", "refs")

    def __init__(self) -> None:
        self._logs: dict[LogId, LogIndex] = {}
        self.entries_count = 0
        self.refs = SegmentRefs()

    def insert(self, log_id: LogId, location: Location) -> None:
        log = self._logs.get(log_id)
        if log is None:
            log = self._logs[log_id] = LogIndex(log_id, self.refs)
        self.entries_count += 1 - log.insert(location)

    def drop_through(self, log_id: LogId, trim_lsn: Lsn) -> None:
        """Forget the records of ``log_id`` at or below its trim point."""
        log = self._logs.get(log_id)
        if log is not None:
            self.entries_count -= log.drop_through(trim_lsn)
            if not len(log):
                del self._logs[log_id]

    def relocate(self, segment_id: int, moves: dict[int, int], version: int) -> None:
        """Segment ``segment_id`` was compacted: each live entry at offset ``old`` is now at
        ``moves[old]`` of file ``version``. Every live entry must be in ``moves``."""
        entries = self.refs.entries.pop(segment_id, {})
        moved: dict[int, list[int]] = {}
        for old_offset, entry in entries.items():
            new_offset = moves[old_offset]
            _pieces, _length, log_id, first_lsn, last_lsn = entry
            self._logs[LogId(log_id)].relocate(segment_id, first_lsn, last_lsn, old_offset,
                                               new_offset, version)
            moved[new_offset] = entry
        if moved:
            self.refs.entries[segment_id] = moved

    def last_before_time(self, log_id: LogId, timestamp_ms: int) -> Lsn | None:
        log = self._logs.get(log_id)
        return log.last_before_time(timestamp_ms) if log is not None else None

    def locations(self, log_id: LogId) -> list[Location]:
        """Every location of ``log_id`` in LSN order (tests compare indexes with it)."""
        log = self._logs.get(log_id)
        return log.locate(Lsn(0), Lsn(2**64 - 1), 2**62) if log is not None else []

    def log_ids(self) -> list[LogId]:
        return list(self._logs)

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
