"""The record store's index: per log, the STORE entries sorted by first LSN.

Each entry maps a batch ``[first_lsn, last_lsn]`` to where its bytes are in the segment files.
Entries of one log never overlap: a STORE of LSNs that are already stored (a later wave of the
same append, or a copy written by epoch recovery) replaces them. An older entry only partly
covered by a newer one stays visible for the LSNs the newer one does not cover.

Memory is bounded, not proportional to the data held: only the segment being written (and a
closed one until its index file is written) is indexed in memory, one ``LogIndex`` per log
and segment; every other segment's pieces are in its index file (``segment_index``), of which
memory holds the directory (a summary row per block of pieces) and a bounded LRU cache of
blocks (``BlockCache``). Each segment resolves overlaps within itself; across segments the
later one wins, so a lookup merges the segments that hold the log's LSNs (``RecordIndex``).
Records at or below a log's trim point are never returned (``RecordIndex.trims``); in memory
they are dropped at once (``drop_through``), in index files they stay until their segment is
reclaimed. ``SegmentRefs`` counts, per in-memory segment, the bytes of the entries it still
points at. Lives on the event loop only.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass

from shared.types import LogId, Lsn
from storage_node.segment_index import (
    PIECE_BYTES,
    BlockRef,
    Columns,
    IndexDirectory,
    decode_block,
)

log = logging.getLogger(__name__)


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

    __slots__ = ("entries", "live_bytes", "pieces")

    def __init__(self) -> None:
        self.entries: dict[int, dict[int, list[int]]] = {}
        self.live_bytes: dict[int, int] = {}
        self.pieces = 0

    def add(self, log_id: int, location: Location) -> None:
        self.pieces += 1
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
        self.pieces -= 1
        segment = self.entries[location.segment_id]
        entry = segment[location.offset]
        entry[0] -= 1
        if entry[0] == 0:
            del segment[location.offset]
            self.live_bytes[location.segment_id] -= location.length
            if not segment:
                del self.entries[location.segment_id]
                del self.live_bytes[location.segment_id]


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

    def load_sorted(self, locations: list[Location]) -> None:
        """Fill an empty index with pieces already sorted and disjoint (an index file's)."""
        assert not self._firsts
        self._firsts = [location.first_lsn for location in locations]
        self._locations = locations
        self._times = None
        add = self._refs.add
        log_id = self._log_id
        for location in locations:
            add(log_id, location)

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


class SealedSegment:
    """A segment whose index is in its index file (``segment_index``): in memory only the
    directory (per log, one summary row per block of up to ``BLOCK_PIECES_MAX`` pieces)."""

    __slots__ = ("covered", "fd", "logs", "pieces_count", "runs", "segment_id", "version")

    def __init__(self, directory: IndexDirectory, fd: int, version: int = 0) -> None:
        self.segment_id = directory.segment_id
        self.covered = directory.covered
        self.runs: dict[int, tuple[BlockRef, ...]] = directory.runs
        self.logs = directory.logs
        self.pieces_count = sum(b.count for blocks in self.runs.values() for b in blocks)
        self.fd = fd
        """Read-only descriptor of the index file this directory came from: a compaction
        renames a new one over it, and blocks must come from the file the directory
        describes."""
        self.version = version
        """The segment file version its offsets point into (``Location.version``)."""


class IndexDamaged(Exception):
    """A block of a segment's index file failed its checks (the caller rebuilds it)."""

    def __init__(self, segment_id: int) -> None:
        super().__init__(f"index of segment {segment_id} is damaged")
        self.segment_id = segment_id


class BlockCache:
    """Loaded index blocks, least recently used first out, at most ``bytes_max`` of them
    (``StorageConfig.index_cache_bytes_max``)."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self._blocks: OrderedDict[tuple[int, int, int, int], Columns] = OrderedDict()
        self.loads_count = 0
        self.hits_count = 0

    def get(self, segment: SealedSegment, log_id: int, block_no: int) -> Columns:
        key = (segment.segment_id, segment.version, log_id, block_no)
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
            self.hits_count += 1
            return block
        ref = segment.runs[log_id][block_no]
        try:
            data = os.pread(segment.fd, ref.count * PIECE_BYTES, ref.file_offset)
        except OSError as error:
            log.error("index of segment %d unreadable: %s", segment.segment_id, error)
            raise IndexDamaged(segment.segment_id) from error
        loaded = decode_block(data, ref)
        if loaded is None:
            raise IndexDamaged(segment.segment_id)
        self.loads_count += 1
        self._blocks[key] = loaded
        self.bytes += loaded.nbytes()
        while self.bytes > self.bytes_max and len(self._blocks) > 1:
            _key, old = self._blocks.popitem(last=False)
            self.bytes -= old.nbytes()
        return loaded

    def forget_segment(self, segment_id: int) -> None:
        for key in [k for k in self._blocks if k[0] == segment_id]:
            self.bytes -= self._blocks.pop(key).nbytes()


_Source = LogIndex | tuple[SealedSegment, tuple[BlockRef, ...]]


class RecordIndex:
    """Every log's pieces: per segment, either in memory (``LogIndex`` per log: the segment
    being written, and closed ones whose index file is not written yet) or in its index file
    (``SealedSegment``). A later segment's piece wins over an earlier one's for the LSNs both
    hold (segments are written in order; within a segment, ``LogIndex`` resolves it), so a
    lookup merges the segments that hold the log's LSNs. Records at or below a log's trim
    point are never returned (``trims``)."""

    def __init__(self, cache_bytes_max: int = 32 * 1024 * 1024) -> None:
        self._memory: dict[int, dict[LogId, LogIndex]] = {}
        self._memory_refs: dict[int, SegmentRefs] = {}
        self._sealed: dict[int, SealedSegment] = {}
        self._log_segments: dict[LogId, list[int]] = {}
        """Per log, the segments holding pieces of it, ascending."""
        self.trims: dict[LogId, Lsn] = {}
        self.cache = BlockCache(cache_bytes_max)

    # ---- writes (event loop) ----

    def insert(self, log_id: LogId, location: Location) -> None:
        segment_id = location.segment_id
        logs = self._memory.get(segment_id)
        if logs is None:
            logs = self._memory[segment_id] = {}
            self._memory_refs[segment_id] = SegmentRefs()
        log_index = logs.get(log_id)
        if log_index is None:
            log_index = logs[log_id] = LogIndex(log_id, self._memory_refs[segment_id])
            self._note_segment(log_id, segment_id)
        log_index.insert(location)

    def load_memory(self, segment_id: int, log_id: LogId, locations: list[Location]) -> None:
        """An in-memory segment's pieces of ``log_id`` from its index file (sorted, disjoint),
        before anything else of that log in that segment."""
        if not locations:
            return
        logs = self._memory.get(segment_id)
        if logs is None:
            logs = self._memory[segment_id] = {}
            self._memory_refs[segment_id] = SegmentRefs()
        assert log_id not in logs
        log_index = logs[log_id] = LogIndex(log_id, self._memory_refs[segment_id])
        self._note_segment(log_id, segment_id)
        log_index.load_sorted(locations)

    def _note_segment(self, log_id: LogId, segment_id: int) -> None:
        segments = self._log_segments.get(log_id)
        if segments is None:
            self._log_segments[log_id] = [segment_id]
        elif not segments or segments[-1] < segment_id:
            segments.append(segment_id)
        elif segment_id not in segments:
            bisect.insort(segments, segment_id)

    def drop_through(self, log_id: LogId, trim_lsn: Lsn) -> None:
        """Forget the records of ``log_id`` at or below its trim point (in memory at once;
        in index files they are skipped by every lookup, and go with their segment)."""
        if trim_lsn > self.trims.get(log_id, 0):
            self.trims[log_id] = trim_lsn
        for segment_id in list(self._log_segments.get(log_id, ())):
            logs = self._memory.get(segment_id)
            if logs is None or log_id not in logs:
                continue
            log_index = logs[log_id]
            log_index.drop_through(trim_lsn)
            if not len(log_index):
                del logs[log_id]
                self._forget_log_segment(log_id, segment_id)

    def _forget_log_segment(self, log_id: LogId, segment_id: int) -> None:
        segments = self._log_segments.get(log_id)
        if segments is not None and segment_id in segments:
            segments.remove(segment_id)
            if not segments:
                del self._log_segments[log_id]

    # ---- segments: in memory, in their index file ----

    def memory_segment_ids(self) -> list[int]:
        return sorted(self._memory)

    def sealed_ids(self) -> list[int]:
        return sorted(self._sealed)

    def sealed(self, segment_id: int) -> SealedSegment | None:
        return self._sealed.get(segment_id)

    def memory_entries(self, segment_id: int) -> int:
        """Pieces of an in-memory segment (what its index costs in memory)."""
        return self._memory_refs[segment_id].pieces if segment_id in self._memory_refs else 0

    def memory_snapshot(self, segment_id: int) -> dict[LogId, list[Location]]:
        """The pieces of an in-memory segment, per log (list copies: the ``Location``s never
        change, so another thread may read them while the loop goes on)."""
        return {log_id: list(log_index._locations)
                for log_id, log_index in self._memory.get(segment_id, {}).items()}

    def add_sealed(self, segment: SealedSegment) -> None:
        """The segment's index file is written (or found at open): its in-memory index, if
        any, goes."""
        segment_id = segment.segment_id
        old = self._sealed.pop(segment_id, None)
        if old is not None:
            self._drop_sealed(old)
        for memory_log in self._memory.pop(segment_id, {}):
            self._forget_log_segment(memory_log, segment_id)
        self._memory_refs.pop(segment_id, None)
        self._sealed[segment_id] = segment
        for sealed_log in segment.runs:
            self._note_segment(LogId(sealed_log), segment_id)

    def forget_segment(self, segment_id: int) -> None:
        """The segment was deleted."""
        for log_id in self._memory.pop(segment_id, {}):
            self._forget_log_segment(log_id, segment_id)
        self._memory_refs.pop(segment_id, None)
        sealed = self._sealed.pop(segment_id, None)
        if sealed is not None:
            self._drop_sealed(sealed)

    def _drop_sealed(self, segment: SealedSegment) -> None:
        for log_id in segment.runs:
            self._forget_log_segment(LogId(log_id), segment.segment_id)
        self.cache.forget_segment(segment.segment_id)
        with contextlib.suppress(OSError):
            os.close(segment.fd)

    def close(self) -> None:
        for segment in self._sealed.values():
            with contextlib.suppress(OSError):
                os.close(segment.fd)
        self._sealed.clear()

    def block(self, segment: SealedSegment, log_id: int, block_no: int) -> Columns:
        return self.cache.get(segment, log_id, block_no)

    # ---- accounting ----

    @property
    def entries_count(self) -> int:
        """Pieces held (each segment counts its own; trimmed ones in index files too)."""
        return (sum(len(log_index) for logs in self._memory.values()
                    for log_index in logs.values())
                + sum(s.pieces_count for s in self._sealed.values()))

    def live_bytes(self) -> dict[int, int]:
        """Per segment, the bytes of the entries still served: exact for in-memory segments;
        for one in its index file, the blocks with a piece above the trim point (an
        overestimate: an entry a later segment replaced counts until it is trimmed, so a
        segment is only ever deleted when nothing in it can be served)."""
        live: dict[int, int] = {}
        for segment_id, refs in self._memory_refs.items():
            live[segment_id] = refs.live_bytes.get(segment_id, 0)
        trims = self.trims
        for segment_id, segment in self._sealed.items():
            total = 0
            for log_id, blocks in segment.runs.items():
                trim = trims.get(LogId(log_id), 0)
                if blocks[-1].last_lsn <= trim:
                    continue
                total += sum(b.bytes for b in blocks if b.last_lsn > trim)
            live[segment_id] = total
        return live

    def memory_bytes(self) -> int:
        """Rough bytes of in-memory pieces (for stats)."""
        return self.cache.bytes + 400 * sum(
            len(log_index) for logs in self._memory.values() for log_index in logs.values())

    # ---- lookups (event loop) ----

    def log_ids(self) -> list[LogId]:
        return [log_id for log_id in self._log_segments
                if self.locate(log_id, Lsn(0), Lsn(2**64 - 2), 1)]

    def locations(self, log_id: LogId) -> list[Location]:
        """Every location of ``log_id`` in LSN order (tests compare indexes with it)."""
        return self.locate(log_id, Lsn(0), Lsn(2**64 - 2), 2**62)

    def _sources(self, log_id: LogId, lo: int, hi: int) -> list[tuple[int, int, int, _Source]]:
        """``(segment_id, first, last, source)`` of every segment holding pieces of
        ``log_id`` that may overlap ``[lo, hi]``, in segment order."""
        found: list[tuple[int, int, int, _Source]] = []
        for segment_id in self._log_segments.get(log_id, ()):
            logs = self._memory.get(segment_id)
            if logs is not None:
                log_index = logs.get(log_id)
                if log_index is None or not len(log_index):
                    continue
                first, last = log_index._firsts[0], log_index.last_lsn
                if last >= lo and first <= hi:
                    found.append((segment_id, first, last, log_index))
                continue
            segment = self._sealed.get(segment_id)
            if segment is None:
                continue
            blocks = segment.runs.get(log_id)
            if not blocks:
                continue
            if blocks[-1].last_lsn >= lo and blocks[0].first_lsn <= hi:
                found.append((segment_id, blocks[0].first_lsn, blocks[-1].last_lsn,
                              (segment, blocks)))
        return found

    def _gather(self, log_id: LogId, source: _Source, lo: int, hi: int,
                records_max: int) -> list[Location]:
        """Pieces of one segment overlapping ``[lo, hi]``, in LSN order, enough to cover
        ``records_max`` records of it."""
        if isinstance(source, LogIndex):
            return source.locate(Lsn(lo), Lsn(hi), records_max)
        segment, blocks = source
        found: list[Location] = []
        block_no = bisect.bisect_right(blocks, lo, key=_block_first) - 1
        if block_no < 0 or blocks[block_no].last_lsn < lo:
            block_no += 1
        records_count = 0
        while block_no < len(blocks) and blocks[block_no].first_lsn <= hi:
            block = self.block(segment, log_id, block_no)
            firsts, lasts = block.firsts, block.lasts
            index = bisect.bisect_right(firsts, lo) - 1
            if index < 0 or lasts[index] < lo:
                index += 1
            while index < len(firsts) and firsts[index] <= hi:
                first, last = firsts[index], lasts[index]
                efirst = block.efirsts[index]
                found.append(Location(segment.segment_id, block.offsets[index],
                                      block.lengths[index], Lsn(first), Lsn(last),
                                      Lsn(efirst if efirst != first else 0),
                                      block.times[index], segment.version))
                records_count += min(last, hi) - max(first, lo) + 1
                if records_count >= records_max:
                    return found
                index += 1
            block_no += 1
        return found

    def locate(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn,
               records_max: int) -> list[Location]:
        """Pieces holding LSNs in ``[from_lsn, until_lsn]`` above the trim point, in LSN
        order, enough to cover ``records_max`` records. Raises ``IndexDamaged`` when an index
        block is unreadable."""
        trim = self.trims.get(log_id, 0)
        lo = max(from_lsn, trim + 1)
        if lo > until_lsn or records_max < 1:
            return []
        sources = self._sources(log_id, lo, until_lsn)
        if not sources:
            return []
        if len(sources) == 1:
            found = self._gather(log_id, sources[0][3], lo, until_lsn, records_max)
            return _trimmed(found, trim)
        ordered = sorted(sources, key=lambda s: s[1])
        if all(a[2] < b[1] for a, b in itertools.pairwise(ordered)):
            # Disjoint LSN ranges (a log written in order): one segment after the other.
            found = []
            wanted = records_max
            for _segment_id, _first, _last, source in ordered:
                pieces = self._gather(log_id, source, lo, until_lsn, wanted)
                found += pieces
                wanted -= sum(min(p.last_lsn, until_lsn) - max(p.first_lsn, lo) + 1
                              for p in pieces)
                if wanted <= 0:
                    break
            return _trimmed(found, trim)
        return _trimmed(self._merged(log_id, sources, lo, until_lsn, records_max), trim)

    def _merged(self, log_id: LogId, sources: list[tuple[int, int, int, _Source]], lo: int,
                until: int, records_max: int) -> list[Location]:
        """``locate`` over segments whose LSN ranges overlap: window by window, every
        segment's pieces in the window inserted in segment order (later ones win), exactly
        as one in-memory index of all of them would hold them."""
        found: list[Location] = []
        wanted = records_max
        while lo <= until and wanted > 0:
            # The window's end: where the segment that runs out first stops; then widened to
            # the end of every piece starting in it, so that those are resolved completely.
            gathered = [self._gather(log_id, s[3], lo, until, wanted) for s in sources]
            hi = until
            for pieces in gathered:
                if pieces and sum(min(p.last_lsn, until) - max(p.first_lsn, lo) + 1
                                  for p in pieces) >= wanted:
                    hi = min(hi, pieces[-1].last_lsn)
            wide = max((p.last_lsn for pieces in gathered for p in pieces
                        if p.first_lsn <= hi), default=hi)
            wide = max(wide, hi)  # past ``until`` too: a piece's end must be resolved
            merged = LogIndex()
            for source in sources:
                for piece in self._gather(log_id, source[3], lo, wide, 2**62):
                    merged.insert(piece)
            for piece in merged.locate(Lsn(lo), Lsn(hi), wanted):
                found.append(piece)
                wanted -= min(piece.last_lsn, until) - max(piece.first_lsn, lo) + 1
                if wanted <= 0:
                    break
            lo = hi + 1
        return found

    def first_copy_lsn(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> Lsn | None:
        found = self.locate(log_id, from_lsn, until_lsn, 1)
        return Lsn(max(found[0].first_lsn, from_lsn)) if found else None

    def ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        """The LSN ranges held within ``[from_lsn, until_lsn]``."""
        return [(Lsn(max(loc.first_lsn, from_lsn)), Lsn(min(loc.last_lsn, until_lsn)))
                for loc in self.locate(log_id, from_lsn, until_lsn, 2**62)]

    def last_lsn(self, log_id: LogId) -> Lsn:
        trim = self.trims.get(log_id, 0)
        last = max((s[2] for s in self._sources(log_id, 0, 2**64)), default=0)
        return Lsn(last if last > trim else 0)

    def find_time(self, log_id: LogId, timestamp_ms: int) -> Lsn | None:
        """The first LSN of a record with a timestamp at or after ``timestamp_ms`` (timestamps
        taken as non-decreasing in LSN order, as one sequencer's clock gives), or None."""
        trim = self.trims.get(log_id, 0)
        lo = trim + 1
        sources = self._sources(log_id, lo, 2**64)
        while True:
            best: tuple[int, int] | None = None
            for _segment_id, _first, _last, source in sources:
                candidate = self._first_young(log_id, source, lo, timestamp_ms)
                if candidate is not None and (best is None or candidate[0] < best[0]):
                    best = candidate
            if best is None:
                return None
            start, end = best
            for piece in self.locate(log_id, Lsn(start), Lsn(end), 2**62):
                if piece.timestamp_ms >= timestamp_ms:
                    return Lsn(max(piece.first_lsn, start))
            lo = end + 1

    def _first_young(self, log_id: LogId, source: _Source, lo: int,
                     timestamp_ms: int) -> tuple[int, int] | None:
        """``(first, last)`` (first raised to ``lo``) of the first piece of one segment
        reaching ``lo`` or beyond whose timestamp is at or after ``timestamp_ms``."""
        if isinstance(source, LogIndex):
            times = source._running_times()
            index = max(bisect.bisect_left(times, timestamp_ms),
                        bisect.bisect_right(source._firsts, lo) - 1, 0)
            locations = source._locations
            while index < len(locations):
                piece = locations[index]
                if piece.last_lsn >= lo and piece.timestamp_ms >= timestamp_ms:
                    return max(piece.first_lsn, lo), piece.last_lsn
                index += 1
            return None
        segment, blocks = source
        block_no = max(bisect.bisect_right(blocks, lo, key=_block_first) - 1, 0)
        while block_no < len(blocks):
            ref = blocks[block_no]
            if ref.max_time_ms >= timestamp_ms and ref.last_lsn >= lo:
                block = self.block(segment, log_id, block_no)
                for first, last, time_ms in zip(block.firsts, block.lasts, block.times,
                                                strict=True):
                    if last >= lo and time_ms >= timestamp_ms:
                        return max(first, lo), last
            block_no += 1
        return None

    def last_before_time(self, log_id: LogId, timestamp_ms: int) -> Lsn | None:
        """The last LSN held below the first record not older than ``timestamp_ms`` (every
        record held up to there is older); None when the first record already is not."""
        young = self.find_time(log_id, timestamp_ms)
        if young is None:
            last = self.last_lsn(log_id)
            return last if last else None
        trim = self.trims.get(log_id, 0)
        best = 0
        for _segment_id, first, _last, source in self._sources(log_id, trim + 1, young - 1):
            if first >= young:
                continue
            best = max(best, self._last_below(log_id, source, young))
        return Lsn(best) if best > trim else None

    def _last_below(self, log_id: LogId, source: _Source, lsn: int) -> int:
        """The highest LSN one segment holds below ``lsn`` (0: none)."""
        if isinstance(source, LogIndex):
            index = bisect.bisect_left(source._firsts, lsn) - 1
            return min(source._locations[index].last_lsn, lsn - 1) if index >= 0 else 0
        segment, blocks = source
        block_no = bisect.bisect_left(blocks, lsn, key=_block_first) - 1
        if block_no < 0:
            return 0
        block = self.block(segment, log_id, block_no)
        index = bisect.bisect_left(block.firsts, lsn) - 1
        return min(block.lasts[index], lsn - 1) if index >= 0 else 0


def _block_first(block: BlockRef) -> int:
    return block.first_lsn


def _trimmed(found: list[Location], trim: int) -> list[Location]:
    """The first piece narrowed to start above the trim point (a piece in an index file
    keeps LSNs a trim has cut since)."""
    if found and found[0].first_lsn <= trim:
        found[0] = found[0].narrowed(trim + 1, found[0].last_lsn)
    return found
