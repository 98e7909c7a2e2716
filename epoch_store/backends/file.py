"""File epoch store: the embedded default, one directory shared by the node processes of one
machine.

Layout under the root directory::

    logs/<log_id>/sequencer.json   LogMetadata (epoch metadata, next epoch, last writer)
    logs/<log_id>/lce.json         LastCleanEpoch
    logs/<log_id>/lock             flock'ed by every writer of either object

A write takes the log's lock, re-reads the stored version, and replaces the object crash-safely
only if that version is the expected one (``file_io``). Reads take no lock. All blocking I/O
runs on this store's own small thread pool, never on the event loop (a dedicated pool, so that
threads waiting for a lock held by another process cannot starve the loop's default executor).

Unreadable or corrupt objects answer ``INTERNAL`` and are logged; a corrupt object is never
overwritten, since its version cannot be checked: an operator must repair or remove it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from epoch_store.backends import file_io
from epoch_store.backends.cas import CasEpochStore, CasRetry
from epoch_store.core import records
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import LogId

logger = logging.getLogger(__name__)

SEQUENCER_FILE = "sequencer.json"
LCE_FILE = "lce.json"
LOCK_FILE = "lock"
TMP_SUFFIX = ".tmp"

_Value = TypeVar("_Value", LogMetadata, LastCleanEpoch)
_R = TypeVar("_R")
_FromDict = Callable[[dict[str, Any], LogId], _Value | str]


class FileObjects:
    """``VersionedObjects`` in a directory. The ``*_sync`` methods block and are public for
    tooling that runs outside an event loop."""

    def __init__(
        self,
        root_dir: str,
        *,
        lock_timeout_ms: int = 10_000,
        io_threads_max: int = 4,
        io_requests_inflight_max: int = 256,
    ) -> None:
        if not os.path.isabs(root_dir):
            raise ValueError(f"epoch store directory must be absolute: {root_dir!r}")
        assert 1 <= lock_timeout_ms <= 3_600_000, lock_timeout_ms
        assert 1 <= io_threads_max <= 64, io_threads_max
        assert 1 <= io_requests_inflight_max <= 100_000, io_requests_inflight_max
        self.root_dir = root_dir
        self._lock_timeout_ms = lock_timeout_ms
        self._executor = ThreadPoolExecutor(io_threads_max, thread_name_prefix="epoch-store-io")
        # Bounds the executor's otherwise unbounded work queue; callers beyond it wait here.
        self._inflight = asyncio.Semaphore(io_requests_inflight_max)
        self._closed = False

    def log_dir(self, log_id: LogId) -> str:
        return os.path.join(self.root_dir, "logs", str(int(log_id)))

    def read_metadata_sync(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        return self._read(log_id, SEQUENCER_FILE, records.metadata_from_dict)

    def read_lce_sync(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return self._read(log_id, LCE_FILE, records.lce_from_dict)

    def write_metadata_sync(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status:
        return self._write(
            log_id, SEQUENCER_FILE, value, records.metadata_to_dict(value),
            expected_version, records.metadata_from_dict,
        )

    def write_lce_sync(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status:
        return self._write(
            log_id, LCE_FILE, value, records.lce_to_dict(value),
            expected_version, records.lce_from_dict,
        )

    async def read_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        return await self._run(lambda: self.read_metadata_sync(log_id), (Status.SHUTDOWN, None))

    async def read_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return await self._run(lambda: self.read_lce_sync(log_id), (Status.SHUTDOWN, None))

    async def write_metadata(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status:
        return await self._run(
            lambda: self.write_metadata_sync(log_id, value, expected_version=expected_version),
            Status.SHUTDOWN,
        )

    async def write_lce(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status:
        return await self._run(
            lambda: self.write_lce_sync(log_id, value, expected_version=expected_version),
            Status.SHUTDOWN,
        )

    async def close(self) -> None:
        """Refuse new work and wait for the I/O already started (bounded by the lock
        timeout)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def _run(self, work: Callable[[], _R], if_closed: _R) -> _R:
        async with self._inflight:
            if self._closed:
                return if_closed
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def _read(
        self, log_id: LogId, name: str, from_dict: _FromDict[_Value]
    ) -> tuple[Status, _Value | None]:
        path = os.path.join(self.log_dir(log_id), name)
        try:
            raw = file_io.read_bytes(path, records.OBJECT_BYTES_MAX)
        except OSError as exc:
            return _io_failed("read", path, exc), None
        if raw is None:
            return Status.OK, None
        data = records.decode(raw)
        value = data if isinstance(data, str) else from_dict(data, log_id)
        if isinstance(value, str):
            logger.error("epoch store object %s is corrupt (%s); repair or remove it", path, value)
            return Status.INTERNAL, None
        return Status.OK, value

    def _write(
        self,
        log_id: LogId,
        name: str,
        value: _Value,
        data: dict[str, Any],
        expected_version: int,
        from_dict: _FromDict[_Value],
    ) -> Status:
        assert value.log_id == log_id and value.version == expected_version + 1, value
        log_dir = self.log_dir(log_id)
        path = os.path.join(log_dir, name)
        try:
            file_io.ensure_dir(log_dir)
            lock_path = os.path.join(log_dir, LOCK_FILE)
            with file_io.exclusive_lock(lock_path, self._lock_timeout_ms) as locked:
                if not locked:
                    logger.warning("epoch store lock %s not free within %d ms", lock_path,
                                   self._lock_timeout_ms)
                    return Status.TIMEDOUT
                status, current = self._read(log_id, name, from_dict)
                if status != Status.OK:
                    return status
                if (0 if current is None else current.version) != expected_version:
                    return Status.AGAIN
                file_io.replace_atomically(path, records.encode(data), path + TMP_SUFFIX)
                return Status.OK
        except OSError as exc:
            return _io_failed("write", path, exc)


def _io_failed(action: str, path: str, exc: OSError) -> Status:
    logger.error("epoch store could not %s %s: %s", action, path, exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Status.NOSPC
    return Status.INTERNAL


class FileEpochStore(CasEpochStore):
    """An ``EpochStore`` in the directory ``root_dir`` (absolute), safe to share between
    processes on one machine."""

    def __init__(
        self,
        root_dir: str,
        *,
        lock_timeout_ms: int = 10_000,
        io_threads_max: int = 4,
        retry: CasRetry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.files = FileObjects(
            root_dir, lock_timeout_ms=lock_timeout_ms, io_threads_max=io_threads_max
        )
        super().__init__(self.files, retry=retry, rng=rng)
