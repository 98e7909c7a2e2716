"""Durable record store on append-only segment files, with group commit.

STOREs and SEALs wait in one bounded FIFO (``StorageConfig.store_queue_records_max``; a full
queue answers OVERLOADED). Everything queued in one event-loop iteration (up to
``commit_batch_bytes_max``) is one batch, appended with one write call and at most one fsync
(group commit: whatever arrives while a batch is being committed joins the next one). A small
batch (``INLINE_COMMIT_BYTES_MAX``) found with the writer thread idle is committed inline, on
the loop: the hand-off to a thread and the wake-up back cost more than writing a few KiB and
fsyncing them (unless the disk is slow: see ``INLINE_COMMIT_US_MAX``). Bigger batches go to the
single writer thread, so that the loop goes on receiving while they are written; the thread
hands the result back with one ``call_soon_threadsafe``, whose callback completes every waiter
and starts the next batch at once (no asyncio task or future in between: every hop costs a
wake-up, and a STORE's latency is mostly wake-ups). A STORE is written as the bytes it arrived
as (``segment_format.store_entry_parts``), never packed again. Release pointers are coalesced
per log and ride along with the next batch, or are written alone within
``RELEASE_FLUSH_INTERVAL_MS`` (fsynced with the next batch, or ``RELEASE_SYNC_DELAY_MS``
later). Durability per ``StorageConfig.fsync``:
``always`` fsyncs before answering; ``interval`` answers after the write and fsyncs every
``fsync_interval_ms``; ``never`` leaves it to the kernel (a close still fsyncs). SEAL entries
are fsynced unless the mode is ``never``, since recovery relies on them.

Reads look the entries up in the index (``record_index``: in memory for the segment being
written, index files with a bounded block cache for the others) on the event loop, then pread and
CRC-check them in a read thread; a small read of the segment being written (a tailing reader:
what it asks for was just written, so it is in the page cache) is served right on the loop
(``read_now``, ``READ_INLINE_BYTES_MAX``), without the thread hop.

Reclaim (``reclaim()``, driven by the storage node's retention task): closed segments whose
records are all trimmed (or replaced) are deleted, mostly dead ones compacted. Before any file
goes, a CHECKPOINT entry of every log with entries in it is written and fsynced (see
``durable_state``), so that a restart rebuilds the same seals, trim points, release pointers,
epoch tails and index. Reads hold a ticket while in a read thread: the descriptor of a deleted
or replaced file is closed only once every read that might still use it has ended.

Index files (``segment_index``, ``index_files``): a closed segment's index is written to
``N.idx`` in the index thread (with the per-log state folded up to its end: the restart
checkpoint), the one being written every ``index_checkpoint_bytes`` (further apart once the
store holds many logs: ``CHECKPOINT_BYTES_PER_UNIT``); a restart resumes from
the newest sound checkpoint and reads only what was written after it (``_open_plan``), and a
scrub thread then checks the segments it did not read against their chunk CRCs.

Lifecycle: ``open()`` (index files, scan the rest, cut a torn tail, per-log state) ->
``submit_*``/``note_release``/``read`` -> ``close()`` (drain, fsync, close files).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from isal import isal_zlib

from shared import failpoints
from shared.config import StorageConfig
from shared.status import LogError, Status
from shared.types import EPOCH_INVALID, LSN_INVALID, Epoch, LogId, Lsn
from shared.wire.producer import ProducerEntry
from shared.wire.store import Store, copy_precedence
from storage_node import held_precedence
from storage_node.authority import AuthorityFile
from storage_node.core.authority import AuthorityStatus
from storage_node.core.rebuild_accept import HeldCopy
from storage_node.core.retention import ReclaimPlan, SegmentUsage, plan_reclaim
from storage_node.core.store_machine import LogStorageState
from storage_node.damage_scope import report_damaged
from storage_node.durable_state import DurableState, index_time
from storage_node.index_files import (
    TMP_SUFFIX,
    columns_of,
    load_directory,
    read_pieces,
    remove_index,
    segment_chunk_crcs,
    write_index,
)
from storage_node.producer_index import ProducerIndex
from storage_node.record_index import IndexDamaged, Location, RecordIndex, SealedSegment
from storage_node.record_reads import CopiesResult, ReadResult, read_locations
from storage_node.segment_files import (
    SEGMENT_SUFFIX,
    AppendResult,
    RecoveryReport,
    ScanFrom,
    ScanPlan,
    SegmentReader,
    SegmentWriter,
    segment_name,
)
from storage_node.segment_format import (
    CheckpointEntry,
    ScannedEntry,
    SealEntry,
    StoreMeta,
    TrimEntry,
    encode_checkpoint,
    encode_release,
    encode_seal,
    encode_store,
    encode_trim,
    scan_segment,
    store_entry_parts,
)
from storage_node.segment_index import CHUNK_BYTES, INDEX_SUFFIX, Columns, IndexDirectory
from storage_node.segment_reclaim import Compacted, ReclaimDone, run_reclaim

log = logging.getLogger(__name__)
T = TypeVar("T")

DoneFn = Callable[[Status], None]
_T = TypeVar("_T")
RELEASE_LOGS_PENDING_MAX = 100_000
"""Logs whose release pointer may wait for the writer; past it a pointer is only kept in
memory (it is re-learned from the sequencer's periodic RELEASE after a restart)."""
INLINE_COMMIT_BYTES_MAX = 32 * 1024
"""Batches up to this many (estimated) bytes are committed inline on the event loop when the
writer thread is idle; bigger ones go to the writer thread."""
INLINE_COMMIT_US_MAX = 1_000
"""Inline commits stop while small commits (write and fsync) take longer than this on
average: a slow disk must not stall the event loop. The writer thread's small commits keep the
average up to date, so inline commits resume when the disk is fast again."""
_COMMIT_US_WEIGHT = 0.125
"""Weight of the newest small commit in that running average."""
RELEASE_FLUSH_INTERVAL_MS = 5
"""Release pointers alone are written at most this often: they ride along with STORE batches
under load, and a lost one is re-learned from the sequencer's broadcast after a restart."""
RELEASE_SYNC_DELAY_MS = 50
"""``fsync=always``: a batch of release pointers alone is written without an fsync; the
pointers ride on the next batch's fsync, or are fsynced by themselves this long after the
write. Until then the node reports the older, fsynced pointer (``durable_release_lsn``)."""
READ_THREADS_COUNT = 4
READ_INLINE_BYTES_MAX = 64 * 1024
"""Reads of at most this many entry bytes, all in the segment being written, are served on
the event loop (``read_now``)."""
_FAILPOINT_BEFORE_FSYNC = "storage.after_write_before_fsync"
COUNTERS = (
    "stores", "store_records", "commit_batches", "inline_commits", "writer_handoffs",
    "inline_reads",
    "fsyncs", "bytes_written", "overloaded",
    "release_entries", "releases_dropped", "reads", "read_records", "read_checksum_failures",
    "torn_tail_bytes", "corrupt_segments", "reclaim_passes", "reclaim_failures",
    "checkpoint_entries", "segments_deleted", "bytes_deleted", "segments_compacted",
    "bytes_compacted", "bytes_copied", "segments_rolled", "index_files_written",
    "index_write_failures", "index_rebuilds",
)
"""Always present in ``stats()`` (monotonic totals)."""
_ENTRY_OVERHEAD_BYTES = 96
ROLL_DEAD_FRACTION_DIVISOR = 8
"""The segment being written is closed early once this fraction (1/8) of
``segment_bytes_max`` in it is dead."""
CHECKPOINT_BYTES_PER_UNIT = 256
"""A checkpoint (the index file of the segment being written) rewrites every piece of that
segment and the state of every log the store holds, a cost that grows with them: with
thousands of logs it was most of the storage node's CPU per record when written every
``index_checkpoint_bytes`` (issue 15). So the next one waits for at least this many bytes per
piece and per log it will hold: a checkpoint costs about as much per byte written whatever
the store holds, and the bytes a restart scans after the newest one stay in proportion to the
pieces and state that restart loads anyway."""
RECLAIM_DELETES_MAX = 1000
"""Segments one reclaim pass deletes at most (each is pinned open until reads let go)."""


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


ChunkSource = Store | SealEntry | TrimEntry | CheckpointEntry


@dataclass(slots=True)
class _Pending:
    chunk_source: ChunkSource
    done: DoneFn
    records_count: int
    bytes_estimate: int
    inline_ok: bool = True
    """False: a batch holding it is never committed inline (``submit_store``)."""


@dataclass(frozen=True, slots=True)
class ReclaimReport:
    """What one reclaim pass did."""

    segments_deleted: int = 0
    bytes_deleted: int = 0
    segments_compacted: int = 0
    bytes_compacted: int = 0
    """Bytes freed by compaction (old size minus new size)."""
    checkpoint_entries: int = 0
    failed: int = 0


class RecordStore:
    def __init__(self, *, data_dir: str, config: StorageConfig) -> None:
        self._data_dir = data_dir
        self._config = config
        segments_dir = os.path.join(data_dir, "segments")
        self._writer = SegmentWriter(
            segments_dir, segment_bytes_max=config.segment_bytes_max, fsync=config.fsync,
            disk_free_bytes_min=config.disk_free_bytes_min)
        self._reader = SegmentReader(segments_dir)
        self._index = RecordIndex(config.index_cache_bytes_max)
        self._index_thread = ThreadPoolExecutor(1, thread_name_prefix="seqlog-index")
        self._index_writes: set[asyncio.Future[None]] = set()
        self._index_busy: set[int] = set()
        """Segments with an index file write under way (one at a time per segment)."""
        self._index_deferred: dict[int, bool] = {}
        """Segments whose final index file was asked for while a write of theirs ran (their
        ``with_state``): written when that one finishes, or the final file would be lost."""
        self._index_covered: dict[int, int] = {}
        """Per in-memory segment, the data bytes its last index file write covered."""
        self._chunk_crcs: dict[int, list[int]] = {}
        self._to_scrub: list[tuple[int, int, tuple[int, ...]]] = []
        """(segment id, data bytes, chunk CRCs) of every closed segment a restart took from
        its index file without reading it: verified in the background after open."""
        self._scrub_thread = ThreadPoolExecutor(1, thread_name_prefix="seqlog-scrub")
        self._scrubbing: asyncio.Future[None] | None = None
        self._segment_versions: dict[int, int] = {}
        """File version of each compacted segment (absent: 0), as the reader numbers them."""
        """Per segment being written, the CRCs of its complete chunks known so far."""
        self._durable = DurableState(self._index,
                                     ProducerIndex(config.producer_ids_per_log_max))
        self._segments_dir = segments_dir
        self._segment_bytes: dict[int, int] = {}
        """Size of every segment file (as far as completed writes and reclaims know)."""
        self._newest_segment_id = 0
        self._corrupt_segments: frozenset[int] = frozenset()
        self.authority = AuthorityStatus()
        """Which of its copies this node can vouch for (``storage_node.core.authority``)."""
        self._authority_file = AuthorityFile(data_dir)
        self._authority_saves: set[asyncio.Future[None]] = set()
        """Writes of the status file under way (``close`` waits for them)."""
        self._reclaim_failed: set[int] = set()
        """Segments a reclaim could not delete or compact (an I/O error, a bad live entry):
        left alone until the next start, instead of being checkpointed and retried every
        pass."""
        self._reclaim_thread = ThreadPoolExecutor(1, thread_name_prefix="seqlog-reclaim")
        self._reclaiming = False
        self._read_ticket = 0
        self._reads_active: set[int] = set()
        self._retired: list[tuple[int, list[tuple[int, int]]]] = []
        """(read ticket when retired, reader keys): descriptors of deleted or replaced files,
        closed once no read with a ticket at or below it runs."""
        self._queue: collections.deque[_Pending] = collections.deque()
        self._not_inline_queued = 0
        """Queued entries with ``inline_ok`` False (none: batches are not scanned)."""
        self._batch_inline_ok = True
        """The batch just taken may be committed inline."""
        self._queued_records_count = 0
        self._inflight: list[_Pending] = []
        self._releases: dict[LogId, Lsn] = {}
        self._releases_written_ms = 0
        self._unsynced_releases: dict[LogId, Lsn] = {}
        """``fsync=always``: per log whose newest written release pointer is not fsynced yet,
        the last one that is (what ``durable_release_lsn`` reports meanwhile)."""
        self._release_sync_due_ms: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing = False
        """A batch or background sync is in the writer thread; the next one starts when it
        is done."""
        self._start_scheduled = False
        self._thread_jobs = 0
        """Jobs handed to the writer thread and not finished: an inline commit needs none (the
        segment writer is used by one thread at a time)."""
        self._small_commit_us = 0.0
        """Running average of small commits' duration (see ``INLINE_COMMIT_US_MAX``)."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle = asyncio.Event()
        """Set while nothing is queued or being written (``close`` waits for it)."""
        self._idle.set()
        self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="seqlog-writer")
        self._read_threads = ThreadPoolExecutor(READ_THREADS_COUNT,
                                                thread_name_prefix="seqlog-read")
        self._lock_fd = -1
        self._opened = self._closing = self._broken = False
        self._counts: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))

    async def open(self) -> dict[LogId, LogStorageState]:
        """Recover from the segments; returns what each log's state was. Raises LogError when
        the data directory is held by another process."""
        assert not self._opened
        loop = asyncio.get_running_loop()
        try:
            states, report = await loop.run_in_executor(self._writer_thread, self._open_sync)
        except BaseException:
            self._writer_thread.shutdown(wait=False)
            self._read_threads.shutdown(wait=False)
            self._reclaim_thread.shutdown(wait=False)
            self._index_thread.shutdown(wait=False)
            self._scrub_thread.shutdown(wait=False)
            self._index.close()
            raise
        self._counts.update(torn_tail_bytes=report.torn_tail_bytes,
                            corrupt_segments=report.corrupt_segments_count)
        self._segment_bytes = dict(report.segment_bytes)
        self._newest_segment_id = max(self._segment_bytes, default=0)
        self._corrupt_segments = report.corrupt_segment_ids
        self._opened = True
        self._loop = loop
        self._seal_closed(with_state=False)
        if self._to_scrub:
            self._scrubbing = loop.run_in_executor(self._scrub_thread, self._scrub_sync,
                                                   self._to_scrub)
            self._to_scrub = []
        if self._newest_segment_id not in self._corrupt_segments:
            # A fresh restart checkpoint (also of an empty newest segment: it covers the
            # segments scanned now): the next restart starts from here.
            self._write_index(self._newest_segment_id, final=False)
        self._arm_idle_timer()
        return states

    @property
    def disk_low(self) -> bool:
        return self._writer.disk_low

    def submit_store(self, store: Store, done: DoneFn, *, inline_ok: bool = True) -> Status:
        """Queue a (validated) STORE; ``done(status)`` is called once it is durable per the
        fsync mode (OK) or failed (NOSPC, DISABLED, SHUTDOWN, INTERNAL). Returns OK when
        queued, else the reason it was not (OVERLOADED, SHUTDOWN, NOTREADY, DISABLED) and
        ``done`` is never called. ``inline_ok=False`` (rebuilding's copies, a stream of small
        slices): its batch goes to the writer thread, so that the event loop is not held in
        an fsync per slice while appends' STOREs wait to be received."""
        wire_fields = store.wire_fields
        estimate = (len(wire_fields) if wire_fields is not None
                    else sum(map(len, store.payloads))) + _ENTRY_OVERHEAD_BYTES * len(
                        store.payloads)
        return self._enqueue(_Pending(store, done, store.records_count, estimate, inline_ok))

    def submit_seal(self, seal: SealEntry, done: DoneFn) -> Status:
        """Queue a durable seal; same contract as ``submit_store``."""
        return self._enqueue(_Pending(seal, done, 1, _ENTRY_OVERHEAD_BYTES))

    def submit_clean_mark(self, log_id: LogId, epoch: Epoch, esn: int, done: DoneFn) -> Status:
        """Queue a durable mark that ``epoch`` is settled here up to ``esn``
        (``StoreMachine.clean_mark``, ``drained_mark``; not its last-known-good ESN); same
        contract as ``submit_store``. Written as a checkpoint entry holding only that mark: a
        restart's scan and a live write merge checkpoints field by field, highest wins, so the
        entry changes nothing else, and the mark is in every later checkpoint."""
        entry = CheckpointEntry(log_id, LSN_INVALID, None, LSN_INVALID, EPOCH_INVALID, None,
                                LSN_INVALID, (), ((epoch, esn),))
        return self._enqueue(_Pending(entry, done, 1, _ENTRY_OVERHEAD_BYTES + 16))

    def submit_trim(self, trim: TrimEntry, done: DoneFn) -> Status:
        """Queue a durable trim point; same contract as ``submit_store``."""
        return self._enqueue(_Pending(trim, done, 1, _ENTRY_OVERHEAD_BYTES))

    def note_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        """Persist a release pointer with the next batch (coalesced; never waited for)."""
        if self._closing or self._broken:
            return
        current = self._releases.get(log_id)
        if current is None and len(self._releases) >= RELEASE_LOGS_PENDING_MAX:
            self._counts["releases_dropped"] += 1
            return
        if current is None or release_lsn > current:
            self._releases[log_id] = release_lsn
            if (not self._writing and not self._start_scheduled and self._idle_timer is None
                    and self._loop is not None):
                # An idle writer has no timer armed: without one a pointer that came alone (a
                # RELEASE) would wait for the next STORE, however long that takes.
                self._arm_idle_timer()

    async def read(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                   bytes_max: int) -> ReadResult:
        """Records of ``log_id`` in ``[from_lsn, until_lsn]``, at most ``records_max`` copies
        and, past the first, at most ``bytes_max`` payload bytes; a batch entry is split into
        its records and may be entered in the middle. Copies written by recovery also come
        as markers (holes and bridges only as markers)."""
        return ReadResult.of(await self.read_copies(log_id, from_lsn, until_lsn, records_max,
                                                    bytes_max, blocks_ok=True))

    async def read_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn,
                          records_max: int, bytes_max: int, *,
                          blocks_ok: bool = False) -> CopiesResult:
        """Like ``read``, with every copy's flags and wave (recovery's digest needs them);
        compressed batches are expanded into their records unless ``blocks_ok``
        (``record_reads``)."""
        assert until_lsn < 2**64 - 1 and records_max >= 1
        if not self._opened or self._closing:
            status = Status.SHUTDOWN if self._closing else Status.NOTREADY
            return CopiesResult(status, (), from_lsn)
        locations = self._locate(log_id, from_lsn, until_lsn, records_max)
        if not locations:
            return CopiesResult(Status.OK, (), Lsn(max(from_lsn, until_lsn + 1)))
        loop = asyncio.get_running_loop()
        self._read_ticket += 1
        ticket = self._read_ticket
        self._reads_active.add(ticket)
        try:
            result, corrupt = await loop.run_in_executor(
                self._read_threads, read_locations, self._reader, log_id, locations, from_lsn,
                until_lsn, records_max, bytes_max, blocks_ok)
        finally:
            self._reads_active.discard(ticket)
            if self._retired:
                self._release_retired()
        self._counts.update(reads=1, read_records=len(result.copies) + sum(
                                b[4] for b in result.blocks),
                            read_checksum_failures=int(corrupt is not None))
        if corrupt is not None:
            self._read_damage(log_id, corrupt)
        return result

    async def read_entries(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn,
                           records_max: int,
                           read_fn: Callable[[SegmentReader, LogId, list[Location]], T],
                           ) -> tuple[T | None, Lsn]:
        """``read_fn(reader, log_id, locations)`` in a read thread over the index locations
        of ``[from_lsn, until_lsn]`` (narrowed to that range, enough for ``records_max``
        records; rebuilding's donors), safe against reclaim like every read. Also returns
        the LSN after the last location (``until_lsn + 1`` when none is left)."""
        if not self._opened or self._closing:
            return None, from_lsn
        located = self._locate(log_id, from_lsn, until_lsn, records_max)
        locations = [loc if from_lsn <= loc.first_lsn and loc.last_lsn <= until_lsn
                     else loc.narrowed(max(from_lsn, loc.first_lsn),
                                       min(until_lsn, loc.last_lsn)) for loc in located]
        next_lsn = Lsn(locations[-1].last_lsn + 1 if locations else until_lsn + 1)
        if not locations:
            return read_fn(self._reader, log_id, []), next_lsn
        loop = asyncio.get_running_loop()
        self._read_ticket += 1
        ticket = self._read_ticket
        self._reads_active.add(ticket)
        try:
            result = await loop.run_in_executor(self._read_threads, read_fn, self._reader,
                                                log_id, locations)
        finally:
            self._reads_active.discard(ticket)
            if self._retired:
                self._release_retired()
        return result, next_lsn

    def read_now(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                 bytes_max: int) -> ReadResult | None:
        """``read`` done at once on the loop when it is small (``READ_INLINE_BYTES_MAX``) and
        all in the segment being written; None when it is not (then use ``read``)."""
        assert until_lsn < 2**64 - 1 and records_max >= 1
        if not self._opened or self._closing:
            return None
        locations = self._locate(log_id, from_lsn, until_lsn, records_max)
        if not locations:
            return ReadResult(Status.OK, (), Lsn(max(from_lsn, until_lsn + 1)))
        newest = self._newest_segment_id
        total_bytes = 0
        for location in locations:
            total_bytes += location.length
            if location.segment_id != newest or total_bytes > READ_INLINE_BYTES_MAX:
                return None
        # No ticket needed: nothing can retire a descriptor before this call returns. A
        # compressed batch the read covers whole goes out as its blob; only a read starting
        # inside one (rare for a tailing reader: a batch is released whole) expands it here.
        result, corrupt = read_locations(self._reader, log_id, locations, from_lsn, until_lsn,
                                         records_max, bytes_max, True)
        self._counts.update(reads=1, inline_reads=1, read_records=len(result.copies) + sum(
                                block[4] for block in result.blocks),
                            read_checksum_failures=int(corrupt is not None))
        if corrupt is not None:
            self._read_damage(log_id, corrupt)
        return ReadResult.of(result)

    def _locate(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn,
                records_max: int) -> list[Location]:
        return self._indexed(lambda: self._index.locate(log_id, from_lsn, until_lsn,
                                                        records_max))

    def _indexed(self, lookup: Callable[[], _T]) -> _T:
        """``lookup()``, after rebuilding any segment index file it finds damaged."""
        for _ in range(RECLAIM_DELETES_MAX):
            try:
                return lookup()
            except IndexDamaged as damaged:
                self._rebuild_index(damaged.segment_id)
        return lookup()

    def _read_damage(self, log_id: LogId, location: Location) -> None:
        """A read met a damaged entry: its LSNs are no longer vouched for (at once in
        answers; durable shortly after, off the loop)."""
        if self.authority.range_damaged(log_id, location.first_lsn, location.last_lsn):
            saving = asyncio.get_running_loop().run_in_executor(None, self._save_authority)
            self._authority_saves.add(saving)
            saving.add_done_callback(self._authority_saves.discard)

    async def save_authority(self) -> None:
        """Write the authoritative status now (rebuilding: before the cluster is told).
        Raises OSError if it cannot."""
        await asyncio.get_running_loop().run_in_executor(
            None, self._authority_file.save, self.authority)

    def _save_authority(self) -> None:
        try:
            self._authority_file.save(self.authority)
        except OSError as error:
            # Still in memory; a restart finds the bad entry again when it reads it.
            log.error("cannot persist the authoritative status: %s", error)

    def last_older_lsn(self, log_id: LogId, timestamp_ms: int) -> Lsn | None:
        """The last LSN held up to the first record not older than ``timestamp_ms`` (index
        lookup; see ``LogIndex.last_before_time``)."""
        return self._indexed(lambda: self._index.last_before_time(log_id, timestamp_ms))

    def durable_trim_lsn(self, log_id: LogId) -> Lsn:
        """The trim point the files hold (written; fsynced per the fsync mode)."""
        return self._durable.trim_lsn(log_id)

    def durable_release_lsn(self, log_id: LogId) -> Lsn:
        """The release pointer the files hold (with ``fsync=always``: fsynced, see
        ``RELEASE_SYNC_DELAY_MS``). What the node reports as its pointer to others
        (GET_LOG_STATE): after a crash it never reports less than it did before."""
        synced = self._unsynced_releases.get(log_id)
        return synced if synced is not None else self._durable.release_lsn(log_id)

    def find_time(self, log_id: LogId, timestamp_ms: int) -> Lsn | None:
        """The first LSN this store holds a record of with a timestamp at or after
        ``timestamp_ms`` (an index lookup: no I/O)."""
        return self._indexed(lambda: self._index.find_time(log_id, timestamp_ms))

    def producer_entries(self, log_id: LogId, producer_id: str) -> tuple[ProducerEntry, ...]:
        """The producer's latest idempotent appends this node holds copies of (no I/O)."""
        return self._durable.producers.entries(log_id, producer_id,
                                               self._durable.trim_lsn(log_id))

    def bridge_below(self, log_id: LogId, lsn: Lsn) -> Lsn | None:
        """Where a bridge was written below ``lsn`` in its epoch (no I/O; see
        ``DurableState.bridge_below``)."""
        return self._durable.bridge_below(log_id, lsn)

    def first_copy_lsn(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> Lsn | None:
        """The first LSN in ``[from_lsn, until_lsn]`` this store holds a copy of (no I/O)."""
        return self._indexed(lambda: self._index.first_copy_lsn(log_id, from_lsn, until_lsn))

    def held_ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        """The LSN ranges of ``log_id`` this store holds copies of within the range."""
        return self._indexed(lambda: self._index.ranges(log_id, from_lsn, until_lsn))

    def queued_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn
                      ) -> list[tuple[int, int, tuple[int, int]]]:
        """``(first_lsn, last_lsn, copy_precedence)`` of the copies of ``log_id`` overlapping
        the range that are queued or being written, not yet in the index (rebuilding must
        not queue an older copy after them: ``storage_node.core.rebuild_accept``). One pass
        over the bounded queue: for a donor's chunk, not per STORE."""
        found: list[tuple[int, int, tuple[int, int]]] = []
        for pending in itertools.chain(self._inflight, self._queue):
            source = pending.chunk_source
            if (type(source) is Store and source.log_id == log_id
                    and source.lsn <= until_lsn and source.last_lsn >= from_lsn):
                found.append((source.lsn, source.last_lsn,
                              copy_precedence(source.flags, source.wave)))
        return found

    def indexed_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn
                       ) -> list[tuple[int, int, held_precedence.CopyKey]]:
        """``(first_lsn, last_lsn, key)`` of the copies the index resolves the range to now
        (no I/O): rebuilding checks a copy whose precedence it read is still the one held."""
        return [(max(loc.first_lsn, from_lsn), min(loc.last_lsn, until_lsn),
                 held_precedence.key_of(loc))
                for loc in self._locate(log_id, from_lsn, until_lsn, until_lsn - from_lsn + 1)]

    def read_precedences(self, log_id: LogId, ranges: list[tuple[int, int]],
                         done: Callable[[list[HeldCopy]], None]) -> None:
        """The precedence of the copies indexed in ``ranges``, read off the loop, then
        ``done(copies)`` (``storage_node.held_precedence``)."""
        held_precedence.read_held(self, log_id, ranges, done)

    def index_snapshot(self) -> dict[LogId, list[tuple[int, ...]]]:
        """Per log, every index location without its in-memory file version: what a restart
        must rebuild exactly (tests compare them)."""
        snapshot: dict[LogId, list[tuple[int, ...]]] = {}
        for log_id in sorted(self._indexed(self._index.log_ids)):
            locations = self._indexed(functools.partial(self._index.locations, log_id))
            snapshot[log_id] = [(loc.segment_id, loc.offset, loc.length, loc.first_lsn,
                                 loc.last_lsn, loc.stored_first_lsn, loc.timestamp_ms)
                                for loc in locations]
        return snapshot

    def open_files_count(self) -> int:
        """Segment descriptors open for reads (old file versions included)."""
        return self._reader.open_count()

    def stats(self) -> dict[str, int]:
        counts = dict(self._counts)
        counts.update(queued_records=self._queued_records_count,
                      index_entries=self._index.entries_count,
                      disk_bytes=sum(self._segment_bytes.values()),
                      segments=len(self._segment_bytes),
                      live_bytes=sum(self._index.live_bytes().values()),
                      index_memory_segments=len(self._index.memory_segment_ids()),
                      index_sealed_segments=len(self._index.sealed_ids()),
                      index_cache_bytes=self._index.cache.bytes,
                      index_cache_loads=self._index.cache.loads_count,
                      segment_id=self._writer.segment_id,
                      write_calls=self._writer.write_calls_count,
                      fdatasyncs=self._writer.fdatasyncs_count,
                      zero_fill_bytes=self._writer.zero_fill_bytes,
                      disk_low=int(self._writer.disk_low), broken=int(self._broken),
                      producers=self._durable.producers.producers_count,
                      producers_forgotten=self._durable.producers.forgotten_count,
                      small_commit_us=round(self._small_commit_us),
                      non_authoritative=int(self.authority.damaged))
        return counts

    async def close(self) -> None:
        """Drain queued work, fsync and close. Later submissions get SHUTDOWN."""
        if self._closing:
            return
        self._closing = True
        if self._loop is not None:
            self._kick()
            await self._idle.wait()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        newest = self._newest_segment_id
        if (self._opened and not self._broken and newest not in self._corrupt_segments
                and self._segment_bytes.get(newest, 0) > self._index_covered.get(newest, 0)):
            # The next start then reads the index instead of scanning the newest segment.
            self._write_index(newest, final=False, closing=True)
        if self._authority_saves:
            await asyncio.gather(*self._authority_saves)
        loop = asyncio.get_running_loop()
        # Waits for reads and a reclaim already running so that no descriptor is closed under
        # them.
        await asyncio.to_thread(self._read_threads.shutdown, True)
        await asyncio.to_thread(self._reclaim_thread.shutdown, True)
        if self._index_writes:
            await asyncio.gather(*self._index_writes, return_exceptions=True)
        await asyncio.to_thread(self._index_thread.shutdown, True)
        await asyncio.to_thread(self._scrub_thread.shutdown, True)
        await loop.run_in_executor(self._writer_thread, self._close_sync)
        self._writer_thread.shutdown(wait=False)
        self._index.close()

    async def reclaim(self) -> ReclaimReport:
        """One bounded reclaim pass: checkpoint the logs of the segments to delete or compact,
        then delete and compact them (in the reclaim thread) and update the index."""
        if not self._opened or self._closing or self._broken or self._reclaiming:
            return ReclaimReport()
        self._reclaiming = True
        try:
            return await self._reclaim()
        finally:
            self._reclaiming = False

    def reclaim_plan(self) -> ReclaimPlan:
        live = self._index.live_bytes()
        return plan_reclaim(
            (SegmentUsage(segment_id, size, min(live.get(segment_id, 0), size))
             for segment_id, size in self._segment_bytes.items()),
            newest_segment_id=self._newest_segment_id,
            # A segment still indexed in memory waits for its index file.
            excluded=(self._corrupt_segments | self._reclaim_failed
                      | set(self._index.memory_segment_ids())),
            live_fraction_max=self._config.compaction_live_fraction_max,
            copy_bytes_max=self._config.reclaim_bytes_per_pass_max,
            deletes_max=RECLAIM_DELETES_MAX)

    async def _reclaim(self) -> ReclaimReport:
        await self._roll_if_dead()
        if self._index_writes:
            # Closed segments still indexed in memory are left alone: let their index files
            # land first.
            await asyncio.gather(*list(self._index_writes), return_exceptions=True)
        plan = self.reclaim_plan()
        if not plan:
            return ReclaimReport()
        self._counts["reclaim_passes"] += 1
        logs: set[LogId] = set()
        for segment_id in plan.delete + plan.compact:
            logs |= self._durable.segment_logs.get(segment_id, set())
        checkpoints = [self._durable.checkpoint(log_id) for log_id in sorted(logs)]
        if checkpoints and not await self._write_checkpoints(checkpoints):
            self._counts["reclaim_failures"] += 1
            return ReclaimReport(failed=len(plan.delete) + len(plan.compact))
        self._counts["checkpoint_entries"] += len(checkpoints)
        if self._closing:
            return ReclaimReport(checkpoint_entries=len(checkpoints))
        # Live entries only ever die (trims, re-STOREs); none is born in a closed segment. So
        # the entries copied now cover every entry still live once the copy is swapped in.
        delete = list(plan.delete)
        compact: list[tuple[SealedSegment, dict[int, int]]] = []
        for segment_id in plan.compact:
            sealed = self._index.sealed(segment_id)
            if sealed is not None:
                trims: dict[int, int] = {
                    log_id: self._durable.trim_lsn(LogId(log_id)) for log_id in sealed.runs}
                compact.append((sealed, trims))
        loop = asyncio.get_running_loop()
        done, indexed = await loop.run_in_executor(
            self._reclaim_thread, self._reclaim_sync, delete, compact)
        return self._apply_reclaim(done, indexed, len(checkpoints))

    def _reclaim_sync(self, delete: list[int], compact: list[tuple[SealedSegment, dict[int, int]]]
                      ) -> tuple[ReclaimDone, dict[int, tuple[IndexDirectory, int] | None]]:
        """Reclaim thread: the live entries of each segment to compact from its index file
        (every piece above its log's trim point: an entry a later segment replaced is copied
        too), then ``run_reclaim``, then the compacted segments' new index files (a crash
        before one is written leaves the old one, which no longer matches the segment's size:
        the segment is scanned at the next start)."""
        segments_dir = self._segments_dir
        plans: list[tuple[int, list[tuple[int, int]]]] = []
        pieces_of: dict[int, Any] = {}
        for sealed, trims in compact:
            pieces = read_pieces(sealed.fd, _directory_of(sealed))
            if pieces is None:
                log.error("reclaim: index of segment %d is damaged; not compacted",
                          sealed.segment_id)
                continue
            live: dict[int, int] = {}
            for log_id, columns in pieces.items():
                trim = trims.get(log_id, 0)
                for last, offset, length in zip(columns.lasts, columns.offsets,
                                                columns.lengths, strict=True):
                    if last > trim:
                        live[offset] = length
            pieces_of[sealed.segment_id] = (pieces, trims, sealed.logs)
            if live:
                plans.append((sealed.segment_id, sorted(live.items())))
            else:
                delete.append(sealed.segment_id)
        done = run_reclaim(segments_dir, self._reader, delete, plans)
        for deleted in done.deleted:
            try:
                remove_index(segments_dir, deleted.segment_id)
            except OSError as error:
                log.error("reclaim: cannot remove the index of segment %d: %s",
                          deleted.segment_id, error)
        indexed: dict[int, tuple[IndexDirectory, int] | None] = {}
        for compacted in done.compacted:
            pieces, trims, _logs = pieces_of[compacted.segment_id]
            try:
                indexed[compacted.segment_id] = _write_compacted_index(
                    segments_dir, compacted, pieces, trims)
            except OSError as error:
                log.error("reclaim: index of compacted segment %d not written: %s",
                          compacted.segment_id, error)
                indexed[compacted.segment_id] = None
        return done, indexed

    async def _roll_if_dead(self) -> None:
        """Close the segment being written when enough of it is dead, so that it can be
        reclaimed: without this, a log written slowly would keep its trimmed records on disk
        until the segment fills up."""
        newest = self._newest_segment_id
        size = self._segment_bytes.get(newest, 0)
        live = self._index.live_bytes().get(newest, 0)
        dead = size - live
        if dead < self._config.segment_bytes_max // ROLL_DEAD_FRACTION_DIVISOR or not (
                live == 0 or live < size * self._config.compaction_live_fraction_max):
            return
        loop = asyncio.get_running_loop()
        self._thread_jobs += 1
        try:
            segment_id, fsyncs = await loop.run_in_executor(self._writer_thread,
                                                            self._writer.roll)
        except OSError as error:
            log.error("reclaim: cannot close segment %d: %s", newest, error)
            return
        finally:
            self._thread_jobs -= 1
        self._counts.update(fsyncs=fsyncs, segments_rolled=1)
        self._segment_bytes.setdefault(segment_id, 0)
        if segment_id > self._newest_segment_id:
            # No batch landed in the new segment yet (it would have sealed the old one).
            self._newest_segment_id = segment_id
            self._seal_closed()

    async def _write_checkpoints(self, checkpoints: list[CheckpointEntry]) -> bool:
        """Queue the checkpoint entries (past the queue limit: they are few and must not
        starve behind STOREs) and wait until they are durable; False if any failed."""
        if self._closing or self._broken:
            return False
        loop = asyncio.get_running_loop()
        results: list[Status] = []
        finished: asyncio.Future[None] = loop.create_future()

        def done(status: Status) -> None:
            results.append(status)
            if len(results) == len(checkpoints) and not finished.done():
                finished.set_result(None)

        for entry in checkpoints:
            estimate = _ENTRY_OVERHEAD_BYTES + 16 * (len(entry.tails) + len(entry.settled))
            self._queue.append(_Pending(entry, done, 0, estimate))
        self._kick()
        await finished
        return all(status is Status.OK for status in results)

    def _apply_reclaim(self, done: ReclaimDone,
                       indexed: dict[int, tuple[IndexDirectory, int] | None],
                       checkpoint_entries: int) -> ReclaimReport:
        self._reclaim_failed.update(done.failed)
        retired: list[tuple[int, int]] = []
        for deleted in done.deleted:
            self._segment_bytes.pop(deleted.segment_id, None)
            self._durable.segment_logs.pop(deleted.segment_id, None)
            self._index.forget_segment(deleted.segment_id)
            self._segment_versions.pop(deleted.segment_id, None)
            retired.append((deleted.segment_id, deleted.version))
        for compacted in done.compacted:
            segment_id = compacted.segment_id
            self._segment_versions[segment_id] = compacted.new_version
            self._segment_bytes[segment_id] = compacted.new_bytes
            written = indexed.get(segment_id)
            if written is not None:
                directory, fd = written
                self._index.add_sealed(SealedSegment(directory, fd, compacted.new_version))
                # Only logs with a live STORE in it are left; the rest was checkpointed.
                self._durable.segment_logs[segment_id] = {LogId(x) for x in directory.runs}
            else:
                # No index file: the moved entries are indexed in memory from a scan of the
                # new file, and its index file is written again.
                self._index.forget_segment(segment_id)
                self._rescan_into_memory(segment_id, compacted.new_version,
                                         compacted.new_bytes)
            retired.append((segment_id, compacted.old_version))
        if retired:
            self._retired.append((self._read_ticket, retired))
            self._release_retired()
        report = ReclaimReport(
            segments_deleted=len(done.deleted),
            bytes_deleted=sum(d.file_bytes for d in done.deleted),
            segments_compacted=len(done.compacted),
            bytes_compacted=sum(c.old_bytes - c.new_bytes for c in done.compacted),
            checkpoint_entries=checkpoint_entries, failed=len(done.failed))
        self._counts.update(
            segments_deleted=report.segments_deleted, bytes_deleted=report.bytes_deleted,
            segments_compacted=report.segments_compacted,
            bytes_compacted=report.bytes_compacted,
            bytes_copied=sum(c.new_bytes for c in done.compacted),
            reclaim_failures=report.failed)
        return report

    def _release_retired(self) -> None:
        """Close the descriptors no running read can use. A read locates its entries when it
        takes its ticket, so a file retired when the newest ticket was T may be used by reads
        with tickets up to T, and by none after."""
        oldest = min(self._reads_active, default=self._read_ticket + 1)
        keys: list[tuple[int, int]] = []
        while self._retired and self._retired[0][0] < oldest:
            keys += self._retired.pop(0)[1]
        if keys:
            self._reader.release(keys)

    # ---- queue and writer task (event loop) ----

    def _enqueue(self, pending: _Pending) -> Status:
        if self._closing:
            return Status.SHUTDOWN
        if not self._opened:
            return Status.NOTREADY
        if self._broken:
            return Status.DISABLED
        queued = self._queued_records_count
        # An empty queue admits anything, so one batch bigger than the limit still passes.
        if queued and queued + pending.records_count > self._config.store_queue_records_max:
            self._counts["overloaded"] += 1
            return Status.OVERLOADED
        self._queued_records_count += pending.records_count
        if not pending.inline_ok:
            self._not_inline_queued += 1
        self._queue.append(pending)
        self._kick()
        return Status.OK

    def _kick(self) -> None:
        """There is work: start a batch in the next loop iteration (so that every STORE
        received in this one joins it) unless one is being written, whose completion starts
        the next."""
        self._idle.clear()
        if not self._writing and not self._start_scheduled and self._loop is not None:
            self._start_scheduled = True
            self._loop.call_soon(self._start_next)

    def _start_next(self) -> None:
        """Hand the next batch (or a due background sync) to the writer thread, or go idle
        with a timer for the next background duty."""
        self._start_scheduled = False
        if self._writing:
            return
        if self._queue or (self._releases and (
                self._closing or self._release_flush_due_ms() <= 0)):
            self._start_batch()
            return
        if not self._closing:
            timeout_s = self._idle_timeout_s()
            if timeout_s is not None and timeout_s <= 0:
                # A background duty is due: pending release pointers go with it.
                if self._releases:
                    self._start_batch()
                else:
                    self._start_sync()
                return
        self._arm_idle_timer()
        self._idle.set()

    def _arm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._closing or self._loop is None:
            return
        timeout_s = self._idle_timeout_s()
        if timeout_s is not None:
            self._idle_timer = self._loop.call_later(max(timeout_s, 0.0), self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        """A background duty is due (release pointers, an interval fsync, a disk check)."""
        self._idle_timer = None
        if self._writing or self._start_scheduled or self._closing:
            return  # the writer is busy anyway; its completion looks again
        self._idle.clear()
        if self._queue or self._releases:
            self._start_batch()
        else:
            self._start_sync()

    def _run_in_writer(self, job: Callable[[], object],
                       finish: Callable[[object | BaseException], None]) -> None:
        """Run ``job`` in the writer thread; ``finish(result or exception)`` runs on the loop
        as soon as it is done (one thread-safe wake-up, no task or future in between)."""
        loop = self._loop
        assert loop is not None and not self._writing
        self._writing = True
        self._thread_jobs += 1
        self._counts["writer_handoffs"] += 1

        def run() -> None:
            outcome: object | BaseException
            try:
                outcome = job()
            except BaseException as error:  # handed to the loop, which fails the batch
                outcome = error
            # RuntimeError: the loop is closed, nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finished, outcome)

        def finished(outcome: object | BaseException) -> None:
            self._thread_jobs -= 1
            finish(outcome)

        self._writer_thread.submit(run)

    def _writer_failed(self, error: BaseException) -> None:
        log.error("record store writer failed; refusing further writes",
                  exc_info=(type(error), error, error.__traceback__))
        self._broken = True
        self._fail_all(Status.INTERNAL)

    def _interval_sync_due_ms(self) -> int:
        """Milliseconds until unsynced writes are due for an fsync (interval mode)."""
        dirty_since_ms = self._writer.dirty_since_ms
        if self._config.fsync != "interval" or dirty_since_ms is None:
            return 2**31
        now_ms = time.monotonic_ns() // 1_000_000
        return dirty_since_ms + self._config.fsync_interval_ms - now_ms

    def _release_flush_due_ms(self) -> int:
        return self._releases_written_ms + RELEASE_FLUSH_INTERVAL_MS - _now_ms()

    def _releases_synced(self) -> None:
        """An fsync covered every release pointer written before it."""
        self._unsynced_releases.clear()
        self._release_sync_due_ms = None

    def _idle_timeout_s(self) -> float | None:
        timeouts_ms: list[int] = []
        if self._release_sync_due_ms is not None:
            timeouts_ms.append(max(self._release_sync_due_ms - _now_ms(), 0))
        if self._releases:
            timeouts_ms.append(max(self._release_flush_due_ms(), 0))
        if self._config.fsync == "interval" and self._writer.dirty_since_ms is not None:
            timeouts_ms.append(self._interval_sync_due_ms())
        if self._writer.disk_low:
            timeouts_ms.append(100)
        return min(timeouts_ms) / 1000 if timeouts_ms else None

    def _start_sync(self) -> None:
        fsync = self._config.fsync == "interval" or bool(self._unsynced_releases)

        def finish(outcome: object | BaseException) -> None:
            self._writing = False
            if isinstance(outcome, BaseException):
                self._writer_failed(outcome)
            else:
                assert isinstance(outcome, int)
                self._counts["fsyncs"] += outcome
                if fsync:
                    self._releases_synced()  # nothing was written meanwhile (one writer)
            self._start_next()

        self._run_in_writer(lambda: self._sync_sync(fsync), finish)

    def _start_batch(self) -> None:
        batch, batch_bytes = self._take_batch()
        releases = list(self._releases.items())
        self._releases = {}
        self._releases_written_ms = _now_ms()
        mode = self._config.fsync
        # Seals and recovery's writes are what later recoveries rely on: synced in every mode
        # but "never". A checkpoint is synced in every mode: files are deleted right after.
        has_seal = any(not isinstance(p.chunk_source, Store) or p.chunk_source.flags
                       for p in batch)
        # Release pointers alone are not fsynced at once ("always"): they ride on the next
        # batch's fsync or are synced RELEASE_SYNC_DELAY_MS later (durable_release_lsn).
        fsync = (mode == "always" and bool(batch)) or (mode != "never" and has_seal) or (
            mode == "interval" and self._interval_sync_due_ms() <= 0) or any(
            isinstance(p.chunk_source, CheckpointEntry) for p in batch)
        self._inflight = batch
        small = batch_bytes + _ENTRY_OVERHEAD_BYTES * len(releases) <= INLINE_COMMIT_BYTES_MAX

        def finish(outcome: object | BaseException) -> None:
            self._writing = False
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                assert isinstance(outcome, tuple)
                self._batch_written(batch, releases, small, *outcome, synced=fsync)
            except BaseException as error:  # from the writer thread or the fold: stop writing
                self._writer_failed(error)

        # Rolling to a new segment (fsync, create, directory sync) is left to the thread.
        fits = (self._segment_bytes.get(self._newest_segment_id, 0) + batch_bytes
                + _ENTRY_OVERHEAD_BYTES * len(releases) <= self._config.segment_bytes_max)
        if (small and fits and self._batch_inline_ok and not self._thread_jobs
                and not self._closing
                and self._small_commit_us <= INLINE_COMMIT_US_MAX):
            # Inline: the writer thread is idle, so the segment writer is ours right now.
            self._writing = True
            self._counts["inline_commits"] += 1
            outcome: object | BaseException
            try:
                outcome = self._append_sync(batch, releases, fsync)
            except Exception as error:  # handled like a failure in the writer thread
                outcome = error
            finish(outcome)
            # The waiters just answered may have queued more: that is the next batch, started
            # in the next iteration (with whatever else arrives meanwhile), never recursively.
            self._schedule_next()
            return

        def finish_in_thread(outcome: object | BaseException) -> None:
            finish(outcome)
            self._start_next()

        self._run_in_writer(lambda: self._append_sync(batch, releases, fsync), finish_in_thread)

    def _schedule_next(self) -> None:
        if not self._start_scheduled and self._loop is not None:
            self._start_scheduled = True
            self._loop.call_soon(self._start_next)

    def _batch_written(self, batch: list[_Pending], releases: list[tuple[LogId, Lsn]],
                       small: bool, result: AppendResult, lengths: list[int],
                       elapsed_ns: int, *, synced: bool) -> None:
        """``synced``: the batch was fsynced (with everything written before it)."""
        self._inflight = []
        if small:
            self._small_commit_us += (elapsed_ns / 1000 - self._small_commit_us) * (
                _COMMIT_US_WEIGHT)
        self._queued_records_count -= sum(p.records_count for p in batch)
        self._counts.update(commit_batches=1, fsyncs=result.fsyncs_count,
                            bytes_written=sum(lengths) if result.status == Status.OK else 0)
        if result.status != Status.OK:
            self._broken = self._broken or result.broken
            # Not queued again: with a full disk that would spin the writer. The pointers stay
            # in memory and the sequencer's periodic RELEASE brings them back after a restart.
            self._counts["releases_dropped"] += len(releases)
            self._complete(batch, result.status)
            return
        offset = result.offset
        segment_id = result.segment_id
        if segment_id > self._newest_segment_id:
            # The writer rolled: everything folded so far is exactly the closed segments'.
            self._newest_segment_id = segment_id
            self._seal_closed()
        durable = self._durable
        stores_count = 0
        records_count = 0
        # The same fold as a restart's scan: index, per-log state, logs per segment. Runs of
        # STOREs are folded in one call each (the common case: the whole batch).
        stores: list[tuple[int, int, Store]] = []
        for pending, length in zip(batch, lengths, strict=False):
            source = pending.chunk_source
            if type(source) is Store:
                stores.append((offset, length, source))
                records_count += pending.records_count
            else:
                if stores:
                    durable.on_stores(segment_id, stores)
                    stores_count += len(stores)
                    stores = []
                assert not isinstance(source, Store)
                durable.on_entry(segment_id, ScannedEntry(offset, length, source))
            offset += length
        if stores:
            durable.on_stores(segment_id, stores)
            stores_count += len(stores)
        if synced:
            self._releases_synced()
        for (log_id, release_lsn), length in zip(releases, lengths[len(batch):], strict=True):
            if not synced and self._config.fsync == "always":
                self._unsynced_releases.setdefault(log_id, durable.release_lsn(log_id))
                if self._release_sync_due_ms is None:
                    self._release_sync_due_ms = _now_ms() + RELEASE_SYNC_DELAY_MS
            durable.on_release(segment_id, log_id, release_lsn)
            offset += length
        self._segment_bytes[segment_id] = offset
        if offset - self._index_covered.get(segment_id, 0) >= self._checkpoint_bytes(
                segment_id):
            self._write_index(segment_id, final=False)
        if self._index.memory_entries(segment_id) >= self._config.index_memory_entries_max:
            self._writer.roll_requested = True
        self._counts.update(stores=stores_count, store_records=records_count,
                            release_entries=len(releases))
        self._complete(batch, Status.OK)

    def _checkpoint_bytes(self, segment_id: int) -> int:
        """Bytes written to the segment after its last index file before the next one: at
        least ``index_checkpoint_bytes``, and more once a checkpoint holds much
        (``CHECKPOINT_BYTES_PER_UNIT``)."""
        return max(self._config.index_checkpoint_bytes, CHECKPOINT_BYTES_PER_UNIT * (
            self._index.memory_entries(segment_id) + self._durable.logs_count))

    def _take_batch(self) -> tuple[list[_Pending], int]:
        """The next batch and its estimated bytes."""
        bytes_cap = min(self._config.commit_batch_bytes_max, self._config.segment_bytes_max)
        batch: list[_Pending] = []
        total_bytes = 0
        not_inline = self._not_inline_queued
        while self._queue:
            pending = self._queue[0]
            if batch and total_bytes + pending.bytes_estimate > bytes_cap:
                break
            batch.append(self._queue.popleft())
            total_bytes += pending.bytes_estimate
            if not_inline and not pending.inline_ok:
                self._not_inline_queued -= 1
        self._batch_inline_ok = not_inline == self._not_inline_queued
        return batch, total_bytes

    def _complete(self, batch: list[_Pending], status: Status) -> None:
        for pending in batch:
            try:
                pending.done(status)
            except Exception:
                # One faulty continuation must not stop the writer or the other waiters.
                log.exception("record store completion callback failed")

    def _fail_all(self, status: Status) -> None:
        failed = self._inflight + list(self._queue)
        self._inflight = []
        self._queue.clear()
        self._queued_records_count = 0
        self._not_inline_queued = 0
        self._complete(failed, status)

    # ---- blocking parts (writer thread / read threads) ----

    def _open_sync(self) -> tuple[dict[LogId, LogStorageState], RecoveryReport]:
        os.makedirs(self._data_dir, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self._data_dir, "LOCK"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise LogError(Status.EXISTS, f"{self._data_dir} is used by another process") from None
        try:
            self._authority_file.load(self.authority)
            report = self._writer.recover(self._durable.on_entry, self._open_plan())
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
        if report_damaged(self.authority, self._segments_dir, report.corrupt_segment_ids):
            # Before the node answers anything: a later restart must not forget it, also if
            # the damaged segment is gone by then.
            self._save_authority()
        self._durable.finish_recovery()
        return self._durable.states(), report

    def _open_plan(self) -> ScanPlan:
        """How a restart reads each segment (see ``segment_index``): the newest index file
        whose checkpoint restores is where the fold of per-log state resumes; a closed segment
        with a good final index file up to there is not read at all; one without is scanned
        for its index only; every byte after the checkpoint is scanned and folded. An index
        file is trusted only while it matches its segment: the size for a closed one, the
        chunk CRCs for the newest (the only one a crash can have torn)."""
        segments_dir = self._segments_dir
        os.makedirs(segments_dir, exist_ok=True)
        names = os.listdir(segments_dir)
        ids = sorted(int(n[: -len(SEGMENT_SUFFIX)]) for n in names
                     if n.endswith(SEGMENT_SUFFIX) and n[: -len(SEGMENT_SUFFIX)].isdigit())
        present = set(ids)
        for name in names:
            stem = name[: -len(INDEX_SUFFIX)]
            if name.endswith(INDEX_SUFFIX + TMP_SUFFIX) or (
                    name.endswith(INDEX_SUFFIX) and stem.isdigit()
                    and int(stem) not in present):
                # An unfinished write, or the index of a segment that reclaim deleted.
                os.unlink(os.path.join(segments_dir, name))
        directories: dict[int, tuple[IndexDirectory, int]] = {}
        for position, segment_id in enumerate(ids):
            loaded = load_directory(segments_dir, segment_id)
            if loaded is None:
                continue
            directory, fd = loaded
            path = os.path.join(segments_dir, segment_name(segment_id))
            newest = position == len(ids) - 1
            try:
                size = os.stat(path).st_size
                usable = directory.covered <= size and (
                    newest or not directory.final or directory.covered == size)
                if usable and (newest or not directory.final):
                    usable = segment_chunk_crcs(path, directory.covered, []) == list(
                        directory.chunk_crcs)
            except OSError:
                usable = False
            if usable:
                directories[segment_id] = (directory, fd)
            else:
                log.warning("index file of segment %d does not match it: scanning it",
                            segment_id)
                os.close(fd)
        point = 0
        for segment_id in reversed(ids):
            found = directories.get(segment_id)
            if found is None or not found[0].state:
                continue
            if self._durable.restore(found[0].state):
                point = segment_id
                break
            log.warning("index file of segment %d: its checkpoint is malformed", segment_id)
        durable = self._durable

        def plan(segment_id: int, newest: bool) -> ScanFrom:
            found = directories.pop(segment_id, None)
            if not point or segment_id > point:
                if found is not None:
                    os.close(found[1])
                return ScanFrom(0)
            sink = durable.on_index_only if segment_id < point else None
            if found is None:
                return ScanFrom(0, sink=sink)
            directory, fd = found
            durable.segment_logs[segment_id] = {LogId(x) for x in directory.logs}
            if directory.final and not newest:
                self._index.add_sealed(SealedSegment(directory, fd))
                self._to_scrub.append((segment_id, directory.covered, directory.chunk_crcs))
                return ScanFrom(None, directory.covered)
            try:
                pieces = read_pieces(fd, directory)
            finally:
                os.close(fd)
            covered = directory.covered
            if pieces is None:
                # Damaged blocks: the covered part is scanned for the index only (its state
                # is in the checkpoint already), the rest folded as usual.
                def split(segment: int, entry: ScannedEntry) -> None:
                    if entry.offset < covered:
                        durable.on_index_only(segment, entry)
                    else:
                        (sink or durable.on_entry)(segment, entry)
                return ScanFrom(0, sink=split)
            for log_id, columns in pieces.items():
                self._index.load_memory(segment_id, LogId(log_id), [
                    Location(segment_id, offset, length, Lsn(first), Lsn(last),
                             Lsn(efirst if efirst != first else 0), time_ms)
                    for first, last, efirst, offset, length, time_ms in zip(
                        *columns.columns(), strict=True)])
            self._index_covered[segment_id] = covered
            if newest:
                self._chunk_crcs[segment_id] = list(directory.chunk_crcs[
                    : covered // CHUNK_BYTES])
            return ScanFrom(covered, sink=sink)

        return plan

    # ---- index files (event loop side) ----

    def _write_index(self, segment_id: int, *, final: bool, with_state: bool = True,
                     closing: bool = False) -> None:
        """Write the index file of an in-memory segment in the index thread: ``final`` once
        the segment is closed (then its in-memory index goes), else a checkpoint of the one
        being written. ``with_state``: the per-log state folded so far is that of the end of
        this segment's covered bytes (not for a segment closed before this process started
        writing: then nothing after it must be folded twice)."""
        if self._closing and not closing:
            return
        if segment_id in self._index_busy:
            if final:
                # A checkpoint of this segment is being written as it closed: the final file
                # follows it (skipping it left the closed segment without one until restart).
                self._index_deferred[segment_id] = (
                    self._index_deferred.get(segment_id, True) and with_state)
            return
        covered = self._segment_bytes.get(segment_id, 0)
        snapshot = self._index.memory_snapshot(segment_id)
        logs = set(self._durable.segment_logs.get(segment_id, ()))
        state = self._durable.snapshot() if with_state else b""
        known = list(self._chunk_crcs.get(segment_id, ()))
        self._index_busy.add(segment_id)
        self._index_covered[segment_id] = covered
        segments_dir = self._segments_dir

        def job() -> tuple[IndexDirectory, int, list[int]]:
            path = os.path.join(segments_dir, segment_name(segment_id))
            crcs = segment_chunk_crcs(path, covered, known)
            directory, fd = write_index(segments_dir, segment_id, covered, final, crcs, logs,
                                        columns_of(snapshot), state)
            return directory, fd, crcs

        assert self._loop is not None
        future = self._loop.run_in_executor(self._index_thread, job)

        def written(done: asyncio.Future[tuple[IndexDirectory, int, list[int]]]) -> None:
            self._index_busy.discard(segment_id)
            self._index_writes.discard(done)
            try:
                finish(done)
            finally:
                deferred = self._index_deferred.pop(segment_id, None)
                # Not if the write that just finished was the final one (its in-memory index
                # is gone: a second final file would be written empty over the good one).
                if (deferred is not None and not self._closing
                        and segment_id in self._index.memory_segment_ids()):
                    self._write_index(segment_id, final=True, with_state=deferred)

        def finish(done: asyncio.Future[tuple[IndexDirectory, int, list[int]]]) -> None:
            if done.cancelled():
                return  # the loop is going away: a restart writes it again
            error = done.exception()
            if error is not None:
                # The in-memory index stays (and serves); a later roll or open tries again.
                log.error("index file of segment %d not written: %s", segment_id, error)
                self._counts["index_write_failures"] += 1
                return
            directory, fd, crcs = done.result()
            self._counts["index_files_written"] += 1
            if final and segment_id in self._segment_bytes and not self._closing:
                self._index.add_sealed(SealedSegment(
                    directory, fd, self._segment_versions.get(segment_id, 0)))
                self._chunk_crcs.pop(segment_id, None)
                self._index_covered.pop(segment_id, None)
            else:
                os.close(fd)
                self._chunk_crcs[segment_id] = crcs[: covered // CHUNK_BYTES]

        future.add_done_callback(written)
        self._index_writes.add(future)  # type: ignore[arg-type]

    def _seal_closed(self, *, with_state: bool = True) -> None:
        """Every in-memory segment but the newest is closed: write its final index file
        (not of one found damaged: a restart must scan it again and find the damage)."""
        for segment_id in self._index.memory_segment_ids():
            if (segment_id < self._newest_segment_id
                    and segment_id not in self._corrupt_segments):
                self._write_index(segment_id, final=True, with_state=with_state)

    def _rescan_into_memory(self, segment_id: int, version: int, size: int) -> bool:
        """Index the segment in memory from a scan of it (blocking, on the loop: only after
        a failure); False if the scan finds damage."""
        try:
            data = self._reader.pread(segment_id, 0, size, version)
        except OSError as error:
            log.error("segment %d unreadable: %s", segment_id, error)
            data = b""
        scan = scan_segment(data)
        logs: set[LogId] = set()
        for scanned in scan.entries:
            entry = scanned.entry
            logs.add(entry.log_id)
            if isinstance(entry, StoreMeta):
                self._index.insert(entry.log_id, Location(
                    segment_id, scanned.offset, scanned.length, entry.first_lsn,
                    entry.last_lsn, Lsn(0), index_time(entry.flags, entry.timestamp_ms),
                    version))
        self._durable.segment_logs[segment_id] = logs | self._durable.segment_logs.get(
            segment_id, set())
        if scan.bad_offset is not None or len(data) != size:
            self._corrupt_segments = self._corrupt_segments | {segment_id}
            self._counts["corrupt_segments"] += 1
            if report_damaged(self.authority, self._segments_dir, frozenset({segment_id})):
                self._save_authority()
            return False
        self._write_index(segment_id, final=True, with_state=False)
        return True

    def _scrub_sync(self, segments: list[tuple[int, int, tuple[int, ...]]]) -> None:
        """Scrub thread: read every segment a restart did not scan and compare it with the
        chunk CRCs of its index file; a mismatch (damage since the index was written) is
        handed to the loop, which scans that segment as a restart used to
        (``_scrub_found``)."""
        loop = self._loop
        assert loop is not None
        for segment_id, covered, crcs in segments:
            path = os.path.join(self._segments_dir, segment_name(segment_id))
            try:
                with open(path, "rb") as file:
                    for number, expected in enumerate(crcs):
                        if self._closing:
                            return
                        chunk = file.read(min(CHUNK_BYTES, covered - number * CHUNK_BYTES))
                        if isal_zlib.crc32(chunk) != expected:
                            loop.call_soon_threadsafe(self._scrub_found, segment_id)
                            break
            except FileNotFoundError:
                continue  # deleted by reclaim meanwhile
            except OSError as error:
                log.error("scrub: segment %d unreadable: %s", segment_id, error)
                loop.call_soon_threadsafe(self._scrub_found, segment_id)

    def _scrub_found(self, segment_id: int) -> None:
        sealed = self._index.sealed(segment_id)
        if sealed is None or sealed.version != 0 or self._closing:
            return  # deleted or compacted since (the copy is checked entry by entry)
        log.error("segment %d does not match its index file: scanning it", segment_id)
        self._index.forget_segment(segment_id)
        self._rescan_into_memory(segment_id, 0, self._segment_bytes.get(segment_id,
                                                                        sealed.covered))

    def scrub_done(self) -> asyncio.Future[None] | None:
        """The background check of the segments a restart did not read (tests wait on it)."""
        return self._scrubbing

    def _rebuild_index(self, segment_id: int) -> None:
        """A block of the segment's index file is damaged: index the segment from a scan of
        it and write the index file again."""
        sealed = self._index.sealed(segment_id)
        if sealed is None:
            return
        log.error("index file of segment %d is damaged: rebuilding it from the segment",
                  segment_id)
        self._counts["index_rebuilds"] += 1
        self._index.forget_segment(segment_id)
        self._rescan_into_memory(segment_id, sealed.version,
                                 self._segment_bytes.get(segment_id, sealed.covered))

    def _append_sync(self, batch: list[_Pending], releases: list[tuple[LogId, Lsn]],
                     fsync: bool) -> tuple[AppendResult, list[int], int]:
        """The result, the length of every entry written (the batch's, then the release
        pointers') and how long it took (ns). Runs in the writer thread, or inline on the loop
        while the thread is idle."""
        started_ns = time.perf_counter_ns()
        result, lengths = self._append_entries(batch, releases, fsync)
        return result, lengths, time.perf_counter_ns() - started_ns

    def _append_entries(self, batch: list[_Pending], releases: list[tuple[LogId, Lsn]],
                        fsync: bool) -> tuple[AppendResult, list[int]]:
        chunks: list[bytes | memoryview] = []
        lengths: list[int] = []
        for pending in batch:
            source = pending.chunk_source
            if type(source) is Store:
                # The received bytes go out as they came: a header, then the STORE's fields.
                header, body = store_entry_parts(source)
                chunks += (header, body)
                lengths.append(len(header) + len(body))
            else:
                chunk = _encode(source)
                chunks.append(chunk)
                lengths.append(len(chunk))
        for log_id, lsn in releases:
            chunk = encode_release(log_id, lsn)
            chunks.append(chunk)
            lengths.append(len(chunk))
        if fsync and failpoints.armed(_FAILPOINT_BEFORE_FSYNC):
            # Fault-injection runs only: split the write from its fsync so that the process
            # can die between them (with SIGKILL the written bytes stay in the page cache).
            result = self._writer.append(chunks, fsync=False)
            if result.status is Status.OK:
                failpoints.hit(_FAILPOINT_BEFORE_FSYNC)
                try:
                    synced = self._writer.sync()
                except OSError:
                    # Like a failed fsync inside append(): the store can no longer be trusted.
                    result = AppendResult(Status.DISABLED, result.segment_id, result.offset,
                                          result.fsyncs_count, True)
                    return result, lengths
                result = AppendResult(Status.OK, result.segment_id, result.offset,
                                      result.fsyncs_count + synced, False)
            return result, lengths
        return self._writer.append(chunks, fsync=fsync), lengths

    def _sync_sync(self, fsync: bool) -> int:
        if not fsync:
            self._writer.check_disk(force=False)
            return 0
        return self._writer.sync()

    def _close_sync(self) -> None:
        try:
            self._writer.close()
        finally:
            self._reader.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1


def _directory_of(sealed: SealedSegment) -> IndexDirectory:
    return IndexDirectory(sealed.segment_id, sealed.covered, True, (), sealed.logs,
                          sealed.runs, b"", 0)


def _write_compacted_index(segments_dir: str, compacted: Compacted, pieces: dict[int, Any],
                           trims: dict[int, int]) -> tuple[IndexDirectory, int]:
    """The index file of a compacted segment: the pieces of the entries it copied, at their
    new offsets."""
    runs: dict[int, Columns] = {}
    logs: set[int] = set()
    moves = compacted.moves
    for log_id, columns in pieces.items():
        trim = trims.get(log_id, 0)
        kept = Columns()
        for first, last, efirst, offset, length, time_ms in zip(*columns.columns(),
                                                                strict=True):
            if last > trim and offset in moves:
                kept.append(first, last, efirst, moves[offset], length, time_ms)
        if len(kept):
            runs[log_id] = kept
            logs.add(log_id)
    path = os.path.join(segments_dir, segment_name(compacted.segment_id))
    crcs = segment_chunk_crcs(path, compacted.new_bytes, [])
    return write_index(segments_dir, compacted.segment_id, compacted.new_bytes, True, crcs,
                       logs, runs, b"")


def _encode(source: ChunkSource) -> bytes:
    if isinstance(source, Store):
        return encode_store(source)
    if isinstance(source, SealEntry):
        return encode_seal(source.log_id, source.epoch, source.sealed_by)
    if isinstance(source, TrimEntry):
        return encode_trim(source.log_id, source.trim_lsn)
    return encode_checkpoint(source)
