"""Disk replacement and rebuilding in the simulation (issue 17, done-when 3): a storage node
that comes back on a new, empty disk vouches for nothing, is rebuilt by the others with the
shipped donor core (``storage_node.core.rebuild``) and REBUILD_STORE handler, and is then
authoritative again; with at most R - 1 copies lost between rebuilds no acknowledged record
is lost (D1) and readers through any f-majority agree at every moment (R1, R2). The last
tests break the rebuild on purpose and check that the checkers catch it."""

from __future__ import annotations

from typing import Any

import pytest

from shared.cluster_state import ShardStatus
from shared.status import Status
from shared.types import NodeId
from storage_node.core import rebuild
from tests.simulation.runner import SimulationFailure, heal_and_check, schedule_checks
from tests.simulation.sim_cluster import SimCluster
from tests.simulation.test_scenarios import S1, S2, append_and_wait, make_cluster, report, wait

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def rebuilt(cluster: SimCluster, node_id: NodeId) -> bool:
    shard = cluster.rebuilding.state.shard(node_id)
    return (shard is not None and shard.status is ShardStatus.AUTHORITATIVE
            and shard.rebuilds_count > 0 and node_id not in cluster.rebuilding.rebuilding())


def load(cluster: SimCluster, prefix: str, count: int, **kwargs: Any) -> None:
    """``count`` appends issued 5 ms apart (they run while the caller waits)."""
    for i in range(count):
        cluster.queue.after(5 * i, lambda i=i: cluster.append(
            cluster.log_ids[0], (f"{prefix}:{i}".encode(),), **kwargs))


def replicated_cluster(**overrides: Any) -> SimCluster:
    options: dict[str, Any] = {"storage_nodes_count": 3, "replication": 2,
                               "rebuild_chunk_bytes_max": 64, "rebuild_rate_bytes_per_s": 2_000}
    options.update(overrides)
    cluster = make_cluster(**options)
    schedule_checks(cluster)  # R2 and T1 along the way
    return cluster


def test_a_replaced_disk_is_rebuilt_under_load_and_nothing_is_lost(
        request: pytest.FixtureRequest) -> None:
    cluster = replicated_cluster()
    with report(cluster, request):
        before = [append_and_wait(cluster, f"b:{i}".encode()) for i in range(30)]
        assert all(a.outcome == Status.OK for a in before)
        held = {key for key in cluster.storage[N1].disk.records}
        assert held
        cluster.replace_disk(N1, down_ms=100)
        assert not cluster.storage[N1].disk.records
        load(cluster, "during", 60)
        pending = cluster.rebuilding.replaced_pending
        wait(cluster, lambda: cluster.storage[N1].up and N1 not in pending, "n1 back")
        assert cluster.storage[N1].disk.authority.damaged  # vouches for nothing yet
        shard = cluster.rebuilding.state.shard(N1)
        assert shard is not None and shard.status is ShardStatus.REBUILDING
        assert not cluster.may_replace_disk(N2)  # one at a time
        wait(cluster, lambda: rebuilt(cluster, N1), "n1 rebuilt")
        assert not cluster.storage[N1].disk.authority.damaged
        # Every copy the old disk held is back (the donors send every copy they hold).
        assert held <= set(cluster.storage[N1].disk.records)
        assert cluster.stats["rebuild_chunks"] > 1  # small chunks under a rate limit
        heal_and_check(cluster)  # C1-C5, R1, D1, L1, L2
        assert cluster.checker.rebuilt_checked_count == 1


def test_a_second_disk_replaced_after_the_first_rebuild_loses_nothing(
        request: pytest.FixtureRequest) -> None:
    """R=2: two replacements would lose everything the two nodes shared, had the first not
    been rebuilt in between (issue 17's report)."""
    cluster = replicated_cluster()
    with report(cluster, request):
        first = [append_and_wait(cluster, f"a:{i}".encode()) for i in range(30)]
        assert all(a.outcome == Status.OK for a in first)
        cluster.replace_disk(N1, down_ms=50)
        load(cluster, "x", 30)
        wait(cluster, lambda: rebuilt(cluster, N1), "n1 rebuilt")
        cluster.replace_disk(N2, down_ms=50)
        load(cluster, "y", 30)
        wait(cluster, lambda: rebuilt(cluster, N2), "n2 rebuilt")
        heal_and_check(cluster)
        assert cluster.checker.rebuilt_checked_count == 2


