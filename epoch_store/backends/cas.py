"""The one ``EpochStore`` implementation: read -> pure plan -> compare-and-swap, retried.

A backend only has to provide ``VersionedObjects``: read and version-conditional write of a
log's ``sequencer`` metadata and ``lce`` objects (a ZooKeeper backend maps these onto
``get``/``create``/``set(version=...)``). ``CasEpochStore`` runs every change through the pure
planners of ``epoch_store.core.metadata`` and retries lost races a bounded number of times with
jittered backoff, then answers ``AGAIN``.

Within one process, changes to the same log are serialized by a per-log lock so that the
process does not race itself; races between processes are what the compare-and-swap is for.

Cancelling a change while its write is in flight may still apply the write: an epoch can be
consumed without being returned, but never returned twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from epoch_store.core import metadata as core
from shared.epoch_metadata import LastCleanEpoch, LogMetadata, NodesetTarget, ProvisionSpec
from shared.status import Status
from shared.types import EPOCH_INVALID, Epoch, LogId, Lsn, NodeId

T = TypeVar("T")


class VersionedObjects(Protocol):
    """Storage of a log's two objects. Reads answer ``(OK, None)`` for a missing object.
    Writes store ``value`` only if the stored version equals ``expected_version`` (0: the
    object must not exist yet) and answer ``OK``, ``AGAIN`` (version differs) or a backend
    error (``INTERNAL``, ``NOSPC``, ``TIMEDOUT``, ``CONNFAILED``)."""

    async def read_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]: ...

    async def write_metadata(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status: ...

    async def read_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]: ...

    def cached_lce(self, log_id: LogId) -> LastCleanEpoch | None:
        """The LCE this handle last read or wrote, if it remembers one (else None): a guess
        a first compare-and-swap may plan on instead of a read, for backends where reads are
        costly. A stale guess only makes that write fail (its version moved on, and the
        stored epoch only grows) and the retry reads."""
        ...

    async def write_lce(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CasRetry:
    """How often and how patiently a lost compare-and-swap is retried."""

    attempts_max: int = 32
    backoff_ms_min: int = 1
    backoff_ms_max: int = 64

    def __post_init__(self) -> None:
        assert 1 <= self.attempts_max <= 10_000, self.attempts_max
        assert 0 <= self.backoff_ms_min <= self.backoff_ms_max <= 60_000, self

    def backoff_ms(self, attempt_index: int, rng: random.Random) -> float:
        """Full jitter over an exponentially growing cap, so racing processes spread out."""
        cap_ms = min(self.backoff_ms_max, self.backoff_ms_min << min(attempt_index, 20))
        return rng.uniform(0, cap_ms)


class _KeyedLocks:
    """One ``asyncio.Lock`` per log with a change in flight; entries vanish when unused, so the
    table holds at most as many entries as there are concurrent callers."""

    def __init__(self) -> None:
        self._entries: dict[LogId, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, log_id: LogId) -> AsyncIterator[None]:
        entry = self._entries.get(log_id)
        if entry is None:
            entry = self._entries[log_id] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._entries[log_id]

    def __len__(self) -> int:
        return len(self._entries)


class CasEpochStore:
    """``shared.ports.EpochStore`` over any ``VersionedObjects``. Statuses as in the port, plus
    ``INVALID_PARAM`` (bad log id, writer, provision spec, epoch or tail LSN), ``INTERNAL``
    (stored data unreadable), ``NOSPC`` and ``SHUTDOWN`` (after ``close``)."""

    def __init__(
        self,
        objects: VersionedObjects,
        *,
        retry: CasRetry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._objects = objects
        self._retry = retry or CasRetry()
        self._rng = rng or random.Random()
        self._locks = _KeyedLocks()
        self._closed = False
        self.cas_conflicts_count = 0
        """Compare-and-swap races lost so far (each one retried or answered ``AGAIN``)."""

    @property
    def objects(self) -> VersionedObjects:
        """The backend's raw objects (for tooling and tests that set up a state)."""
        return self._objects

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        status = self._check(log_id)
        if status != Status.OK:
            return status, None
        status, current = await self._objects.read_metadata(log_id)
        if status == Status.OK and current is None:
            return Status.NOTFOUND, None
        return status, current

    async def activate(
        self, log_id: LogId, *, writer: NodeId, provision: ProvisionSpec | None,
        retired: frozenset[NodeId] = frozenset(), target: NodesetTarget | None = None,
    ) -> tuple[Status, Epoch, LogMetadata | None]:
        status = self._check(log_id)
        if status != Status.OK:
            return status, EPOCH_INVALID, None

        async def attempt() -> tuple[Status, LogMetadata | None]:
            status, current = await self._objects.read_metadata(log_id)
            if status != Status.OK:
                return status, None
            status, after = core.plan_activation(
                current, log_id=log_id, writer=writer, provision=provision, retired=retired,
                target=target,
            )
            if status != Status.OK:
                return status, None
            assert after is not None
            status = await self._objects.write_metadata(
                log_id, after, expected_version=core.version_of(current)
            )
            return status, after if status == Status.OK else None

        status, after = await self._change(log_id, attempt)
        if status != Status.OK:
            return status, EPOCH_INVALID, None
        assert after is not None
        return Status.OK, core.epoch_taken(after), after

    async def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        status = self._check(log_id)
        if status != Status.OK:
            return status, None
        status, current, log_provisioned = await self._read_lce(log_id)
        if status != Status.OK:
            return status, None
        return core.view_last_clean_epoch(
            current, log_id=log_id, log_provisioned=log_provisioned
        )

    async def set_last_clean_epoch(self, log_id: LogId, epoch: Epoch, tail_lsn: Lsn) -> Status:
        status = self._check(log_id)
        if status != Status.OK:
            return status

        first_attempt = True

        async def attempt() -> tuple[Status, LastCleanEpoch | None]:
            nonlocal first_attempt
            guess = self._objects.cached_lce(log_id) if first_attempt else None
            first_attempt = False
            current: LastCleanEpoch | None
            if guess is not None:
                # A graceful stop marks thousands of epochs clean: no read for each.
                status, current, log_provisioned = Status.OK, guess, True
            else:
                status, current, log_provisioned = await self._read_lce(log_id)
            if status != Status.OK:
                return status, None
            status, after = core.plan_last_clean_epoch(
                current, log_id=log_id, log_provisioned=log_provisioned,
                epoch=epoch, tail_lsn=tail_lsn,
            )
            if status != Status.OK:
                return status, None
            assert after is not None
            status = await self._objects.write_lce(
                log_id, after, expected_version=core.version_of(current)
            )
            return status, after if status == Status.OK else None

        status, _ = await self._change(log_id, attempt)
        return status

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._objects.close()

    def _check(self, log_id: LogId) -> Status:
        if self._closed:
            return Status.SHUTDOWN
        return core.check_log_id(log_id)

    async def _read_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None, bool]:
        """The stored LCE and whether the log exists (only looked up when there is no LCE:
        an LCE is written only for provisioned logs, and logs are never deleted)."""
        status, current = await self._objects.read_lce(log_id)
        if status != Status.OK or current is not None:
            return status, current, True
        status, meta = await self._objects.read_metadata(log_id)
        return status, None, meta is not None

    async def _change(
        self, log_id: LogId, attempt: Callable[[], Awaitable[tuple[Status, T | None]]]
    ) -> tuple[Status, T | None]:
        """Run ``attempt`` until it does not lose a race, at most ``attempts_max`` times."""
        async with self._locks.hold(log_id):
            for attempt_index in range(self._retry.attempts_max):
                if self._closed:
                    return Status.SHUTDOWN, None
                status, value = await attempt()
                if status != Status.AGAIN:
                    return status, value
                self.cas_conflicts_count += 1
                if attempt_index + 1 < self._retry.attempts_max:
                    delay_s = self._retry.backoff_ms(attempt_index, self._rng) / 1000
                    await asyncio.sleep(delay_s)
        return Status.AGAIN, None
