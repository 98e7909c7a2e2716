"""The file epoch store's journal on disk: blocking, run on the store's worker thread only.

Files under the store's root directory::

    epochs.journal   the journal (``epoch_store.core.journal``): header, then one CRC-framed
                     frame per group commit, each holding the new values it wrote
    epochs.lock      flock'ed: shared to read the journal, exclusive to append to it

Every process on the machine that uses the store keeps the state of every log in memory and
catches up on the journal's new frames (appended by itself or by others) under the lock before
it answers. A commit takes the exclusive lock, catches up, checks every write's expected version
against the now current state (the compare-and-swap), appends one frame with the accepted values,
fsyncs, and only then applies them and answers: one write and one fsync for the whole batch.
``flock`` locks belong to an open file description, so two handles in one process exclude each
other like two processes do.

Crashes: a writer killed mid-write leaves a torn last frame; readers ignore it (its CRC fails or
it is cut short) and the next writer truncates it before appending. Nobody was told that a torn
commit succeeded: answers go out only after fsync.

Compaction: once the journal is ``compact_ratio`` times the size its live values need (and at
least ``compact_bytes_min``), a commit rewrites it as one record per object into a new file and
renames that over the journal. Other processes notice the new inode under the lock and reload.

Older versions kept a directory per log (``logs/<id>/sequencer.json``, ``lce.json``, ``lock``).
The first writer of a store without a journal imports those objects (versions included); stop
every node of the machine before upgrading, since an old process would keep using the old files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from epoch_store.backends import file_io
from epoch_store.core import journal, records
from shared.durable_files import fsync_dir
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import LogId

logger = logging.getLogger(__name__)

JOURNAL_FILE = "epochs.journal"
LOCK_FILE = "epochs.lock"
COMPACT_SUFFIX = ".compact"
LEGACY_LOGS_DIR = "logs"
_LEGACY_SEQUENCER, _LEGACY_LCE = "sequencer.json", "lce.json"
RECORD_BYTES_ESTIMATE = 40
READ_CHUNK_BYTES = 4 * journal.COMMIT_BYTES_MAX
"""Largest read while catching up; more than one frame, so every chunk makes progress."""
"""Rough bytes of one record, to estimate the size of a compacted journal."""

Write = tuple[journal.Record, int]
"""A value to store and the version the stored one must have (0: it must not exist)."""


@dataclass(slots=True)
class Tables:
    """The current record of every object, replaced as a whole on reload so that a reader on
    another thread never sees a half-built state. Records are decoded when read."""

    objects: journal.Objects = field(default_factory=dict)
    interned: journal.Interned = field(default_factory=journal.Interned)

    def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        current = self.objects.get(log_id)
        raw = None if current is None else journal.split_log(current)[0]
        if raw is None:
            return Status.OK, None
        value = journal.decode_metadata(raw, log_id, self.interned)
        return (Status.OK, value) if not isinstance(value, str) else _bad_record(log_id, value)

    def get_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        current = self.objects.get(log_id)
        raw = None if current is None else journal.split_log(current)[1]
        if raw is None:
            return Status.OK, None
        value = journal.decode_lce(raw, log_id)
        return (Status.OK, value) if not isinstance(value, str) else _bad_record(log_id, value)


def _bad_record(log_id: LogId, problem: str) -> tuple[Status, None]:
    logger.error("epoch store journal: the record of log %d is corrupt (%s); repair the "
                 "journal or restore it", log_id, problem)
    return Status.INTERNAL, None


class Journal:
    """One process's handle on the journal of a store directory: the loaded state and the
    blocking operations on it. Not thread safe: one worker thread calls it (readers on other
    threads only look up ``tables``)."""

    def __init__(
        self,
        root_dir: str,
        *,
        lock_timeout_ms: int,
        compact_bytes_min: int = 64 * 1024 * 1024,
        compact_ratio: int = 4,
    ) -> None:
        assert 1 <= lock_timeout_ms <= 3_600_000, lock_timeout_ms
        assert compact_bytes_min >= 1 and compact_ratio >= 2, (compact_bytes_min, compact_ratio)
        self.root_dir = root_dir
        self.path = os.path.join(root_dir, JOURNAL_FILE)
        self.lock_path = os.path.join(root_dir, LOCK_FILE)
        self._lock_timeout_ms = lock_timeout_ms
        self._compact_bytes_min = compact_bytes_min
        self._compact_ratio = compact_ratio
        self.tables = Tables()
        self._fd: int | None = None
        self._ino = -1
        self._offset = 0
        """File offset just past the last valid frame read (where the next frame goes)."""
        self._torn_bytes = 0
        self._problem: str | None = None
        self.commits_count = 0
        self.compactions_count = 0
        self.torn_tails_count = 0

    # ---- entry points (each takes the lock) ----------------------------------------------

    def refresh(self) -> Status:
        """Catch up on frames appended since the last call (by any process)."""
        if not os.path.isdir(self.root_dir):
            return Status.OK  # nothing written yet; reads must not create the directory
        # A store still in the per-log layout is imported by its first reader too.
        exclusive = not os.path.exists(self.path) and os.path.isdir(
            os.path.join(self.root_dir, LEGACY_LOGS_DIR))
        try:
            with self._locked(exclusive=exclusive) as locked:
                if not locked:
                    return self._lock_timed_out()
                return self._catch_up(exclusive=exclusive)
        except OSError as exc:
            return _io_failed("read", self.path, exc)

    def commit(self, writes: list[Write]) -> list[Status]:
        """Compare-and-swap every write, in order, and store the accepted ones with one write
        and one fsync. Answers one status per write: ``OK``, ``AGAIN`` (version differs),
        ``INTERNAL`` (the stored record is corrupt: never written over), or for all of them
        ``TIMEDOUT``/``INTERNAL``/``NOSPC``. The writes' records must fit in
        one frame (``journal.COMMIT_BYTES_MAX``; callers split larger batches)."""
        try:
            file_io.ensure_dir(self.root_dir)
            with self._locked(exclusive=True) as locked:
                if not locked:
                    return [self._lock_timed_out()] * len(writes)
                status = self._catch_up(exclusive=True)
                if status != Status.OK:
                    return [status] * len(writes)
                return self._commit_locked(writes)
        except OSError as exc:
            return [_io_failed("write", self.path, exc)] * len(writes)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ---- internals -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[bool]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            yield file_io.acquire_flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
                           self._lock_timeout_ms)
        finally:
            os.close(fd)  # releases the lock

    def _lock_timed_out(self) -> Status:
        logger.warning("epoch store lock %s not free within %d ms", self.lock_path,
                       self._lock_timeout_ms)
        return Status.TIMEDOUT

    def _catch_up(self, *, exclusive: bool) -> Status:
        """Under the lock: read new frames; with ``exclusive``, also create the journal (from
        a legacy layout if there is one) and drop a torn tail."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if not exclusive:
                return Status.OK
            self._create()
            st = os.stat(self.path)
        if st.st_size < journal.HEADER.size:
            # Journals are created whole (renamed into place), so only a hand-made file is
            # this short, and it holds nothing.
            if not exclusive:
                return Status.OK
            self._create()
            st = os.stat(self.path)
        tables = self.tables
        if self._fd is None or st.st_ino != self._ino:
            # First use, or another process compacted the journal. The new state is built
            # aside: readers on other threads keep the old tables until it is complete.
            self.close()
            self._fd = os.open(self.path, os.O_RDWR)
            self._ino, self._offset, self._torn_bytes, self._problem = st.st_ino, 0, 0, None
            tables = Tables()
            problem = journal.check_header(os.pread(self._fd, journal.HEADER.size, 0))
            if problem is not None:
                return self._corrupt(problem)
            self._offset = journal.HEADER.size
        if self._problem is not None:
            return Status.INTERNAL
        if st.st_size < self._offset:
            return self._corrupt(f"shrank to {st.st_size} bytes below {self._offset} read")
        self._torn_bytes = 0
        while st.st_size > self._offset:
            # In chunks, so that loading a large journal does not hold all of it at once.
            remaining = st.st_size - self._offset
            size = min(remaining, READ_CHUNK_BYTES)
            found = journal.scan(os.pread(self._fd, size, self._offset), tables.objects)
            self._offset += found.valid_bytes
            if found.problem is not None:
                self.tables = tables
                return self._corrupt(found.problem)
            if size == remaining:
                self._torn_bytes = found.torn_bytes
                break
            # Not at the end: a frame cut by the chunk's end is read again with the next one.
            assert found.valid_bytes > 0, "a chunk holds at least one whole frame"
        self.tables = tables
        if exclusive and self._torn_bytes:
            logger.warning("epoch store journal %s: dropping a torn tail of %d bytes at %d "
                           "(a commit that never finished)", self.path, self._torn_bytes,
                           self._offset)
            self.torn_tails_count += 1
            os.ftruncate(self._fd, self._offset)
            os.fsync(self._fd)
            self._torn_bytes = 0
        return Status.OK

    def _corrupt(self, problem: str) -> Status:
        if self._problem is None:
            logger.error("epoch store journal %s is corrupt: %s; repair or restore it",
                         self.path, problem)
        self._problem = problem
        return Status.INTERNAL

    def _create(self) -> None:
        """Create the journal whole (header and any legacy objects) under a temporary name
        and rename it into place, so that no reader ever sees a partial one."""
        legacy = _legacy_records(self.root_dir)
        data = journal.header() + b"".join(
            journal.encode_frames([journal.encode_record(v) for v in legacy]))
        # Read back by the catch-up that follows, like any other journal.
        self._replace_with(data)
        if legacy:
            logger.info("epoch store %s: imported %d objects of the per-log layout into %s; "
                        "the %s/ directory is no longer used", self.root_dir, len(legacy),
                        JOURNAL_FILE, LEGACY_LOGS_DIR)

    def _replace_with(self, data: bytes) -> None:
        tmp_path = self.path + COMPACT_SUFFIX
        fd = os.open(tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, self.path)
        fsync_dir(self.root_dir)

    def _commit_locked(self, writes: list[Write]) -> list[Status]:
        assert self._fd is not None
        tables = self.tables
        staged: dict[tuple[bool, LogId], journal.Record] = {}
        statuses: list[Status] = []
        accepted: list[tuple[LogId, bytes]] = []
        for value, expected_version in writes:
            is_meta = type(value) is LogMetadata
            key = (is_meta, value.log_id)
            current: journal.Record | None = staged.get(key)
            if current is None:
                status, current = (tables.get_metadata(value.log_id) if is_meta
                                   else tables.get_lce(value.log_id))
                if status != Status.OK:
                    statuses.append(status)  # a corrupt record is never written over
                    continue
            stored_version = 0 if current is None else current.version
            if stored_version != expected_version:
                statuses.append(Status.AGAIN)
                continue
            assert value.version == expected_version + 1, (value, expected_version)
            staged[key] = value
            accepted.append((value.log_id, journal.encode_record(value)))
            statuses.append(Status.OK)
        if not accepted:
            return statuses
        frames = journal.encode_frames([raw for _, raw in accepted])
        assert len(frames) == 1, "a commit's writes must fit in one frame"
        try:
            _write_all(self._fd, frames[0], self._offset)
            os.fsync(self._fd)
        except OSError as exc:
            status = _io_failed("write", self.path, exc)
            # Whether the bytes are durable is unknown; take them back so nobody reads them.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._offset)
                os.fsync(self._fd)
            return [status if s == Status.OK else s for s in statuses]
        self._offset += len(frames[0])
        objects = tables.objects
        for log_id, raw in accepted:
            objects[log_id] = journal.merged(objects.get(log_id), raw)
        self.commits_count += 1
        self._maybe_compact()
        return statuses

    def _maybe_compact(self) -> None:
        objects = 2 * len(self.tables.objects)
        live_bytes = journal.HEADER.size + objects * RECORD_BYTES_ESTIMATE
        if self._offset < max(self._compact_bytes_min, self._compact_ratio * live_bytes):
            return
        # Records are kept encoded: compaction only copies them.
        values = list(self.tables.objects.values())
        data = journal.header() + b"".join(journal.encode_frames(values))
        try:
            self._replace_with(data)
        except OSError as exc:
            logger.warning("epoch store journal %s: compaction failed (%s); continuing with "
                           "the long journal", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(self.path + COMPACT_SUFFIX)
            return
        # The next catch-up sees the new inode and reloads it (same values, fewer records).
        self.compactions_count += 1
        logger.info("epoch store journal %s compacted to %d bytes (%d objects)", self.path,
                    len(data), objects)


def _legacy_records(root_dir: str) -> list[journal.Record]:
    """The objects of the per-log directory layout under ``root_dir`` (none if absent).
    Corrupt ones are left out and logged; their logs would answer INTERNAL in that layout."""
    logs_dir = os.path.join(root_dir, LEGACY_LOGS_DIR)
    try:
        names = os.listdir(logs_dir)
    except FileNotFoundError:
        return []
    values: list[journal.Record] = []
    for name in sorted(names):
        if not name.isdigit():
            continue
        log_id = LogId(int(name))
        for file_name, from_dict in ((_LEGACY_SEQUENCER, records.metadata_from_dict),
                                     (_LEGACY_LCE, records.lce_from_dict)):
            path = os.path.join(logs_dir, name, file_name)
            raw = file_io.read_bytes(path, records.OBJECT_BYTES_MAX)
            if raw is None:
                continue
            data = records.decode(raw)
            value = data if isinstance(data, str) else from_dict(data, log_id)
            if isinstance(value, str):
                logger.error("legacy epoch store object %s is corrupt (%s); not imported",
                             path, value)
                continue
            values.append(value)
    return values


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _io_failed(action: str, path: str, exc: OSError) -> Status:
    logger.error("epoch store could not %s %s: %s", action, path, exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Status.NOSPC
    return Status.INTERNAL
