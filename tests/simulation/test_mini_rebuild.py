"""Mini-rebuilding in the simulation (issue 17): a storage node that comes back having lost
its last writes, with the damage's scope known (per log, the LSN range its damaged segment
held), records a mini-rebuild of only that scope; the donors (the shipped ``DonorCore``)
walk only those ranges, the node is authoritative again, and every acknowledged record it
lost is on R disks (D1), while readers through any f-majority agree (R1, R2). Damage found
while a mini-rebuild runs restarts it over both scopes. The last test breaks the walk on
purpose and checks that D1 catches it."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from shared.cluster_state import DirtyRanges, ShardStatus, ranges_count
from shared.status import Status
from shared.types import Esn, Lsn, NodeId
from shared.wire.store import Store, payloads_checksum
from storage_node.core import rebuild
from tests.simulation.checkers import CheckFailed
from tests.simulation.runner import heal_and_check, run_simulation
from tests.simulation.sim_cluster import SimCluster
from tests.simulation.sim_options import SimOptions
from tests.simulation.test_disk_replacement import load, replicated_cluster
from tests.simulation.test_scenarios import append_and_wait, report, wait

N1 = NodeId("n1")


def _repaired(cluster: SimCluster, node_id: NodeId, minis: int = 1) -> bool:
    shard = cluster.rebuilding.state.shard(node_id)
    return (shard is not None and shard.status is ShardStatus.AUTHORITATIVE
            and shard.mini_rebuilds_count >= minis
            and node_id not in cluster.rebuilding.rebuilding())


def _repaired_seeing(cluster: SimCluster, node_id: NodeId, seen: dict[int, DirtyRanges],
                     minis: int = 1) -> Callable[[], bool]:
    """``_repaired``, noting each generation's recorded scope while it is rebuilt (the
    cluster state drops it when the rebuild finishes)."""
    def predicate() -> bool:
        shard = cluster.rebuilding.state.shard(node_id)
        if shard is not None and shard.status is ShardStatus.REBUILDING:
            seen[shard.rebuild_generation] = shard.dirty
        return _repaired(cluster, node_id, minis)
    return predicate


def _fill(cluster: SimCluster, count: int) -> None:
    appends = [append_and_wait(cluster, f"m:{i}".encode()) for i in range(count)]
    assert all(a.outcome == Status.OK for a in appends)


def test_a_damaged_node_is_mini_rebuilt_and_nothing_is_lost(
        request: pytest.FixtureRequest) -> None:
    cluster = replicated_cluster()
    with report(cluster, request):
        _fill(cluster, 60)
        held = len(cluster.storage[N1].disk.records)
        cluster.crash_storage(N1)
        cluster.restart_damaged(N1, lose_entries=4, repair=True)
        authority = cluster.storage[N1].disk.authority
        assert authority.damaged  # vouches for nothing until repaired
        scope = authority.damage_scope()
        assert scope, scope  # ranged: the lost copies' LSNs
        load(cluster, "during", 20)
        seen: dict[int, DirtyRanges] = {}
        wait(cluster, _repaired_seeing(cluster, N1, seen), "n1 mini-rebuilt")
        shard = cluster.rebuilding.state.shard(N1)
        assert shard is not None and seen == {1: scope} and shard.generation == 1
        # Finished: the ranges are dropped from the cluster state, their size kept.
        assert shard.dirty == () and shard.mini
        assert (shard.scope_logs, shard.scope_ranges) == (len(scope), ranges_count(scope))
        assert not authority.damaged
        # Only the damaged range was walked: each donor sent its copies in it, far fewer
        # than the shard holds.
        sent = sum(progress.records for _, progress in shard.donors)
        width = sum(hi - lo + 1 for _, ranges in scope for lo, hi in ranges)
        assert 0 < sent <= 2 * width and width <= 16, (sent, width)  # 4 copies lost of 60
        assert sent < held // 2, (sent, held)
        assert cluster.stats["rebuild_mini_finished"] == 1
        heal_and_check(cluster)  # C1-C5, R1, D1 (at the rebuild's end and at the end), L1, L2
        assert cluster.checker.rebuilt_checked_count == 1


def test_damage_found_during_a_mini_rebuild_rebuilds_both_ranges(
        request: pytest.FixtureRequest) -> None:
    """A second damage while the first mini-rebuild runs (slowly: a rate limit): the rebuild
    begins again for a new generation over both scopes, and both are repaired."""
    cluster = replicated_cluster(rebuild_rate_bytes_per_s=200)
    with report(cluster, request):
        _fill(cluster, 40)
        cluster.crash_storage(N1)
        cluster.restart_damaged(N1, lose_entries=6, repair=True)
        first = cluster.storage[N1].disk.authority.damage_scope()

        def mini_under_way() -> bool:
            shard = cluster.rebuilding.state.shard(N1)
            return shard is not None and shard.status is ShardStatus.REBUILDING and shard.mini

        wait(cluster, mini_under_way, "n1's mini-rebuild recorded")
        _fill_more = [cluster.append(cluster.log_ids[0], (f"x:{i}".encode(),))
                      for i in range(10)]
        cluster.run_for(300)
        del _fill_more
        cluster.crash_storage(N1)
        cluster.restart_damaged(N1, lose_entries=8, repair=True)
        seen: dict[int, DirtyRanges] = {}
        wait(cluster, _repaired_seeing(cluster, N1, seen, minis=2), "n1 mini-rebuilt again")
        shard = cluster.rebuilding.state.shard(N1)
        assert shard is not None and shard.generation == 2  # begun again: a new generation
        assert first is not None
        for log_id, ranges in first:  # the first damage's ranges are still covered
            covered = dict(seen[2]).get(log_id, ())
            assert all(any(a <= lo and hi <= b for a, b in covered) for lo, hi in ranges)
        assert cluster.stats["rebuild_begun_again"] == 1
        heal_and_check(cluster)


def test_generated_runs_repair_damage_by_mini_rebuilds() -> None:
    """Generated runs (their faults, workload and checkers) with damaged restarts made
    likely and always ranged: they mini-rebuild, and every checker passes."""
    repaired = 0
    for seed in range(1, 30):
        options = dataclasses.replace(
            SimOptions.generate(random.Random(seed)), damage_ratio=0.7,
            damage_repair_ratio=1.0, storage_crash_ratio=0.03, storage_down_ms_max=200)
        result = run_simulation(seed, options=options)
        repaired += result.stats.get("rebuild_mini_finished", 0)
        if repaired >= 3:
            return
    raise AssertionError(f"only {repaired} mini-rebuilds in the generated runs")


def test_a_walk_that_skips_the_damaged_ranges_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Donors told the ranges walk nothing of them: the node vouches again without its lost
    copies, and D1 says so."""
    original = rebuild.DonorCore.__init__

    def init(self: rebuild.DonorCore, **kwargs: Any) -> None:
        if kwargs.get("dirty"):
            # Shifted past everything: the walk reads no copy of the damaged ranges.
            kwargs["dirty"] = tuple((log_id, ((2**62, 2**62),)) for log_id, _ in kwargs["dirty"])
        original(self, **kwargs)

    monkeypatch.setattr(rebuild.DonorCore, "__init__", init)
    cluster = replicated_cluster()
    _fill(cluster, 60)
    cluster.crash_storage(N1)
    cluster.restart_damaged(N1, lose_entries=8, repair=True)
    with pytest.raises(CheckFailed) as caught:
        wait(cluster, lambda: _repaired(cluster, N1), "n1 mini-rebuilt")
        heal_and_check(cluster)
    assert caught.value.checker == "D1", caught.value


