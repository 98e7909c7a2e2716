"""Blocking file I/O on the segment files: recovery scan, appends with fsync, rolling, preads.

``SegmentWriter`` is used by one thread at a time, so it needs no locks: the record store's
single writer thread, or the event loop for an inline commit while that thread has nothing to
do (the record store tracks the jobs it handed the thread). ``SegmentReader`` is used from
the read threads (and by reclaim) and keeps read-only descriptors per segment file version
behind a lock. Only small inline commits (``SegmentWriter.append``) run on the event loop.

Layout: ``<segments_dir>/000000001.seg``, ``000000002.seg``, ...; only the newest segment is
ever written to. Reclaim (``segment_reclaim``) deletes older segments and replaces others by
compacted copies under the same name (written as ``*.seg.compact`` first).

Preallocation (unless ``fsync`` is ``never``): appending to a file and fsyncing it changes its
size and allocates blocks, so every commit waits for a journal commit as well as its data.
PostgreSQL (``wal_init_zero``) and RocksDB (recycled logs) avoid that by writing into space
that was zero-filled and fsynced beforehand: then an ``fdatasync`` only writes the data. So
the writer keeps up to ``preallocate_bytes`` of zero-filled, fsynced space ahead of its write
position in the current segment, extended by a preparer thread (``seqlog-prealloc``) well
before it runs out, and the preparer also zero-fills the next segment ahead of the roll
(``spare.prealloc``, renamed into place at the roll). A commit that lies inside the zeroed
space is made durable with ``fdatasync``; any other keeps ``fsync``. ``fallocate`` alone would
not do: its unwritten extents need a journal commit at their first write. The scan treats the
zero tail as the clean end of the data (``segment_format``); every size the record store
accounts is the data length, never the file size. The cost is disk traffic: every segment
byte is written twice (zeros, then data), far from the disk's bandwidth at the commit rates
where the saved journal commit matters. The preparer writes and fsyncs through its own
descriptor, so a writeback error it meets is still reported to the writer's own fsync.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from shared.config import FsyncMode
from shared.durable_files import fsync_dir as fsync_dir
from shared.status import Status
from storage_node.segment_format import ScannedEntry, scan_segment

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
COMPACT_SUFFIX = ".compact"
"""A compacted copy being written; a crash can leave one behind, removed at the next open."""
DISK_CHECK_INTERVAL_MS = 100
"""statvfs is asked at most this often; ENOSPC from a write is noticed at once anyway."""
SPARE_NAME = "spare.prealloc"
"""The next segment, zero-filled ahead of the roll (removed at open: it holds no data)."""
PREALLOCATE_BYTES = 4 * 1024 * 1024
"""Zero-filled space kept ahead of the write position (see the module docstring); extended
by this much whenever less than half of it is left."""
_ZERO_WRITE_BYTES = 1024 * 1024
_ZEROS = bytes(_ZERO_WRITE_BYTES)

EntrySink = Callable[[int, ScannedEntry], None]


def segment_name(segment_id: int) -> str:
    return f"{segment_id:09d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class ScanFrom:
    """What a restart does with one segment: scan it from ``offset`` (an entry boundary)
    into ``sink`` (None: the default one), or (``offset`` None) not at all, its data bytes
    being ``data_bytes``."""

    offset: int | None
    data_bytes: int = 0
    sink: EntrySink | None = None


ScanPlan = Callable[[int, bool], ScanFrom]


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    segments_count: int
    torn_tail_bytes: int
    """Bytes cut off the end of the newest segment (a write torn by a crash)."""
    corrupt_segments_count: int
    """Segments with a bad entry in the middle; their entries after it are not indexed."""
    segment_bytes: dict[int, int] = field(default_factory=dict)
    """Data bytes of every segment after recovery (the one new entries go to included): up to
    a zero tail, never the file size."""
    corrupt_segment_ids: frozenset[int] = frozenset()
    """Never deleted or compacted: bytes past their bad entry may be acknowledged records."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    status: Status
    segment_id: int
    offset: int
    """Where the first byte of the appended chunks landed."""
    fsyncs_count: int
    broken: bool
    """The store can no longer be trusted to write (an fsync or truncate failed)."""


