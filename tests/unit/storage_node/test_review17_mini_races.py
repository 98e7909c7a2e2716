"""Review of mini17 (issue 17 mini-rebuilding): races that let a node vouch for a damaged
range that no mini-rebuild covered. These tests FAIL on main at ab769d1 (they show bugs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from epoch_store.cluster_state import MemoryClusterState
from shared import cluster_state as cs
from shared.cluster_state import ClusterState, DonorProgress, ShardStatus
from shared.status import Status
from shared.types import LogId
from storage_node.rebuild_runtime import RebuildRuntime, _Donation
from tests.unit.storage_node.helpers import one_node_rebuild_runtime, running_node, storage_config

L1, L2, L3 = LogId(1), LogId(2), LogId(3)


class _FlakyStore(MemoryClusterState):
    """Reads work; writes fail while ``down`` (an epoch store briefly unavailable)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def write(self, state: ClusterState, *, expected_version: int) -> Status:
        if self.down:
            return Status.CONNFAILED
        return await super().write(state, expected_version=expected_version)


async def test_damage_found_while_a_restarted_mini_rebuild_is_not_yet_recorded_is_repaired(
        tmp_path: Path) -> None:
    """A mini-rebuild (log 3) begins again for damage on log 1; recording it fails once (the
    epoch store is unavailable); a read then finds log 2's copy damaged. The retry records
    the old scope only (``_lost_dirty``) but counts log 2's damage as covered
    (``_record_shard`` takes ``damage_found`` now): once the donors are done, ``_finish``
    clears everything and the node vouches for log 2's damaged range, never rebuilt."""
    store = _FlakyStore()
    assert (await cs.change(store, cs.registered("n1", 1, 0)))[0] is Status.OK
    data_dir = str(tmp_path / "n1")
    async with running_node(data_dir, storage_config()) as node:
        runtime = one_node_rebuild_runtime(node, data_dir, store)
        authority = node.store.authority
        try:
            assert authority.range_damaged(L3, 10, 20)
            await runtime.poll_once()  # START: a mini-rebuild of log 3, generation 1
            assert authority.range_damaged(L1, 5, 5)
            store.down = True
            await runtime.poll_once()  # RESTART: generation 2 not recorded
            store.down = False
            assert authority.range_damaged(L2, 7, 7)  # found before the retry
            await runtime.poll_once()  # the retry records generation 2
            shard = store.state.shard("n1")
            assert shard is not None and shard.status is ShardStatus.REBUILDING
            assert shard.rebuild_generation == 2
            assert authority.damage_covered == authority.damage_found
            # (fix17) Counted as repaired <=> in the scope the donors walk: log 2's LSN 7 is.
            assert any(log_id == 2 and lo <= 7 <= hi for log_id, ranges in shard.dirty
                       for lo, hi in ranges), (f"log 2 LSN 7 counted as repaired, never "
                                               f"walked (the scope: {shard.dirty})")
            # The only donor walks the recorded scope (logs 1 to 3) and is done.
            assert (await cs.change(store, cs.donor_progressed(
                "n1", 2, "n2", DonorProgress(3, 21, done=True))))[0] is Status.OK
            await runtime.poll_once()
            shard = store.state.shard("n1")
            assert shard is not None and shard.status is ShardStatus.AUTHORITATIVE
            assert not authority.damaged
        finally:
            await runtime.close()


class _LandsButFails(MemoryClusterState):
    """A write that is applied but answered as failed while ``lying`` (a ZooKeeper
    connection lost after the write went through)."""

    def __init__(self) -> None:
        super().__init__()
        self.lying = False

    async def write(self, state: ClusterState, *, expected_version: int) -> Status:
        status = await super().write(state, expected_version=expected_version)
        return Status.CONNFAILED if self.lying and status is Status.OK else status