def test_a_lost_later_wave_is_restored_over_the_older_copy(
        request: pytest.FixtureRequest) -> None:
    """n1's newest write of an LSN (a later wave, written by every holder) is what its
    damage loses, so its disk resolves the LSN to the older wave again; the mini-rebuild's
    donor copy of the later wave replaces it (the node reads the precedence of the copy it
    holds where a donor's could outrank it: ``storage_node.core.rebuild_accept``)."""
    cluster = replicated_cluster()
    with report(cluster, request):
        _fill(cluster, 20)
        disk = cluster.storage[N1].disk
        key = max(disk.records)
        older = disk.records[key]
        holders = [node for node in cluster.storage.values() if key in node.disk.records]
        assert len(holders) >= 2, holders
        later = Store(log_id=key[0], lsn=key[1], wave=older.wave + 1,
                      sequencer_node=older.sequencer_node, copyset=(), timestamp_ms=0,
                      last_known_good=Esn(older.last_known_good), release_lsn=Lsn(0),
                      timeout_ms=1000, key=None, payloads=(older.payload,),
                      checksum=payloads_checksum((older.payload,)))
        written: list[Status] = []
        for node in holders:
            node.submit_store(later, written.append)
        wait(cluster, lambda: len(written) == len(holders), "the later wave written")
        assert disk.records[key].wave == older.wave + 1
        cluster.crash_storage(N1)
        cluster.restart_damaged(N1, lose_entries=1, repair=True)  # the later wave's write
        assert cluster.storage[N1].disk.records[key] == older
        wait(cluster, lambda: _repaired(cluster, N1), "n1 mini-rebuilt")
        assert cluster.storage[N1].disk.records[key].wave == older.wave + 1
        stats = cluster.rebuilding.runtimes[N1].stats
        assert stats.precedence_reads >= 1 and stats.copies_outranked >= 1
        heal_and_check(cluster)


def test_a_lost_wave_no_other_disk_holds_is_not_demanded(
        request: pytest.FixtureRequest) -> None:
    """As above, but the later wave reached n1 alone (a recovery's re-replication cut
    short): no donor holds it, so the mini-rebuild cannot restore it, and n1 keeps the older
    copy, the best the cluster has; D2 asks only for what some other disk could give."""
    cluster = replicated_cluster()
    with report(cluster, request):
        _fill(cluster, 20)
        node = cluster.storage[N1]
        key = max(node.disk.records)
        older = node.disk.records[key]
        later = Store(log_id=key[0], lsn=key[1], wave=older.wave + 1,
                      sequencer_node=older.sequencer_node, copyset=(), timestamp_ms=0,
                      last_known_good=Esn(older.last_known_good), release_lsn=Lsn(0),
                      timeout_ms=1000, key=None, payloads=(older.payload,),
                      checksum=payloads_checksum((older.payload,)))
        written: list[Status] = []
        node.submit_store(later, written.append)
        wait(cluster, lambda: len(written) == 1, "the later wave written on n1 alone")
        cluster.crash_storage(N1)
        cluster.restart_damaged(N1, lose_entries=1, repair=True)  # the later wave's write
        assert cluster.storage[N1].disk.records[key] == older
        wait(cluster, lambda: _repaired(cluster, N1), "n1 mini-rebuilt")
        assert cluster.storage[N1].disk.records[key] == older
        heal_and_check(cluster)
