"""What only the ZooKeeper backend has to get right, against a real server: the znode layout and
versions, provisioning in one transaction, writes whose reply is lost, a server that goes away
and comes back, and an expired session."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.exceptions import ConnectionLoss  # type: ignore[import-untyped]

from epoch_store import ZkOptions, ZooKeeperEpochStore, open_epoch_store, read_log_state
from epoch_store import zk_server as zks
from epoch_store.backends.zk_session import ZkSession
from epoch_store.zk_server import ServerHandle
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from tests.zk_support import start_standalone, unique_root

N1, N2 = NodeId("n1"), NodeId("n2")
SPEC = ProvisionSpec(nodeset=(NodeId("s1"), NodeId("s2")), replication_factor=2)
LOG = LogId(42)
FAST = ZkOptions(op_timeout_ms=1_500, session_timeout_ms=4_000)


@pytest.fixture
def root() -> str:
    return unique_root()


@pytest.fixture
async def store(zk_server_handle: ServerHandle, root: str) -> AsyncIterator[ZooKeeperEpochStore]:
    opened = ZooKeeperEpochStore(zk_server_handle.address, root)
    yield opened
    await opened.close()


def _kazoo(address: str) -> Any:
    client = KazooClient(hosts=address, timeout=5.0)
    client.start(timeout=10)
    return client


async def _znodes(address: str, *paths: str) -> list[tuple[bytes | None, int]]:
    def read() -> list[tuple[bytes | None, int]]:
        client = _kazoo(address)
        try:
            found = []
            for path in paths:
                stat = client.exists(path)
                found.append((client.get(path)[0], stat.version) if stat else (None, -1))
            return found
        finally:
            client.stop()
            client.close()

    return await asyncio.to_thread(read)


async def test_layout_and_versions_follow_logdevice(
    store: ZooKeeperEpochStore, zk_server_handle: ServerHandle, root: str
) -> None:
    base = f"{root}/logs/{LOG}"
    (base_node, seq, lce) = await _znodes(zk_server_handle.address, base, base + "/sequencer",
                                          base + "/lce")
    assert (base_node, seq, lce) == ((None, -1), (None, -1), (None, -1))
    for _ in range(3):
        assert (await store.activate(LOG, writer=N1, provision=SPEC))[0] == Status.OK
    assert await store.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.OK
    (base_node, seq, lce) = await _znodes(zk_server_handle.address, base, base + "/sequencer",
                                          base + "/lce")
    assert base_node == (b"", 0)
    assert seq[0] is not None and lce[0] is not None
    stored = json.loads(seq[0])
    # Created holding its first value, so the store's version 3 is stat.version 2.
    assert seq[1] == 2 and stored["version"] == 3 and stored["next_epoch"] == 4
    assert stored["last_writer"] == "n1" and len(stored["write_id"]) == 16
    # Created empty, set once: version 1 either way.
    assert lce[1] == 1 and json.loads(lce[0])["epoch"] == 2
    state = await asyncio.to_thread(
        read_log_state, f"zk://{zk_server_handle.address}{root}", LOG)
    assert state.status == Status.OK and state.metadata is not None
    assert state.metadata.next_epoch == 4 and state.last_clean_epoch is not None
    assert state.last_clean_epoch.epoch == 2


async def test_a_log_znode_left_without_children_is_completed(
    store: ZooKeeperEpochStore, zk_server_handle: ServerHandle, root: str
) -> None:
    client = _kazoo(zk_server_handle.address)
    try:
        client.ensure_path(f"{root}/logs/{LOG}")
    finally:
        client.stop()
        client.close()
    assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
    assert (await store.get_last_clean_epoch(LOG))[0] == Status.OK


def _fail_call(
    session: ZkSession, index: int, before_raise: Callable[[], Awaitable[None]] | None,
    *, send: bool,
) -> list[int]:
    """Make call number ``index`` of ``session`` lose its reply: optionally send it, optionally
    run ``before_raise``, then raise ConnectionLoss. Returns the call counter."""
    real_call = session.call
    count = [0]

    async def call(request: Any, deadline_s: float) -> Any:
        count[0] += 1
        if count[0] != index:
            return await real_call(request, deadline_s)
        if send:
            await real_call(request, deadline_s)
        if before_raise is not None:
            await before_raise()
        raise ConnectionLoss()

    session.call = call  # type: ignore[method-assign]
    return count


async def test_a_write_applied_but_unanswered_counts_once(store: ZooKeeperEpochStore) -> None:
    assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
    _fail_call(store.zk.session, 2, None, send=True)  # call 1 reads, call 2 sets
    status, epoch, meta = await store.activate(LOG, writer=N1, provision=None)
    assert (status, epoch) == (Status.OK, 2)
    assert store.zk.ambiguous_writes_count == 1 and store.cas_conflicts_count == 0
    assert await store.get_metadata(LOG) == (Status.OK, meta)


async def test_a_write_lost_before_it_was_applied_is_planned_again(
    store: ZooKeeperEpochStore,
) -> None:
    assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
    _fail_call(store.zk.session, 2, None, send=False)
    assert (await store.activate(LOG, writer=N1, provision=None))[:2] == (Status.OK, 2)
    assert store.zk.ambiguous_writes_count == 1 and store.cas_conflicts_count == 1


async def test_an_identical_write_by_another_writer_is_not_taken_for_ours(
    store: ZooKeeperEpochStore, zk_server_handle: ServerHandle, root: str
) -> None:
    """Both stores write as the same node with the same epoch, so the values differ only in
    their write ids: without them the lost write would look applied and epoch 2 would be
    handed out twice."""
    other = ZooKeeperEpochStore(zk_server_handle.address, root)
    try:
        assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
        taken: list[int] = []

        async def other_wins() -> None:
            status, epoch, _ = await other.activate(LOG, writer=N1, provision=None)
            assert status == Status.OK
            taken.append(epoch)

        _fail_call(store.zk.session, 2, other_wins, send=False)
        status, epoch, _ = await store.activate(LOG, writer=N1, provision=None)
    finally:
        await other.close()
    assert taken == [2]
    assert (status, epoch) == (Status.OK, 3)


async def test_a_provisioning_transaction_applied_but_unanswered_counts_once(
    store: ZooKeeperEpochStore,
) -> None:
    # Another log first, so that <root>/logs exists and the transaction succeeds at once.
    assert (await store.activate(LogId(1), writer=N1, provision=SPEC))[0] == Status.OK
    _fail_call(store.zk.session, 2, None, send=True)  # call 1 reads, call 2 is the transaction
    assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
    assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 2)


async def _until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_server_down_fails_fast_and_service_resumes(tmp_path: Path) -> None:
    server = start_standalone(tmp_path / "zk")
    store = ZooKeeperEpochStore(server.address, "/seqlog", options=FAST)
    try:
        assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
        await asyncio.to_thread(zks.stop, server, kill=True)
        ticks = [0]

        async def ticker() -> None:
            while True:
                await asyncio.sleep(0.01)
                ticks[0] += 1

        ticking = asyncio.create_task(ticker())
        started = time.monotonic()
        assert await store.activate(LOG, writer=N1, provision=SPEC) == (
            Status.CONNFAILED, 0, None)
        assert await store.get_metadata(LOG) == (Status.CONNFAILED, None)
        elapsed_s = time.monotonic() - started
        ticking.cancel()
        assert elapsed_s < 2 * FAST.op_timeout_ms / 1000 + 1
        # The loop kept running while the store waited for ZooKeeper.
        assert ticks[0] >= elapsed_s / 0.01 / 4, (ticks, elapsed_s)
        assert Status.CONNFAILED.retryable
        server = await asyncio.to_thread(start_standalone, tmp_path / "zk",
                                         client_port=server.client_port)

        async def activates() -> bool:
            status, epoch, _ = await store.activate(LOG, writer=N2, provision=None)
            assert status in (Status.OK, Status.CONNFAILED, Status.TIMEDOUT), status
            return status == Status.OK and epoch >= 2

        await _until(activates, 30, "an activation after the server came back")
        assert store.zk.session.connections_lost_count >= 1
    finally:
        await store.close()
        await asyncio.to_thread(zks.stop, server)


async def test_an_expired_session_is_replaced(
    store: ZooKeeperEpochStore, zk_server_handle: ServerHandle
) -> None:
    assert (await store.activate(LOG, writer=N1, provision=SPEC))[:2] == (Status.OK, 1)
    assert store.zk.session.client_id is not None
    session_id, password = store.zk.session.client_id

    def expire() -> None:
        # Closing a second connection on the same session ends the session on the server.
        twin = KazooClient(hosts=zk_server_handle.address, client_id=(session_id, password))
        twin.start(timeout=10)
        twin.stop()
        twin.close()

    await asyncio.to_thread(expire)
    await _until(lambda: _true(store.zk.session.connections_lost_count >= 1), 20,
                 "the client to notice the expiry")

    async def activates() -> bool:
        status, _, _ = await store.activate(LOG, writer=N1, provision=None)
        return status == Status.OK

    await _until(activates, 30, "an activation on a new session")
    assert store.zk.session.client_id is not None
    assert store.zk.session.client_id[0] != session_id
    status, meta = await store.get_metadata(LOG)
    assert status == Status.OK and meta is not None and meta.next_epoch >= 3


async def _true(value: bool) -> bool:
    return value


async def test_urls_open_zookeeper_stores() -> None:
    store = open_epoch_store("zk://127.0.0.1:1,127.0.0.1:2/a/b?op_timeout_ms=50")
    assert isinstance(store, ZooKeeperEpochStore)
    assert (store.zk.session.hosts, store.zk.root) == ("127.0.0.1:1,127.0.0.1:2", "/a/b")
    assert store.zk.session.options.op_timeout_ms == 50
    # Nothing listens on port 1: a clear retryable status within the operation timeout.
    assert await store.get_metadata(LOG) == (Status.CONNFAILED, None)
    await store.close()
    assert await store.get_metadata(LOG) == (Status.SHUTDOWN, None)
    for bad in ("zk://127.0.0.1:2181", "zk://127.0.0.1/x", "zk://h:1/zookeeper",
                "zk://h:1/a/../b", "zk://h:1/x?nope=1", "zk://h:1/x?op_timeout_ms=0",
                "zk://h:99999/x"):
        with pytest.raises(ValueError):
            open_epoch_store(bad)


async def test_writes_of_many_logs_share_transactions(store: ZooKeeperEpochStore) -> None:
    logs = [LogId(100 + i) for i in range(600)]
    results = await asyncio.gather(*(store.activate(log, writer=N1, provision=SPEC)
                                     for log in logs))
    assert all(r[:2] == (Status.OK, 1) for r in results)
    # Not one transaction per log: provisionings whose reads came back in the same loop
    # iteration share one (the reads trickle back, so batches are smaller than they could be).
    assert store.zk.transactions_count <= 150
    for log in logs:
        assert (await store.get_last_clean_epoch(log))[0] == Status.OK
    before = store.zk.transactions_count
    statuses = await asyncio.gather(*(store.set_last_clean_epoch(log, Epoch(1), Lsn(0))
                                      for log in logs))
    assert statuses == [Status.OK] * len(logs)
    assert store.zk.transactions_count - before <= 10


async def test_one_failing_write_does_not_fail_the_others_of_its_transaction(
    store: ZooKeeperEpochStore,
) -> None:
    logs = [LogId(200 + i) for i in range(10)]
    for log in logs:
        assert (await store.activate(log, writer=N1, provision=SPEC))[0] == Status.OK
    current = [(await store.get_metadata(log))[1] for log in logs]
    assert all(meta is not None for meta in current)
    before = store.zk.transactions_count
    # All ten in one loop iteration, so in one transaction; one expects a version that is
    # not stored, fails its check and rolls the others back, which go again.
    expected = [meta.version + (5 if i == 3 else 0) for i, meta in enumerate(current)
                if meta is not None]
    writes = [store.objects.write_metadata(
        log, replace(meta, next_epoch=Epoch(meta.next_epoch + 1), version=version + 1),
        expected_version=version)
        for log, meta, version in zip(logs, current, expected, strict=True) if meta is not None]
    statuses = await asyncio.gather(*writes)
    assert statuses == [Status.AGAIN if i == 3 else Status.OK for i in range(10)]
    assert store.zk.transactions_count - before == 2
    for i, log in enumerate(logs):
        meta = (await store.get_metadata(log))[1]
        assert meta is not None and meta.next_epoch == (2 if i == 3 else 3)