def test_only_one_disk_is_replaced_at_a_time() -> None:
    cluster = replicated_cluster(storage_nodes_count=5, replication=3)
    assert cluster.may_replace_disk(N1)
    cluster.replace_disk(N1)
    assert not cluster.may_replace_disk(N2)  # n1's rebuild has not finished
    r1 = replicated_cluster(replication=1)
    assert not r1.may_replace_disk(N1)  # R=1: any loss loses acknowledged records


def test_a_disk_replaced_while_the_sequencer_dies_recovers_over_the_empty_node(
        request: pytest.FixtureRequest) -> None:
    """Epoch recovery runs while n1 vouches for nothing: it must not take n1's empty answers
    for absence (nothing acknowledged is plugged: C5, R1)."""
    cluster = replicated_cluster(sequencer_nodes_count=2, window_appends_max=32)
    with report(cluster, request):
        assert append_and_wait(cluster, b"w", via=S1).outcome == Status.OK
        flight = [cluster.append(cluster.log_ids[0], (f"f:{i}".encode(),), via=S1)
                  for i in range(20)]
        cluster.run_for(3)
        cluster.crash_sequencer(S1)
        cluster.replace_disk(N1, down_ms=10)
        cluster.failover(cluster.log_ids[0], S2)
        after = append_and_wait(cluster, b"after", via=S2)
        assert after.outcome == Status.OK
        wait(cluster, lambda: rebuilt(cluster, N1), "n1 rebuilt")
        del flight
        heal_and_check(cluster)


# ---- the checkers have teeth -------------------------------------------------------------

def _first_failure(seeds: range) -> SimulationFailure:
    from tests.simulation.runner import run_simulation
    for seed in seeds:
        try:
            result = run_simulation(seed)
        except SimulationFailure as failure:
            if failure.checker not in ("L1", "L2"):
                return failure
        else:
            del result
    raise AssertionError(f"no seed of {seeds} caught the broken rebuild")


def test_donors_that_send_nothing_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Donors walk but send no copy: the replaced node becomes authoritative without them."""
    original = rebuild.DonorCore.on_read

    def on_read(self: rebuild.DonorCore, pieces: list[rebuild.Piece], next_lsn: int,
                now_ms: int) -> None:
        original(self, [], next_lsn, now_ms)

    monkeypatch.setattr(rebuild.DonorCore, "on_read", on_read)
    failure = _first_failure(range(1, 60))
    assert failure.checker == "D1", failure


def test_a_replaced_node_trusted_at_once_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replaced node vouches for its empty disk (issue 17's report: trusted as if it had
    all its data): readers through it see gaps where records are."""
    from tests.simulation import sim_storage

    original = sim_storage.SimStorageNode.replace_disk

    def replace_disk(self: sim_storage.SimStorageNode) -> Any:
        lost = original(self)
        self.disk.authority.clear(None, 1, 2**63 - 1)
        return lost

    monkeypatch.setattr(sim_storage.SimStorageNode, "replace_disk", replace_disk)
    failure = _first_failure(range(1, 60))
    assert failure.checker in ("R2", "R1"), failure


# ---- defects the simulation found (fixed) ------------------------------------------------

