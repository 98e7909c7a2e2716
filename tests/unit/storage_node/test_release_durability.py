"""A release pointer that arrives alone (a RELEASE, no STORE after it) is written within
``RELEASE_FLUSH_INTERVAL_MS`` and fsynced with the next batch or ``RELEASE_SYNC_DELAY_MS``
later, and a node reports (GET_LOG_STATE) only the fsynced pointer, so what it reported never
goes backwards after a crash, power loss included (issue 16 item 8). Before, a pointer that
came alone was not even written until the next STORE."""

from __future__ import annotations

from pathlib import Path

from shared.types import NodeId
from shared.wire.release import Release
from tests.unit.storage_node.helpers import (
    LOG,
    assert_ok,
    log_state,
    lsn,
    make_store,
    running_node,
    store,
    wait_until,
)


async def test_a_release_alone_is_written_fsynced_and_reported_only_then(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert_ok([await store(node, make_store(lsn(1, 1)))])
        assert_ok([await store(node, make_store(lsn(1, 2), release_lsn=lsn(1, 1)))])
        # The writer goes idle with nothing left to do (no timer armed).
        await wait_until(lambda: node.store._idle.is_set() and not node.store._releases)
        assert (await log_state(node)).release_lsn == lsn(1, 1)
        fsyncs = node.stats()["fsyncs"]
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 2)),
                        lambda _: None)
        # Known (reads may use it) but not yet on disk: not reported as the node's pointer.
        assert node.log_state(LOG).release_lsn == lsn(1, 2)
        assert (await log_state(node)).release_lsn == lsn(1, 1)
        await wait_until(lambda: node.store.durable_release_lsn(LOG) == lsn(1, 2), 2.0)
        assert node.stats()["fsyncs"] > fsyncs, "a batch of release pointers alone is fsynced"
        assert (await log_state(node)).release_lsn == lsn(1, 2)
        # Written but not yet fsynced: still the older pointer; a STORE batch's fsync covers
        # it (no fsync of its own).
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 3)),
                        lambda _: None)
        await wait_until(lambda: not node.store._releases, 2.0)
        fsyncs = node.stats()["fsyncs"]
        if node.store._unsynced_releases:
            assert (await log_state(node)).release_lsn == lsn(1, 2)
            assert_ok([await store(node, make_store(lsn(1, 3)))])
            assert node.stats()["fsyncs"] == fsyncs + 1
        assert (await log_state(node)).release_lsn == lsn(1, 3)
    async with running_node(data_dir) as node:
        assert (await log_state(node)).release_lsn == lsn(1, 3)
