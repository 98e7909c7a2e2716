"""In-memory epoch store for the deterministic simulation and unit tests.

Plain dicts behind the same ``VersionedObjects`` port and the same ``CasEpochStore`` rules as
the file backend. No method ever suspends, so a simulation without an event loop can drive a
call to completion with one ``coroutine.send(None)``. Several ``CasEpochStore``s may share one
``MemoryObjects`` to model several processes using one store.
"""

from __future__ import annotations

import random
from typing import TypeVar

from epoch_store.backends.cas import CasEpochStore, CasRetry
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import LogId

_Value = TypeVar("_Value", LogMetadata, LastCleanEpoch)


def _cas(
    table: dict[LogId, _Value], log_id: LogId, value: _Value, expected_version: int
) -> Status:
    current = table.get(log_id)
    stored_version = 0 if current is None else current.version
    if stored_version != expected_version:
        return Status.AGAIN
    assert value.version == expected_version + 1, (value, expected_version)
    assert value.log_id == log_id, (value, log_id)
    table[log_id] = value
    return Status.OK


class MemoryObjects:
    """``VersionedObjects`` in two dicts. ``closed`` only records that ``close`` was called."""

    def __init__(self) -> None:
        self.metadata: dict[LogId, LogMetadata] = {}
        self.lce: dict[LogId, LastCleanEpoch] = {}
        self.closed = False

    async def read_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        return Status.OK, self.metadata.get(log_id)

    async def write_metadata(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status:
        return _cas(self.metadata, log_id, value, expected_version)

    async def read_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return Status.OK, self.lce.get(log_id)

    async def write_lce(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status:
        return _cas(self.lce, log_id, value, expected_version)

    def cached_lce(self, log_id: LogId) -> LastCleanEpoch | None:
        return None  # reads are cheap here

    async def close(self) -> None:
        self.closed = True


class MemoryEpochStore(CasEpochStore):
    """An ``EpochStore`` kept in this process's memory."""

    def __init__(
        self,
        objects: MemoryObjects | None = None,
        *,
        retry: CasRetry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.memory = objects or MemoryObjects()
        super().__init__(self.memory, retry=retry, rng=rng)
