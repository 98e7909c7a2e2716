"""Blocking file I/O on the segment files: recovery scan, appends with fsync, rolling, preads.

``SegmentWriter`` is used by one thread at a time, so it needs no locks: the record store's
single writer thread, or the event loop for an inline commit while that thread has nothing to
do (the record store tracks the jobs it handed the thread). ``SegmentReader`` is used from
the read threads (and by reclaim) and keeps read-only descriptors per segment file version
behind a lock. Only small inline commits (``SegmentWriter.append``) run on the event loop.

Layout: ``<segments_dir>/000000001.seg``, ``000000002.seg``, ...; only the newest segment is
ever written to. Reclaim (``segment_reclaim``) deletes older segments and replaces others by
compacted copies under the same name (written as ``*.seg.compact`` first).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared.config import FsyncMode
from shared.status import Status
from storage_node.segment_format import ScannedEntry, scan_segment

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
COMPACT_SUFFIX = ".compact"
"""A compacted copy being written; a crash can leave one behind, removed at the next open."""
DISK_CHECK_INTERVAL_MS = 100
"""statvfs is asked at most this often; ENOSPC from a write is noticed at once anyway."""

EntrySink = Callable[[int, ScannedEntry], None]


def segment_name(segment_id: int) -> str:
    return f"{segment_id:09d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    segments_count: int
    torn_tail_bytes: int
    """Bytes cut off the end of the newest segment (a write torn by a crash)."""
    corrupt_segments_count: int
    """Segments with a bad entry in the middle; their entries after it are not indexed."""
    segment_bytes: dict[int, int] = field(default_factory=dict)
    """Size of every segment file after recovery (the one new entries go to included)."""
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
                 disk_free_bytes_min: int) -> None:
        self._dir = segments_dir
        self._segment_bytes_max = segment_bytes_max
        self._fsync = fsync
        self._disk_free_bytes_min = disk_free_bytes_min
        self._segment_id = 0
        self._fd = -1
        self._segment_bytes = 0
        self._disk_checked_ms = -DISK_CHECK_INTERVAL_MS
        self.disk_low = False
        self.dirty_since_ms: int | None = None
        """Monotonic ms of the first write not yet fsynced; None when everything is synced."""
        self.write_calls_count = 0

    def recover(self, sink: EntrySink) -> RecoveryReport:
        """Scan every segment in order, feeding good entries to ``sink``; cut a torn tail off
        the newest segment; open the segment that new entries go to."""
        os.makedirs(self._dir, exist_ok=True)
        names = os.listdir(self._dir)
        for name in names:
            if name.endswith(SEGMENT_SUFFIX + COMPACT_SUFFIX):
                # A compaction that crashed before its rename: the segment itself is intact.
                log.warning("removing the unfinished compaction %s", name)
                os.unlink(os.path.join(self._dir, name))
        ids = sorted(int(n[: -len(SEGMENT_SUFFIX)]) for n in names
                     if n.endswith(SEGMENT_SUFFIX) and n[: -len(SEGMENT_SUFFIX)].isdigit())
        torn_bytes = 0
        corrupt_ids: set[int] = set()
        sizes: dict[int, int] = {}
        roll = False
        for position, segment_id in enumerate(ids):
            path = os.path.join(self._dir, segment_name(segment_id))
            with open(path, "rb") as file:
                data = file.read()
            scan = scan_segment(data)
            for entry in scan.entries:
                sink(segment_id, entry)
            newest = position == len(ids) - 1
            sizes[segment_id] = len(data)
            if scan.bad_offset is None:
                continue
            if newest and not scan.good_after_bad:
                torn_bytes = len(data) - scan.bad_offset
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
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._segment_bytes = os.fstat(self._fd).st_size
        else:
            self._segment_id = (ids[-1] if ids else 0) + 1
            self._fd = self._open_segment(self._segment_id)
            self._segment_bytes = 0
        sizes[self._segment_id] = self._segment_bytes
        self.check_disk(force=True)
        return RecoveryReport(len(ids) + (1 if roll or not ids else 0), torn_bytes,
                              len(corrupt_ids), sizes, frozenset(corrupt_ids))

    @property
    def segment_id(self) -> int:
        return self._segment_id

    def append(self, chunks: Sequence[bytes | memoryview], *, fsync: bool) -> AppendResult:
        """Write ``chunks`` contiguously with one vectored write (rolling first if they do not
        fit the current segment), then fsync once if asked. On failure nothing of the batch stays
        in the file."""
        self.check_disk(force=False)
        size = sum(map(len, chunks))
        fsyncs = 0
        start = self._segment_bytes
        try:
            if start > 0 and start + size > self._segment_bytes_max:
                fsyncs += self._roll()
                start = 0
            _writev_all(self._fd, chunks)
            self.write_calls_count += 1
            self._segment_bytes += size
            if self.dirty_since_ms is None:
                self.dirty_since_ms = _now_ms()
            if fsync:
                os.fsync(self._fd)
                fsyncs += 1
                self.dirty_since_ms = None
        except OSError as error:
            return self._append_failed(error, start, fsyncs)
        return AppendResult(Status.OK, self._segment_id, start, fsyncs, False)

    def sync(self) -> int:
        """fsync the current segment if it has unsynced writes; returns fsyncs done."""
        self.check_disk(force=False)
        if self.dirty_since_ms is None:
            return 0
        os.fsync(self._fd)
        self.dirty_since_ms = None
        return 1

    def check_disk(self, *, force: bool) -> bool:
        now_ms = _now_ms()
        if force or now_ms - self._disk_checked_ms >= DISK_CHECK_INTERVAL_MS:
            self._disk_checked_ms = now_ms
            stats = os.statvfs(self._dir)
            self.disk_low = stats.f_bavail * stats.f_frsize < self._disk_free_bytes_min
        return self.disk_low

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
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
        """Switch to a fresh segment. The new file is opened first so that a failure leaves
        the current segment in place and nothing changed."""
        next_id = self._segment_id + 1
        new_fd = self._open_segment(next_id)
        fsyncs = 0
        try:
            if self._fsync != "never" and self.dirty_since_ms is not None:
                os.fsync(self._fd)
                fsyncs += 1
        except OSError:
            os.close(new_fd)
            raise
        os.close(self._fd)
        self._fd, self._segment_id, self._segment_bytes = new_fd, next_id, 0
        self.dirty_since_ms = None
        return fsyncs

    def _open_segment(self, segment_id: int) -> int:
        # Only this writer creates segments above the newest one found at recovery, so an
        # existing file with this id can only be the empty leftover of a failed roll.
        path = os.path.join(self._dir, segment_name(segment_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        if self._fsync != "never":
            try:
                # The new file's directory entry must be durable too, or a crash could lose
                # the whole segment even though its contents were fsynced.
                fsync_dir(self._dir)
            except OSError:
                os.close(fd)
                raise
        return fd

    def _append_failed(self, error: OSError, start: int, fsyncs: int) -> AppendResult:
        status = Status.NOSPC if error.errno in (errno.ENOSPC, errno.EDQUOT) else Status.DISABLED
        if status == Status.NOSPC:
            self.disk_low = True
        # After any other failure (EIO from fsync above all) the file's state is unknown and
        # retrying would risk acknowledging data the kernel already dropped.
        broken = status == Status.DISABLED
        log.error("segment %d: append failed: %s", self._segment_id, error)
        try:
            if self._fd >= 0:
                os.ftruncate(self._fd, start)
                self._segment_bytes = start
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


def _truncate(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