class SegmentWriter:
    """Appends to the newest segment; one thread at a time (see the module docstring)."""

    def __init__(self, segments_dir: str, *, segment_bytes_max: int, fsync: FsyncMode,
                 disk_free_bytes_min: int,
                 preallocate_bytes: int | None = None) -> None:
        self._dir = segments_dir
        self._segment_bytes_max = segment_bytes_max
        self._fsync = fsync
        self._disk_free_bytes_min = disk_free_bytes_min
        self._segment_id = 0
        self._fd = -1
        self._segment_bytes = 0
        """Data bytes in the current segment: where the next entry goes."""
        self._disk_checked_ms = -DISK_CHECK_INTERVAL_MS
        self.roll_requested = False
        """Set (by the record store, from any thread: a plain flag) to close the current
        segment before the next append, whatever its size."""
        self.disk_low = False
        self.dirty_since_ms: int | None = None
        """Monotonic ms of the first write not yet fsynced; None when everything is synced."""
        self._meta_dirty = False
        """A write since the last sync went past the zeroed space: the sync must be a full
        fsync."""
        self.write_calls_count = 0
        self.fdatasyncs_count = 0
        self.zero_fill_bytes = 0
        """Zero bytes the preparer wrote (the extra disk traffic of preallocation)."""
        if preallocate_bytes is None:
            preallocate_bytes = PREALLOCATE_BYTES  # looked up now: benchmarks set it to 0
        self._preallocate_bytes = preallocate_bytes if fsync != "never" else 0
        self._lock = threading.Lock()
        """Held by the preparer while it writes past ``_zeroed_end``, and by the writer when it
        writes past it, truncates, rolls or closes (writes inside the zeroed space need it
        not: the preparer never writes below ``_zeroed_end``)."""
        self._zeroed_end = 0
        """The current segment's bytes from ``_segment_bytes`` up to here are zero and fsynced
        (never below ``_segment_bytes``)."""
        self._spare_bytes = 0
        """Zeroed bytes of a complete ``SPARE_NAME`` file; 0 when there is none."""
        self._preparing = False
        self._prepare_failed_segment = -1
        """A preparation of this segment failed: none is tried again before the next."""
        self._closed = False
        self._preparer = (ThreadPoolExecutor(1, thread_name_prefix="seqlog-prealloc")
                          if self._preallocate_bytes else None)

    def recover(self, sink: EntrySink, plan: ScanPlan | None = None) -> RecoveryReport:
        """Scan every segment in order, feeding good entries to ``sink``; cut a torn tail off
        the newest segment; open the segment that new entries go to. ``plan(segment_id,
        newest)`` may say where to start in a segment, or that it needs no scan at all (its
        index file holds it: see ``record_store``), and which sink its entries go to."""
        os.makedirs(self._dir, exist_ok=True)
        names = os.listdir(self._dir)
        for name in names:
            if name.endswith(SEGMENT_SUFFIX + COMPACT_SUFFIX):
                # A compaction that crashed before its rename: the segment itself is intact.
                log.warning("removing the unfinished compaction %s", name)
                os.unlink(os.path.join(self._dir, name))
            elif name == SPARE_NAME:
                # Zeros only, and maybe not all of them synced: made again when needed.
                os.unlink(os.path.join(self._dir, name))
        ids = sorted(int(n[: -len(SEGMENT_SUFFIX)]) for n in names
                     if n.endswith(SEGMENT_SUFFIX) and n[: -len(SEGMENT_SUFFIX)].isdigit())
        torn_bytes = 0
        corrupt_ids: set[int] = set()
        sizes: dict[int, int] = {}
        roll = False
        for position, segment_id in enumerate(ids):
            path = os.path.join(self._dir, segment_name(segment_id))
            newest = position == len(ids) - 1
            step = plan(segment_id, newest) if plan is not None else ScanFrom(0)
            if step.offset is None:
                sizes[segment_id] = step.data_bytes
                continue
            with open(path, "rb") as file:
                data = file.read()
            scan = scan_segment(data, step.offset)
            segment_sink = step.sink or sink
            for entry in scan.entries:
                segment_sink(segment_id, entry)
            sizes[segment_id] = scan.valid_bytes if scan.bad_offset is None else len(data)
            if scan.bad_offset is None:
                if scan.zero_tail_bytes and not newest:
                    # A roll cuts the zero tail off the segment it closes; a crash can keep it.
                    _truncate(path, scan.valid_bytes)
                continue
            if newest and not scan.good_after_bad:
                # Zeros after a torn entry are the zero-filled space it was written into.
                torn_bytes = len(data.rstrip(b"\0")) - scan.bad_offset
                log.warning("segment %s: cutting a torn tail of %d bytes at offset %d",
                            path, torn_bytes, scan.bad_offset)
                _truncate(path, scan.bad_offset)
                sizes[segment_id] = scan.bad_offset
            else:
                # Entry boundaries after a bad entry cannot be trusted; keep the bytes (never
                # destroy what may be acknowledged data) but index nothing past it.
                corrupt_ids.add(segment_id)
                roll = roll or newest
                log.error("segment %s: bad entry at offset %d; skipping the rest of the segment",
                          path, scan.bad_offset)
        if ids and not roll:
            self._segment_id = ids[-1]
            path = os.path.join(self._dir, segment_name(self._segment_id))
            self._fd = os.open(path, os.O_WRONLY)
            self._segment_bytes = sizes[self._segment_id]
            self._zeroed_end = os.fstat(self._fd).st_size
            if self._zeroed_end > self._segment_bytes:
                # The zero tail becomes the zeroed space (synced once: the process that
                # wrote it may have died before its preparer's fsync).
                os.fsync(self._fd)
            os.lseek(self._fd, self._segment_bytes, os.SEEK_SET)
        else:
            self._segment_id = (ids[-1] if ids else 0) + 1
            self._fd = self._open_segment(self._segment_id)
            self._segment_bytes = self._zeroed_end = 0
        sizes[self._segment_id] = self._segment_bytes
        self.check_disk(force=True)
        if (self._preallocate_bytes and not self.disk_low
                and self.zeroed_ahead_bytes < self._preallocate_bytes // 2):
            # Before serving, not behind the first commits (an inline one would wait on the
            # event loop for the preparer's lock).
            try:
                self._extend(self._segment_id)
            except OSError as error:
                self._prepare_failed_segment = self._segment_id
                log.warning("segment %d: zero-filling ahead failed: %s", self._segment_id, error)
        self._maybe_prepare()
        return RecoveryReport(len(ids) + (1 if roll or not ids else 0), torn_bytes,
                              len(corrupt_ids), sizes, frozenset(corrupt_ids))

    @property
    def segment_id(self) -> int:
        return self._segment_id

    @property
    def zeroed_ahead_bytes(self) -> int:
        """Zero-filled, synced bytes ahead of the write position in the current segment."""
        return self._zeroed_end - self._segment_bytes

    @property
    def preparing(self) -> bool:
        """The preparer is zero-filling (the current segment or the spare)."""
        return self._preparing

    @property
    def spare_bytes(self) -> int:
        """Zeroed bytes of the spare waiting to become the next segment (0: none yet)."""
        return self._spare_bytes

    def append(self, chunks: Sequence[bytes | memoryview], *, fsync: bool) -> AppendResult:
        """Write ``chunks`` contiguously with one vectored write (rolling first if they do not
        fit the current segment), then fsync once if asked. On failure nothing of the batch stays
        in the file."""
        self.check_disk(force=False)
        size = sum(map(len, chunks))
        fsyncs = 0
        start = self._segment_bytes
        end = start + size
        inside = False
        try:
            if start > 0 and (start + size > self._segment_bytes_max or self.roll_requested):
                fsyncs += self._roll()
                start = 0
            end = start + size
            inside = end <= self._zeroed_end
            if inside:
                _writev_all(self._fd, chunks)
            else:
                with self._lock:  # the preparer may be zero-filling right there
                    # Once it is done, the batch may fit in what it zero-filled after all.
                    inside = end <= self._zeroed_end
                    _writev_all(self._fd, chunks)
                    self._zeroed_end = max(self._zeroed_end, end)
                self._meta_dirty = self._meta_dirty or not inside
            self.write_calls_count += 1
            self._segment_bytes = end
            if self.dirty_since_ms is None:
                self.dirty_since_ms = _now_ms()
            if fsync:
                self._sync_now()
                fsyncs += 1
        except OSError as error:
            return self._append_failed(error, start, fsyncs, end if inside else None)
        self._maybe_prepare()
        return AppendResult(Status.OK, self._segment_id, start, fsyncs, False)

    def sync(self) -> int:
        """fsync the current segment if it has unsynced writes; returns fsyncs done."""
        self.check_disk(force=False)
        if self.dirty_since_ms is None:
            return 0
        self._sync_now()
        return 1

    def _sync_now(self) -> None:
        if self._meta_dirty:
            os.fsync(self._fd)
            self._meta_dirty = False
        else:
            # Every write since the last sync went into zeroed, synced space: no size change,
            # no block allocation, nothing for the journal.
            os.fdatasync(self._fd)
            self.fdatasyncs_count += 1
        self.dirty_since_ms = None

    def check_disk(self, *, force: bool) -> bool:
        now_ms = _now_ms()
        if force or now_ms - self._disk_checked_ms >= DISK_CHECK_INTERVAL_MS:
            self._disk_checked_ms = now_ms
            stats = os.statvfs(self._dir)
            self.disk_low = stats.f_bavail * stats.f_frsize < self._disk_free_bytes_min
        return self.disk_low

    def close(self) -> None:
        self._closed = True
        if self._preparer is not None:
            self._preparer.shutdown(wait=True)
        with self._lock:
            if self._spare_bytes:
                self._spare_bytes = 0
                _unlink_quietly(os.path.join(self._dir, SPARE_NAME))
        if self._fd < 0:
            return
        try:
            if self._zeroed_end > self._segment_bytes:
                # A closed store leaves files that hold data only.
                os.ftruncate(self._fd, self._segment_bytes)
                self._zeroed_end = self._segment_bytes
                self._meta_dirty = True
                if self.dirty_since_ms is None:
                    self.dirty_since_ms = _now_ms()
            if self.dirty_since_ms is not None:
                os.fsync(self._fd)
                self.dirty_since_ms = None
        finally:
            os.close(self._fd)
            self._fd = -1

    def roll(self) -> tuple[int, int]:
        """Close the current segment and start the next one (reclaim asks for it when the
        current one is mostly trimmed). Returns (new segment id, fsyncs done)."""
        fsyncs = self._roll()
        return self._segment_id, fsyncs

    def _roll(self) -> int:
        """Switch to a fresh segment. The current one is synced first, so that a next
        segment on disk means this one is durable (unless ``fsync`` is ``never``): a torn tail
        can only be in the newest segment. A failure leaves the current segment in place."""
        next_id = self._segment_id + 1
        fsyncs = 0
        with self._lock:
            if self._zeroed_end > self._segment_bytes:
                # What is left of the zeroed space: a closed segment holds data only. Not
                # synced for itself: a zero tail is a clean end for the scan as well.
                os.ftruncate(self._fd, self._segment_bytes)
                self._zeroed_end = self._segment_bytes
            if self._fsync != "never" and self.dirty_since_ms is not None:
                self._sync_now()
                fsyncs += 1
            spare_bytes, self._spare_bytes = self._spare_bytes, 0
            new_fd = (self._open_spare(next_id) if spare_bytes
                      else self._open_segment(next_id))
            os.close(self._fd)
            self._fd, self._segment_id, self._segment_bytes = new_fd, next_id, 0
            self._zeroed_end = spare_bytes
            self.dirty_since_ms = None
            self._meta_dirty = False
            self.roll_requested = False
        self._maybe_prepare()
        return fsyncs

    def _open_spare(self, segment_id: int) -> int:
        """Rename the zero-filled spare into place as ``segment_id``; its directory entry is
        made durable as a new segment's is."""
        path = os.path.join(self._dir, segment_name(segment_id))
        os.rename(os.path.join(self._dir, SPARE_NAME), path)
        fd = os.open(path, os.O_WRONLY)
        try:
            fsync_dir(self._dir)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _maybe_prepare(self) -> None:
        """Hand the preparer its next job when one is due: more zeroed space in the current
        segment when less than half of ``preallocate_bytes`` is left, else the spare for the
        next segment once this one is half full. Cheap when nothing is due (every append)."""
        if (self._preparer is None or self._preparing or self.disk_low or self._closed
                or self._prepare_failed_segment == self._segment_id):
            return
        cap = self._segment_bytes_max
        zeroed_end = self._zeroed_end
        if not ((zeroed_end < cap
                 and zeroed_end - self._segment_bytes < self._preallocate_bytes // 2)
                or (not self._spare_bytes and self._segment_bytes >= cap // 2)):
            return
        self._preparing = True
        try:
            self._preparer.submit(self._prepare, self._segment_id)
        except RuntimeError:  # shut down by close()
            self._preparing = False

    def _prepare(self, segment_id: int) -> None:
        """Preparer thread: one job (see ``_maybe_prepare``)."""
        try:
            if not self._extend(segment_id):
                self._make_spare()
        except OSError as error:
            # The commits go on without preallocation (full fsyncs) until the next segment.
            self._prepare_failed_segment = segment_id
            log.warning("segment %d: zero-filling ahead failed: %s", segment_id, error)
        finally:
            self._preparing = False

    def _extend(self, segment_id: int) -> bool:
        """Zero-fill and fsync the next ``preallocate_bytes`` of the current segment; False
        when it is zeroed up to ``segment_bytes_max`` already."""
        with self._lock:
            if segment_id != self._segment_id or self._closed:
                return True
            start = self._zeroed_end
            end = min(start + self._preallocate_bytes, self._segment_bytes_max)
            if end <= start:
                return False
            # Its own descriptor: an error of this fsync is reported to the writer's too.
            _zero_fill(os.path.join(self._dir, segment_name(segment_id)), start, end,
                       create=False)
            self._zeroed_end = end
            self.zero_fill_bytes += end - start
        return True

    def _make_spare(self) -> None:
        if self._spare_bytes or self._segment_bytes < self._segment_bytes_max // 2:
            return
        size = min(self._preallocate_bytes, self._segment_bytes_max)
        path = os.path.join(self._dir, SPARE_NAME)
        # No lock while writing: nothing else touches the file until it is complete.
        _zero_fill(path, 0, size, create=True)
        with self._lock:
            if self._closed:
                _unlink_quietly(path)
                return
            self._spare_bytes = size
            self.zero_fill_bytes += size

    def _open_segment(self, segment_id: int) -> int:
        # Only this writer creates segments above the newest one found at recovery, so an
        # existing file with this id can only be the empty leftover of a failed roll.
        path = os.path.join(self._dir, segment_name(segment_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if self._fsync != "never":
            try:
                # The new file's directory entry must be durable too, or a crash could lose
                # the whole segment even though its contents were fsynced.
                fsync_dir(self._dir)
            except OSError:
                os.close(fd)
                raise
        return fd

    def _append_failed(self, error: OSError, start: int, fsyncs: int,
                       zeroed_until: int | None) -> AppendResult:
        """Undo the batch written at ``start``: zeros over it up to ``zeroed_until`` when it was
        written into the zeroed space, else cut the file at ``start``."""
        status = Status.NOSPC if error.errno in (errno.ENOSPC, errno.EDQUOT) else Status.DISABLED
        if status == Status.NOSPC:
            self.disk_low = True
        # After any other failure (EIO from fsync above all) the file's state is unknown and
        # retrying would risk acknowledging data the kernel already dropped.
        broken = status == Status.DISABLED
        log.error("segment %d: append failed: %s", self._segment_id, error)
        try:
            if self._fd >= 0:
                with self._lock:
                    if zeroed_until is not None:
                        # Zeros over whatever part of the batch was written: the zeroed space
                        # stays as it was.
                        _write_zeros(self._fd, start, zeroed_until)
                    else:
                        os.ftruncate(self._fd, start)
                        self._zeroed_end = start
                self._segment_bytes = start
                os.lseek(self._fd, start, os.SEEK_SET)
        except OSError as truncate_error:
            log.error("segment %d: cannot cut a failed append: %s", self._segment_id,
                      truncate_error)
            broken = True
        return AppendResult(status, self._segment_id, start, fsyncs, broken)


class SegmentReader:
    """Positional reads of entries; safe to use from several threads.

    Descriptors are keyed by ``(segment_id, version)``: compaction renames a new file over a
    segment, and a read that located its entries before the swap must still find them at
    their old offsets in the old file. So reclaim ``pin``s the old file open before it is
    renamed over or unlinked, and the record store ``release``s descriptors only once every
    read that could use them has ended. Only a segment's current version is ever opened by
    name."""

    def __init__(self, segments_dir: str) -> None:
        self._dir = segments_dir
        self._fds: dict[tuple[int, int], int] = {}
        self._versions: dict[int, int] = {}
        """Current file version per segment (absent: 0); -1 once the segment is deleted."""
        self._lock = threading.Lock()

    def pread(self, segment_id: int, offset: int, length: int, version: int = 0) -> bytes:
        fd = self._fd(segment_id, version)
        return os.pread(fd, length, offset)

    def pin(self, segment_id: int) -> int:
        """Open the current file of ``segment_id`` if it is not yet; returns its version."""
        with self._lock:
            version = self._versions.get(segment_id, 0)
        self._fd(segment_id, version)
        return version

    def replaced(self, segment_id: int, fd: int) -> int:
        """``fd`` (read-only) is the segment's new file, already renamed into place; returns
        its version. The old version's descriptor stays until ``release``d."""
        with self._lock:
            version = self._versions.get(segment_id, 0) + 1
            self._versions[segment_id] = version
            self._fds[(segment_id, version)] = fd
        return version

    def deleted(self, segment_id: int) -> None:
        with self._lock:
            self._versions[segment_id] = -1

    def release(self, keys: list[tuple[int, int]]) -> None:
        """Close the descriptors of old file versions that no read can use any more."""
        with self._lock:
            fds = [self._fds.pop(key) for key in keys if key in self._fds]
            for segment_id, _version in keys:
                if self._versions.get(segment_id) == -1 and not any(
                        k[0] == segment_id for k in self._fds):
                    del self._versions[segment_id]
        for fd in fds:
            os.close(fd)

    def open_count(self) -> int:
        with self._lock:
            return len(self._fds)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def _fd(self, segment_id: int, version: int) -> int:
        with self._lock:
            fd = self._fds.get((segment_id, version))
            if fd is None:
                if version != self._versions.get(segment_id, 0):
                    raise OSError(errno.ENOENT, f"segment {segment_id} version {version} is "
                                  "gone")
                fd = os.open(os.path.join(self._dir, segment_name(segment_id)), os.O_RDONLY)
                self._fds[(segment_id, version)] = fd
        return fd


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _writev_all(fd: int, chunks: Sequence[bytes | memoryview]) -> None:
    """Write ``chunks`` in order with vectored writes: no joined copy of a batch (1 MiB of
    received STOREs is one memcpy less per commit), at most ``_IOV_MAX`` buffers a call."""
    pending = [memoryview(chunk) for chunk in chunks if len(chunk)]
    index = 0
    while index < len(pending):
        written = os.writev(fd, pending[index:index + _IOV_MAX])
        while written:
            head = pending[index]
            if written < len(head):
                pending[index] = head[written:]
                break
            written -= len(head)
            index += 1


def _write_zeros(fd: int, start: int, end: int) -> None:
    """pwrite zeros over ``[start, end)`` (the descriptor's offset is left alone)."""
    position = start
    while position < end:
        piece = min(end - position, _ZERO_WRITE_BYTES)
        position += os.pwrite(fd, memoryview(_ZEROS)[:piece], position)


def _zero_fill(path: str, start: int, end: int, *, create: bool) -> None:
    """Write zeros over ``[start, end)`` of ``path`` and fsync it, through a descriptor of its
    own."""
    flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        _write_zeros(fd, start, end)
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _truncate(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
