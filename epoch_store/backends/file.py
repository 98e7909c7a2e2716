"""File epoch store: the embedded default, one directory shared by the node processes of one
machine.

All logs live in one journal (``journal_file``: an append-only, CRC-framed, fsynced file of
value updates, compacted now and then, guarded by one ``flock``), not in a directory per log.
Writes are group-committed: every compare-and-swap that reaches this store while a commit is
running, or in the same event-loop iteration, goes into the next commit, so that provisioning
many logs or marking thousands of epochs clean at a graceful stop costs one write and one fsync
per batch, not per log. Reads first catch up on what other processes appended (also batched:
one catch-up serves every read waiting for it).

All blocking I/O runs on this store's own worker thread, never on the event loop; one thread,
because commits are serial anyway (they hold the exclusive lock).

A journal whose frames are damaged (anything but a torn last commit) answers ``INTERNAL`` to
every call and is never written over; a record that does not decode fails only its log's object
(``INTERNAL`` to reads and writes of it). Either way an operator must repair or restore it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from epoch_store.backends.cas import CasEpochStore, CasRetry
from epoch_store.backends.journal_file import Journal, Write
from epoch_store.core import journal
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.limits import NODESET_SIZE_MAX
from shared.status import Status
from shared.types import LogId

logger = logging.getLogger(__name__)

_R = TypeVar("_R")
RECORD_BYTES_MAX = journal.RECORD_HEAD.size + 4 + 4 + 1 + 1 + NODESET_SIZE_MAX * 64 + 64
"""Upper bound of one encoded record (a full nodeset of the longest node ids, and a writer)."""


class FileObjects:
    """``VersionedObjects`` in a directory. The ``*_sync`` methods block and are public for
    tooling that runs outside an event loop."""

    def __init__(
        self,
        root_dir: str,
        *,
        lock_timeout_ms: int = 10_000,
        io_requests_inflight_max: int = 65_536,
        compact_bytes_min: int = 64 * 1024 * 1024,
    ) -> None:
        if not root_dir.startswith("/"):
            raise ValueError(f"epoch store directory must be absolute: {root_dir!r}")
        assert 1 <= io_requests_inflight_max <= 1_000_000, io_requests_inflight_max
        self.root_dir = root_dir
        self.journal = Journal(root_dir, lock_timeout_ms=lock_timeout_ms,
                               compact_bytes_min=compact_bytes_min)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="epoch-store-io")
        # Bounds the queues below; callers beyond it wait here.
        self._inflight = asyncio.Semaphore(io_requests_inflight_max)
        self._writes: deque[tuple[Write, asyncio.Future[Status]]] = deque()
        self._readers: list[asyncio.Future[Status]] = []
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self.commit_batches_count = 0
        """Group commits run (each one write and one fsync for all the writes in it)."""

    # ---- blocking, for tooling -------------------------------------------------------------

    def read_metadata_sync(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        status = self.journal.refresh()
        return self.journal.tables.get_metadata(log_id) if status == Status.OK else (status, None)

    def read_lce_sync(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        status = self.journal.refresh()
        return self.journal.tables.get_lce(log_id) if status == Status.OK else (status, None)

    # ---- VersionedObjects --------------------------------------------------------------------

    async def read_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        status = await self._refresh()
        return self.journal.tables.get_metadata(log_id) if status == Status.OK else (status, None)

    async def read_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        status = await self._refresh()
        return self.journal.tables.get_lce(log_id) if status == Status.OK else (status, None)

    async def write_metadata(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status:
        assert value.log_id == log_id and value.version == expected_version + 1, value
        return await self._write((value, expected_version))

    async def write_lce(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status:
        assert value.log_id == log_id and value.version == expected_version + 1, value
        return await self._write((value, expected_version))

    def cached_lce(self, log_id: LogId) -> LastCleanEpoch | None:
        return None  # reads are cheap here

    async def close(self) -> None:
        """Refuse new work, finish the work already queued (bounded by the lock timeout),
        and release the journal."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self.journal.close()

    # ---- group commit ------------------------------------------------------------------------

    async def _refresh(self) -> Status:
        async with self._inflight:
            if self._closed:
                return Status.SHUTDOWN
            future: asyncio.Future[Status] = asyncio.get_running_loop().create_future()
            self._readers.append(future)
            self._kick()
            return await future

    async def _write(self, write: Write) -> Status:
        async with self._inflight:
            if self._closed:
                return Status.SHUTDOWN
            future: asyncio.Future[Status] = asyncio.get_running_loop().create_future()
            self._writes.append((write, future))
            self._kick()
            return await future

    def _kick(self) -> None:
        # The worker's first step runs in the next loop iteration, so everything queued in
        # this one shares its first batch; what arrives while a batch runs shares the next.
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while self._writes or self._readers:
            readers, self._readers = self._readers, []
            batch = self._take_batch()
            try:
                if batch:
                    statuses = await loop.run_in_executor(
                        self._executor, self.journal.commit, [w for w, _ in batch])
                    self.commit_batches_count += 1
                    for (_, future), status in zip(batch, statuses, strict=True):
                        _resolve(future, status)
                    # A commit caught up on the journal first: its readers are served too.
                    status = Status.OK
                else:
                    status = await loop.run_in_executor(self._executor, self.journal.refresh)
            except Exception:  # a bug: answer rather than leave callers hanging
                logger.exception("epoch store journal I/O failed")
                for _, future in batch:
                    _resolve(future, Status.INTERNAL)
                status = Status.INTERNAL
            for future in readers:
                _resolve(future, status)

    def _take_batch(self) -> list[tuple[Write, asyncio.Future[Status]]]:
        """The next writes that fit in one commit (one frame), skipping cancelled callers."""
        batch: list[tuple[Write, asyncio.Future[Status]]] = []
        budget = journal.COMMIT_BYTES_MAX
        while self._writes and budget >= RECORD_BYTES_MAX:
            write, future = self._writes.popleft()
            if future.done():
                continue
            batch.append((write, future))
            budget -= _record_bytes_bound(write[0])
        return batch


def _record_bytes_bound(value: journal.Record) -> int:
    if type(value) is LogMetadata:
        return journal.RECORD_HEAD.size + 10 + sum(1 + len(n) for n in value.nodeset) + 64
    return journal.RECORD_HEAD.size + 16


def _resolve(future: asyncio.Future[Status], status: Status) -> None:
    if not future.done():
        future.set_result(status)


class FileEpochStore(CasEpochStore):
    """An ``EpochStore`` in the directory ``root_dir`` (absolute), safe to share between
    processes on one machine."""

    def __init__(
        self,
        root_dir: str,
        *,
        lock_timeout_ms: int = 10_000,
        compact_bytes_min: int = 64 * 1024 * 1024,
        retry: CasRetry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.files = FileObjects(root_dir, lock_timeout_ms=lock_timeout_ms,
                                 compact_bytes_min=compact_bytes_min)
        super().__init__(self.files, retry=retry, rng=rng)