async def test_damage_found_after_a_restarted_mini_rebuild_landed_unseen_restarts_it(
        tmp_path: Path) -> None:
    """(fix17) The RESTART's record lands but is reported failed; damage found before the
    retry is not in the landed scope (its donors may have begun): the retry must not count
    it as repaired, so the rebuild begins again over it."""
    store = _LandsButFails()
    assert (await cs.change(store, cs.registered("n1", 1, 0)))[0] is Status.OK
    data_dir = str(tmp_path / "n1")
    async with running_node(data_dir, storage_config()) as node:
        runtime = one_node_rebuild_runtime(node, data_dir, store)
        authority = node.store.authority
        try:
            assert authority.range_damaged(L3, 10, 20)
            await runtime.poll_once()  # START, generation 1
            assert authority.range_damaged(L1, 5, 5)
            store.lying = True
            await runtime.poll_once()  # RESTART: generation 2 recorded, reported failed
            store.lying = False
            shard = store.state.shard("n1")
            assert shard is not None and shard.rebuild_generation == 2
            assert authority.range_damaged(L2, 7, 7)  # found before the retry
            await runtime.poll_once()  # the retry: a no-op; then RESTART again
            assert authority.damage_covered == authority.damage_found
            shard = store.state.shard("n1")
            assert shard is not None and shard.status is ShardStatus.REBUILDING
            assert shard.rebuild_generation == 3
            assert any(log_id == 2 and lo <= 7 <= hi for log_id, ranges in shard.dirty
                       for lo, hi in ranges), shard.dirty
        finally:
            await runtime.close()


async def test_a_donation_of_an_earlier_mini_rebuild_does_not_serve_the_next(
        tmp_path: Path) -> None:
    """Mini-rebuilds of one disk reuse its generation. A donor whose donation of the
    earlier one (scope log 1) is still running (e.g. restarted from a stale poll read, or a
    Finished write retried) keeps it for the next one (scope log 2): ``_run_donations``
    compares generations only, and ``donor_progressed`` lets its Finished mark the donor
    done for the later rebuild, whose log 2 it never walked."""
    store = MemoryClusterState()
    d1 = ((1, ((1, 50),)),)
    d2 = ((2, ((1, 50),)),)
    for transition in (cs.registered("n1", 1, 0), cs.registered("n2", 1, 0),
                       cs.rebuild_started("n1", 1, ("n2",), now_ms=1, reason="r",
                                          requested_by="n1", dirty=d1),
                       cs.donor_progressed("n1", 1, "n2", DonorProgress(1, 51, done=True)),
                       cs.rebuild_finished("n1", 1, 2),
                       cs.rebuild_started("n1", 1, ("n2",), now_ms=3, reason="r",
                                          requested_by="n1", dirty=d2)):
        assert (await cs.change(store, transition))[0] is Status.OK
    # (a) the cluster state: the earlier walk's Finished is taken for the later rebuild.
    # (fix17) The earlier walk's donation names its rebuild (the first: id 1).
    assert store.state.shard("n1").rebuild_id == 2  # type: ignore[union-attr]
    stale = cs.donor_progressed("n1", 1, "n2", DonorProgress(1, 51, 5, 500, 500, True, 4),
                                rebuild_id=1)
    after = stale(store.state)
    assert after is None or not after.shard("n1").donors_done, (  # type: ignore[union-attr]
        "a donation of the earlier mini-rebuild finished the later one")
    fresh = cs.donor_progressed("n1", 1, "n2", DonorProgress(2, 51, 5, 500, 500, True, 4),
                                rebuild_id=2)(store.state)
    assert fresh is not None and fresh.shard("n1").donors_done  # type: ignore[union-attr]
    # (b) the donor's driver: a running donation of the earlier one is kept for the later.
    data_dir = str(tmp_path / "n2")
    async with running_node(data_dir, storage_config(), node_id="n2") as node:
        runtime = RebuildRuntime(node=node, data_dir=data_dir, cluster_name="c",
                                 state_store=store, storage_nodes=lambda: ("n1", "n2"),
                                 request=lambda *_: None)
        old = asyncio.get_running_loop().create_task(asyncio.sleep(60))
        runtime._donations["n1"] = _Donation("n1", 1, task=old, dirty=d1)
        try:
            runtime._run_donations(store.state)
            assert runtime._donations["n1"].dirty == d2
        finally:
            old.cancel()
            await runtime.close()