def test_an_amend_from_a_disk_replaced_since_does_not_count(
        request: pytest.FixtureRequest) -> None:
    """Soak seed 80's defect, scripted. R=2 on n1..n3; n3 is cut off (its STORE hangs), so
    wave 1 of an append gets STORED only from X, then times out. X's disk is replaced before
    wave 2. Wave 2 counts X's wave-1 STORED as an amend (``Appender``: "a node that answered
    STORED OK in an earlier wave holds a durable copy") and sends the payload to one other
    node only: the append is acknowledged with one real copy. The donors' walks must still
    restore the other: each plans its walk by the log's sequencer tail and waits for it to be
    released (``storage_node.core.rebuild``), so the append is decided, and its copy on the
    other node durable, before that node walks past it. (The same happens when the STORED
    counted is the current wave's: soak seed 4323; ``test_seeds.STALE_STORED_SEEDS``.)"""
    cluster = replicated_cluster(partition_connfail_ratio=0.0, store_timeout_ms_min=50,
                                 store_timeout_ms_max=50)
    with report(cluster, request):
        assert append_and_wait(cluster, b"warm").outcome == Status.OK
        cluster.partition([S1], [N3], 5_000)
        append = None
        for i in range(20):  # until wave 1's copyset holds n3 (random)
            candidate = cluster.append(cluster.log_ids[0], (f"p:{i}".encode(),))
            cluster.run_for(8)
            appender = next(iter(cluster.sequencers[S1].cores[candidate.log_id]
                                 .sequencer.appenders.values()), None)
            if appender is not None and N3 in appender.recipients and appender.stored_nodes:
                append = candidate
                stored = next(iter(appender.stored_nodes))
                break
            wait(cluster, lambda c=candidate: c.outcome is not None, "an append's answer")
        assert append is not None, "wave 1 never picked n3"
        assert appender.wave == 1
        cluster.replace_disk(stored, down_ms=20)
        wait(cluster, lambda: append.outcome is not None, "the append's answer")
        assert append.outcome == Status.OK, append.outcome
        copies = [n for n, node in cluster.storage.items()
                  if (append.log_id, append.first_lsn) in node.disk.records]
        assert len(copies) == 1, copies  # acknowledged with one real copy (the defect's start)
        wait(cluster, lambda: rebuilt(cluster, stored), "the replaced node rebuilt")
        copies = [n for n, node in cluster.storage.items()
                  if (append.log_id, append.first_lsn) in node.disk.records]
        assert len(copies) >= 2, f"acknowledged with copies on {copies} only"
        heal_and_check(cluster)


def test_copies_a_rebuilding_node_loses_to_damage_are_not_vouched_for(
        request: pytest.FixtureRequest) -> None:
    """n1's disk is replaced and rebuilt; mid-way it restarts and its scan finds the tail of
    what it wrote damaged (copies the donors already sent and checkpointed). Had the rebuild
    just finished, ``RebuildRuntime._finish`` would clear everything
    (``AuthorityStatus.clear``) and n1 would vouch for copies it lost (readers through n1 and
    a node without them would read a gap where others read the record). The damage found is
    counted durably (``AuthorityStatus.damage_found``) and, found after the rebuild began,
    makes it begin again for a new generation (``storage_node.core.rebuild.target_step``):
    every donor walks from the start. (The simulation keeps this out of its generated mix:
    ``SimCluster.restart_storage`` never damages a node being rebuilt.)"""
    cluster = replicated_cluster(rebuild_rate_bytes_per_s=300, rebuild_chunk_bytes_max=64)
    with report(cluster, request):
        first = [append_and_wait(cluster, f"r:{i}".encode()) for i in range(40)]
        assert all(a.outcome == Status.OK for a in first)
        cluster.replace_disk(N1, down_ms=10)
        wait(cluster, lambda: len(cluster.storage[N1].disk.records) >= 10, "some copies back")
        cluster.crash_storage(N1)
        cluster.storage[N1].restart(lose_entries=8)  # a torn tail of rebuilt copies
        cluster.rebuilding.on_restart(N1)
        wait(cluster, lambda: rebuilt(cluster, N1), "n1 rebuilt")
        heal_and_check(cluster)
        # Every copy the donors hold is back on n1, the lost tail included.
        for node_id in (N2, N3):
            for key in cluster.storage[node_id].disk.records:
                assert key in cluster.storage[N1].disk.records, key
        assert cluster.stats["rebuild_begun_again"] == 1
        shard = cluster.rebuilding.state.shard(N1)
        assert shard is not None and shard.generation == 3  # replaced (2), begun again (3)
