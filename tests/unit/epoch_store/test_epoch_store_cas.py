"""The compare-and-swap loop of CasEpochStore: bounded retries, error propagation, and the
memory backend driven without an event loop (as the deterministic simulation does)."""

from __future__ import annotations

import random
from collections.abc import Coroutine
from typing import Any, TypeVar

from epoch_store import CasEpochStore, CasRetry, MemoryEpochStore, MemoryObjects
from shared.epoch_metadata import LastCleanEpoch, LogMetadata, ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId

T = TypeVar("T")
LOG = LogId(11)
SPEC = ProvisionSpec(nodeset=(NodeId("s1"),), replication_factor=1)
NO_BACKOFF = CasRetry(attempts_max=5, backoff_ms_min=0, backoff_ms_max=0)


class RacingObjects(MemoryObjects):
    """Memory objects where a rival process wins the next ``losses`` writes, or where every
    write fails with ``failure``."""

    def __init__(self, losses: int = 0, failure: Status | None = None) -> None:
        super().__init__()
        self.losses = losses
        self.failure = failure
        self.writes = 0

    async def write_metadata(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status:
        self.writes += 1
        if self.failure is not None:
            return self.failure
        if self.losses > 0:
            self.losses -= 1
            # The rival takes the epoch we were about to take.
            await super().write_metadata(log_id, value, expected_version=expected_version)
            return Status.AGAIN
        return await super().write_metadata(log_id, value, expected_version=expected_version)

    async def write_lce(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status:
        self.writes += 1
        if self.losses > 0:
            self.losses -= 1
            return Status.AGAIN
        return await super().write_lce(log_id, value, expected_version=expected_version)


def run_without_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends, the way a loop-free simulation would."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("the coroutine suspended")


async def test_lost_races_are_retried_and_skip_the_rivals_epochs() -> None:
    objects = RacingObjects(losses=3)
    store = CasEpochStore(objects, retry=NO_BACKOFF)
    status, epoch, _ = await store.activate(LOG, writer=NodeId("w"), provision=SPEC)
    # The rival provisioned and took epochs 1..3 while we kept losing.
    assert (status, epoch, objects.writes) == (Status.OK, 4, 4)


async def test_too_many_lost_races_answer_again() -> None:
    objects = RacingObjects(losses=100)
    store = CasEpochStore(objects, retry=NO_BACKOFF)
    assert await store.activate(LOG, writer=NodeId("w"), provision=SPEC) == (
        Status.AGAIN, 0, None
    )
    assert objects.writes == NO_BACKOFF.attempts_max
    assert len(store._locks) == 0


async def test_lce_races_are_retried() -> None:
    objects = RacingObjects()
    store = CasEpochStore(objects, retry=NO_BACKOFF)
    await store.activate(LOG, writer=NodeId("w"), provision=SPEC)
    objects.losses = 2
    assert await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0)) == Status.OK
    objects.losses = 100
    assert await store.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.AGAIN


async def test_backend_errors_are_not_retried() -> None:
    objects = RacingObjects(failure=Status.NOSPC)
    store = CasEpochStore(objects, retry=NO_BACKOFF)
    assert await store.activate(LOG, writer=NodeId("w"), provision=SPEC) == (
        Status.NOSPC, 0, None
    )
    assert objects.writes == 1


def test_backoff_is_jittered_and_capped() -> None:
    retry = CasRetry(attempts_max=10, backoff_ms_min=2, backoff_ms_max=50)
    rng = random.Random(1)
    for attempt_index in range(40):
        delay_ms = retry.backoff_ms(attempt_index, rng)
        assert 0 <= delay_ms <= min(50, 2 << attempt_index)


def test_memory_store_completes_without_an_event_loop() -> None:
    store = MemoryEpochStore()
    for expected in (1, 2, 3):
        status, epoch, _ = run_without_loop(
            store.activate(LOG, writer=NodeId("w"), provision=SPEC)
        )
        assert (status, epoch) == (Status.OK, expected)
    assert run_without_loop(store.set_last_clean_epoch(LOG, Epoch(2), Lsn(0))) == Status.OK
    status, lce = run_without_loop(store.get_last_clean_epoch(LOG))
    assert status == Status.OK and lce is not None and lce.epoch == 2
    run_without_loop(store.close())
    assert store.memory.closed
