"""The ``EpochStore`` contract, run against every backend: memory, file, and ZooKeeper (a real
standalone server, see conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from epoch_store import (
    CasEpochStore,
    FileEpochStore,
    MemoryEpochStore,
    MemoryObjects,
    ZooKeeperEpochStore,
)
from epoch_store.zk_server import ServerHandle
from shared.epoch_metadata import (
    EpochNodeset,
    LastCleanEpoch,
    LogMetadata,
    NodesetTarget,
    ProvisionSpec,
)
from shared.status import Status
from shared.types import EPOCH_MAX, Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from tests.zk_support import unique_root

N1, N2 = NodeId("n1"), NodeId("n2")
SPEC = ProvisionSpec(nodeset=(NodeId("s1"), NodeId("s2"), NodeId("s3")), replication_factor=2)
LOG = LogId(7)

# Opens one more handle on the same backing store, like another process would.
StoreOpener = Callable[[], CasEpochStore]


@pytest.fixture(params=["memory", "file", "zookeeper"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    shared_memory = MemoryObjects()
    opened: list[CasEpochStore] = []
    zk_root = unique_root()
    zk: ServerHandle | None = None
    if request.param == "zookeeper":
        zk = request.getfixturevalue("zk_server_handle")

    def opener() -> CasEpochStore:
        store: CasEpochStore
        if request.param == "memory":
            store = MemoryEpochStore(shared_memory)
        elif zk is not None:
            store = ZooKeeperEpochStore(zk.address, zk_root)
        else:
            store = FileEpochStore(str(tmp_path / "epochs"))
        opened.append(store)
        return store

    yield opener
    for store in opened:
        await store.close()


@pytest.fixture
def store(open_store: StoreOpener) -> CasEpochStore:
    return open_store()


async def test_first_activation_provisions_the_log(store: CasEpochStore) -> None:
    status, epoch, meta = await store.activate(LOG, writer=N1, provision=SPEC)
    assert (status, epoch) == (Status.OK, 1)
    expected = LogMetadata(log_id=LOG, next_epoch=Epoch(2), nodeset=SPEC.nodeset,
                           replication_factor=2, last_writer=N1, version=1)
    assert meta == expected
    assert await store.get_metadata(LOG) == (Status.OK, expected)


async def test_unknown_log_is_notfound_everywhere(store: CasEpochStore) -> None:
    assert await store.get_metadata(LOG) == (Status.NOTFOUND, None)
    assert await store.activate(LOG, writer=N1, provision=None) == (Status.NOTFOUND, 0, None)
    assert await store.get_last_clean_epoch(LOG) == (Status.NOTFOUND, None)
    assert await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0)) == Status.NOTFOUND
    assert await store.get_metadata(LOG) == (Status.NOTFOUND, None)


async def test_epochs_strictly_increase_and_keep_the_provisioned_config(
    store: CasEpochStore,
) -> None:
    other_spec = ProvisionSpec(nodeset=(NodeId("s9"),), replication_factor=1)
    epochs = []
    for i in range(20):
        writer = N1 if i % 2 else N2
        status, epoch, meta = await store.activate(LOG, writer=writer, provision=other_spec
                                                   if i else SPEC)
        assert status == Status.OK and meta is not None
        assert (meta.next_epoch, meta.last_writer, meta.version) == (epoch + 1, writer, i + 1)
        assert meta.nodeset == SPEC.nodeset
        epochs.append(epoch)
    assert epochs == list(range(1, 21))
    # An existing log needs no provision spec.
    assert (await store.activate(LOG, writer=N1, provision=None))[:2] == (Status.OK, 21)


async def test_last_clean_epoch_only_increases(store: CasEpochStore) -> None:
    await store.activate(LOG, writer=N1, provision=SPEC)
    none_yet = LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0), version=0)
    assert await store.get_last_clean_epoch(LOG) == (Status.OK, none_yet)

    tail = compose_lsn(Epoch(3), Esn(9))
    assert await store.set_last_clean_epoch(LOG, Epoch(3), tail) == Status.OK
    stored = LastCleanEpoch(log_id=LOG, epoch=Epoch(3), tail_lsn=tail, version=1)
    assert await store.get_last_clean_epoch(LOG) == (Status.OK, stored)

    assert await store.set_last_clean_epoch(LOG, Epoch(3), tail) == Status.STALE
    assert await store.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.STALE
    assert await store.get_last_clean_epoch(LOG) == (Status.OK, stored)

    assert await store.set_last_clean_epoch(LOG, Epoch(5), Lsn(0)) == Status.OK
    status, lce = await store.get_last_clean_epoch(LOG)
    assert status == Status.OK and lce is not None
    assert (lce.epoch, lce.tail_lsn, lce.version) == (5, 0, 2)


async def test_invalid_arguments_change_nothing(store: CasEpochStore) -> None:
    bad_spec = ProvisionSpec(nodeset=(NodeId("s1"),), replication_factor=2)
    assert (await store.activate(LOG, writer=N1, provision=bad_spec))[0] == Status.INVALID_PARAM
    assert (await store.activate(LogId(0), writer=N1, provision=SPEC))[0] == Status.INVALID_PARAM
    bad_writer = NodeId("no spaces")
    assert (await store.activate(LOG, writer=bad_writer, provision=SPEC))[0] == (
        Status.INVALID_PARAM
    )
    assert await store.get_metadata(LOG) == (Status.NOTFOUND, None)

    await store.activate(LOG, writer=N1, provision=SPEC)
    assert await store.set_last_clean_epoch(LOG, Epoch(0), Lsn(0)) == Status.INVALID_PARAM
    later_tail = compose_lsn(Epoch(4), Esn(1))
    assert await store.set_last_clean_epoch(LOG, Epoch(3), later_tail) == Status.INVALID_PARAM
    assert await store.get_metadata(LogId(-1)) == (Status.INVALID_PARAM, None)


async def test_epochs_run_out_with_toobig(store: CasEpochStore) -> None:
    near_end = LogMetadata(log_id=LOG, next_epoch=Epoch(EPOCH_MAX - 2), nodeset=SPEC.nodeset,
                           replication_factor=2, last_writer=None, version=1)
    assert await store.objects.write_metadata(LOG, near_end, expected_version=0) == Status.OK

    assert (await store.activate(LOG, writer=N1, provision=None))[:2] == (
        Status.OK, EPOCH_MAX - 2
    )
    status, epoch, meta = await store.activate(LOG, writer=N2, provision=None)
    assert (status, epoch) == (Status.OK, EPOCH_MAX - 1)
    for _ in range(2):
        assert await store.activate(LOG, writer=N1, provision=SPEC) == (Status.TOOBIG, 0, None)
    assert await store.get_metadata(LOG) == (Status.OK, meta)
    assert meta is not None and meta.next_epoch == EPOCH_MAX


async def test_concurrent_activations_hand_out_distinct_consecutive_epochs(
    store: CasEpochStore,
) -> None:
    logs = [LogId(100 + i) for i in range(5)]
    calls = [store.activate(log, writer=N1, provision=SPEC) for log in logs for _ in range(10)]
    results = await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    by_log: dict[LogId, list[int]] = {log: [] for log in logs}
    for (status, epoch, meta), log in zip(results, [lg for lg in logs for _ in range(10)],
                                          strict=True):
        assert status == Status.OK and meta is not None and meta.log_id == log
        by_log[log].append(epoch)
    for epochs in by_log.values():
        assert sorted(epochs) == list(range(1, 11))


async def test_handles_on_one_store_never_share_an_epoch(open_store: StoreOpener) -> None:
    handles = [open_store() for _ in range(3)]
    calls = [h.activate(LOG, writer=NodeId(f"n{i}"), provision=SPEC)
             for i, h in enumerate(handles) for _ in range(8)]
    results = await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    assert all(status == Status.OK for status, _, _ in results)
    assert sorted(epoch for _, epoch, _ in results) == list(range(1, 25))
    status, meta = await handles[0].get_metadata(LOG)
    assert status == Status.OK and meta is not None and meta.next_epoch == 25


async def test_a_stale_version_loses_the_compare_and_swap(store: CasEpochStore) -> None:
    _, _, meta = await store.activate(LOG, writer=N1, provision=SPEC)
    assert meta is not None
    stale = LogMetadata(log_id=LOG, next_epoch=Epoch(9), nodeset=meta.nodeset,
                        replication_factor=2, last_writer=N2, version=1)
    assert await store.objects.write_metadata(LOG, stale, expected_version=0) == Status.AGAIN
    lce = LastCleanEpoch(log_id=LOG, epoch=Epoch(1), tail_lsn=Lsn(0), version=2)
    assert await store.objects.write_lce(LOG, lce, expected_version=1) == Status.AGAIN
    assert await store.get_metadata(LOG) == (Status.OK, meta)


async def test_closed_store_answers_shutdown(store: CasEpochStore) -> None:
    await store.activate(LOG, writer=N1, provision=SPEC)
    await store.close()
    assert await store.activate(LOG, writer=N1, provision=SPEC) == (Status.SHUTDOWN, 0, None)
    assert await store.get_metadata(LOG) == (Status.SHUTDOWN, None)
    assert await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0)) == Status.SHUTDOWN


async def test_a_stale_handle_never_lowers_the_last_clean_epoch(open_store: StoreOpener) -> None:
    first, second = open_store(), open_store()
    await first.activate(LOG, writer=N1, provision=SPEC)
    # ``first`` has seen the LCE (a backend may remember it); ``second`` then moves it on.
    assert (await first.get_last_clean_epoch(LOG))[1] is not None
    assert await second.set_last_clean_epoch(LOG, Epoch(3), Lsn(0)) == Status.OK
    assert await first.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.STALE
    assert await first.set_last_clean_epoch(LOG, Epoch(4), Lsn(0)) == Status.OK
    lce = (await second.get_last_clean_epoch(LOG))[1]
    assert lce is not None and (lce.epoch, lce.version) == (4, 2)


async def test_thousands_of_clean_marks_at_once_all_land(store: CasEpochStore) -> None:
    """What a graceful stop with many active logs asks of the store, in one loop iteration."""
    logs = [LogId(1000 + i) for i in range(2000)]
    sem = asyncio.Semaphore(256)

    async def activate(log: LogId) -> None:
        async with sem:
            assert (await store.activate(log, writer=N1, provision=SPEC))[0] == Status.OK
            assert (await store.get_last_clean_epoch(log))[0] == Status.OK

    await asyncio.wait_for(asyncio.gather(*(activate(log) for log in logs)), timeout=60)
    statuses = await asyncio.wait_for(asyncio.gather(
        *(store.set_last_clean_epoch(log, Epoch(1), Lsn(0)) for log in logs)), timeout=60)
    assert statuses == [Status.OK] * len(logs)
    for log in logs[::97]:
        lce = (await store.get_last_clean_epoch(log))[1]
        assert lce is not None and lce.epoch == 1


async def test_a_nodeset_change_is_recorded_with_the_epoch_that_takes_it(
    open_store: StoreOpener,
) -> None:
    # Issue 17: an activation told that s2 is draining takes its epoch on the nodeset without
    # s2; the epochs before keep theirs; another handle (process) reads the same ranges.
    store = open_store()
    for _ in range(3):
        assert (await store.activate(LOG, writer=N1, provision=SPEC))[0] == Status.OK
    status, epoch, meta = await store.activate(LOG, writer=N2, provision=None,
                                               retired=frozenset({NodeId("s2")}))
    assert (status, epoch) == (Status.OK, 4) and meta is not None
    s1, _, s3 = SPEC.nodeset
    assert meta.nodeset == (s1, s3) and meta.nodeset_since == 4
    assert meta.earlier == (EpochNodeset(Epoch(1), SPEC.nodeset, 2),)
    # Later activations keep it (a retired node that is not a member changes nothing).
    status, epoch, again = await store.activate(LOG, writer=N1, provision=None,
                                                retired=frozenset({NodeId("s2")}))
    assert epoch == 5 and again is not None
    assert (again.nodeset, again.nodeset_since, again.earlier) == (
        meta.nodeset, meta.nodeset_since, meta.earlier)
    other = open_store()
    assert (await other.get_metadata(LOG)) == (Status.OK, again)
    # Fewer than R nodes would remain: the nodeset stays.
    status, _, kept = await other.activate(LOG, writer=N1, provision=None,
                                           retired=frozenset({s1}))
    assert status == Status.OK and kept is not None and kept.nodeset == (s1, s3)
    # A storage node added to the cluster: the nodeset wanted is larger, and the epoch taken
    # grows to it (the members stay, the new node joins); another handle reads the ranges.
    s4 = NodeId("s4")
    status, epoch, grown = await other.activate(
        LOG, writer=N2, provision=None,
        target=NodesetTarget(candidates=(s4, NodeId("s2"), s1, s3), size=3))
    assert status == Status.OK and grown is not None
    assert (grown.nodeset, grown.nodeset_since) == ((s1, s3, s4), epoch)
    assert grown.earlier[-1] == EpochNodeset(Epoch(4), (s1, s3), 2)
    assert (await store.get_metadata(LOG)) == (Status.OK, grown)
