"""Failover scenarios for epoch recovery (issue 5): each scripts a fault around a sequencer,
asserts what recovery must decide, then heals and runs every checker (C1-C5, R1: every
f-majority reads the same log with every acknowledged record; L1, L2)."""

from __future__ import annotations

import pytest

from sequencer.core.recovery import Phase
from sequencer.core.sequencer import Sequencer, SequencerState
from shared.read_merge import merge
from shared.status import Status
from shared.types import Lsn, NodeId, lsn_to_epoch
from shared.wire.read import GetLogState
from shared.wire.store import RecordFlags
from tests.simulation.checkers import disk_answer
from tests.simulation.runner import heal_and_check
from tests.simulation.sim_client import ClientAppend
from tests.simulation.sim_cluster import SimCluster
from tests.simulation.test_scenarios import (
    LOG,
    S1,
    S2,
    append_and_wait,
    make_cluster,
    report,
    wait,
)

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def core_of(cluster: SimCluster, node: NodeId) -> Sequencer:
    return cluster.sequencers[node].cores[LOG].sequencer


def acked(appends: list[ClientAppend]) -> list[ClientAppend]:
    return [a for a in appends if a.outcome == Status.OK]


def test_sequencer_killed_with_appends_in_flight(request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=4, replication=2,
                           window_appends_max=64, delay_ms_max=8)
    with report(cluster, request):
        assert append_and_wait(cluster, b"warm", via=S1).outcome == Status.OK
        flight = [cluster.append(LOG, (f"f:{i}".encode(),), via=S1) for i in range(40)]
        cluster.run_for(6)  # some STOREs landed, some acked, most in flight
        cluster.crash_sequencer(S1)
        after = append_and_wait(cluster, b"after", via=S2)
        assert after.outcome == Status.OK and lsn_to_epoch(after.first_lsn) == 2
        successor = core_of(cluster, S2)
        wait(cluster, lambda: successor.release_lsn >= after.last_lsn, "recovery and release")
        assert cluster.epoch_store.clean_epoch(LOG) == 1
        assert cluster.stats["recovery_mutating"] >= 1
        assert all(a.outcome is not None for a in flight)
        heal_and_check(cluster)


def test_zombie_sequencer_resumed_after_failover_never_acks_in_its_sealed_epoch(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=2,
                           partition_connfail_ratio=0.0)
    with report(cluster, request):
        assert append_and_wait(cluster, b"z:0", via=S1).outcome == Status.OK
        # s1 is cut off from n2 and n3 (a pause, as far as they can tell): its appends land on
        # n1 at most and stay in flight.
        cluster.partition([S1], [N2, N3], 3_000)
        zombie = [cluster.append(LOG, (f"z:{i}".encode(),), via=S1) for i in range(1, 6)]
        cluster.run_for(30)
        # The failure detector moved the log to s2: new epoch, recovery seals epoch 1.
        cluster.failover(LOG, S2)
        after = append_and_wait(cluster, b"s2:0", via=S2)
        assert after.outcome == Status.OK
        wait(cluster, lambda: core_of(cluster, S2).release_lsn >= after.last_lsn, "release")
        # The partition heals: the zombie's waves now reach sealed nodes and end preempted.
        wait(cluster, lambda: all(a.outcome is not None for a in zombie), "zombie answers")
        assert [a.outcome for a in zombie] == [Status.TIMEDOUT] * 5
        assert core_of(cluster, S1).state is SequencerState.PREEMPTED
        heal_and_check(cluster)


def test_sequencer_and_a_copyset_storage_node_killed_together(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=4, replication=2,
                           window_appends_max=32)
    with report(cluster, request):
        first = [append_and_wait(cluster, f"k:{i}".encode(), via=S1) for i in range(10)]
        flight = [cluster.append(LOG, (f"kf:{i}".encode(),), via=S1) for i in range(20)]
        cluster.run_for(4)
        cluster.crash_sequencer(S1)
        cluster.crash_storage(N1)  # holds copies of epoch 1; recovery goes on without it
        after = append_and_wait(cluster, b"k:after", via=S2)
        assert after.outcome == Status.OK
        wait(cluster, lambda: core_of(cluster, S2).release_lsn >= after.last_lsn,
             "recovery without n1")
        assert all(a.outcome == Status.OK for a in first)
        del flight
        heal_and_check(cluster)  # n1 comes back with its stray copies: readers agree (R1)


def test_recovery_crashing_midway_is_redone_by_the_next_sequencer(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=2,
                           window_appends_max=32)
    with report(cluster, request):
        [append_and_wait(cluster, f"c:{i}".encode(), via=S1) for i in range(5)]
        [cluster.append(LOG, (f"cf:{i}".encode(),), via=S1) for i in range(15)]
        cluster.run_for(4)
        cluster.crash_sequencer(S1)
        second = cluster.append(LOG, (b"c:s2",), via=S2)
        # Crash s2 once its recovery has sealed and started writing.
        wait(cluster, lambda: LOG in cluster.sequencers[S2].cores
             and (r := core_of(cluster, S2).recovery) is not None
             and r.phase in (Phase.MUTATING, Phase.CLEANING), "recovery under way")
        cluster.crash_sequencer(S2)
        assert cluster.epoch_store.clean_epoch(LOG) == 0
        cluster.restart_sequencer(S1)
        third = append_and_wait(cluster, b"c:s1-again", via=S1)
        assert third.outcome == Status.OK and lsn_to_epoch(third.first_lsn) == 3
        wait(cluster, lambda: core_of(cluster, S1).release_lsn >= third.last_lsn,
             "second recovery")
        assert cluster.epoch_store.clean_epoch(LOG) == 2
        assert second.outcome is not None
        heal_and_check(cluster)


def test_two_sequencers_racing_to_recover_the_same_log(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=2,
                           window_appends_max=16)
    with report(cluster, request):
        [append_and_wait(cluster, f"r:{i}".encode(), via=S1) for i in range(5)]
        [cluster.append(LOG, (f"rf:{i}".encode(),), via=S1) for i in range(10)]
        cluster.run_for(3)
        cluster.crash_sequencer(S1)
        cluster.restart_sequencer(S1)
        # Both nodes activate at once (different views of who owns the log): epochs 2 and 3.
        racing = [cluster.append(LOG, (b"r:s1",), via=S1), cluster.append(LOG, (b"r:s2",), via=S2)]
        wait(cluster, lambda: all(a.outcome is not None for a in racing), "racing answers")
        epochs = sorted(core_of(cluster, n).epoch for n in (S1, S2))
        assert epochs[0] >= 2 and epochs[1] > epochs[0]
        winner = S1 if core_of(cluster, S1).epoch == epochs[1] else S2
        final = append_and_wait(cluster, b"r:final", via=winner)
        assert final.outcome == Status.OK
        wait(cluster, lambda: core_of(cluster, winner).release_lsn >= final.last_lsn,
             "the newer epoch's recovery")
        assert cluster.epoch_store.clean_epoch(LOG) == epochs[1] - 1
        heal_and_check(cluster)


def test_storage_node_that_missed_recovery_purges_its_stray_copies_when_back(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=2,
                           partition_connfail_ratio=0.0)
    with report(cluster, request):
        assert append_and_wait(cluster, b"p:0", via=S1).outcome == Status.OK
        # s1's next appends reach n1 only: single copies, never acknowledged.
        cluster.partition([S1], [N2, N3], 60_000)
        [cluster.append(LOG, (f"p:{i}".encode(),), via=S1) for i in range(1, 4)]
        wait(cluster, lambda: any(r.payload == b"p:3" for r in cluster.storage[N1].disk.records
                                  .values()), "stray copies on n1")
        cluster.crash_sequencer(S1)
        cluster.crash_storage(N1)
        after = append_and_wait(cluster, b"p:after", via=S2)
        assert after.outcome == Status.OK
        wait(cluster, lambda: core_of(cluster, S2).release_lsn >= after.last_lsn,
             "recovery without n1")
        strays = [lsn for (log, lsn), r in cluster.storage[N1].disk.records.items()
                  if log == LOG and lsn_to_epoch(lsn) == 1 and r.payload.startswith(b"p:")
                  and r.payload != b"p:0"]
        assert strays
        cluster.restart_storage(N1)
        # The release broadcast carries the recovery outcome n1 missed: it purges.
        wait(cluster, lambda: all(cluster.storage[N1].disk.records[(LOG, lsn)].is_hole
                                  for lsn in strays), "n1 purged its stray copies")
        heal_and_check(cluster)


def test_stray_copies_purged_by_a_late_clean_after_a_newer_seal(
        request: pytest.FixtureRequest) -> None:
    """The chaos seed-3 shape: n1 holds stray copies of epoch 1 and misses its recovery; before
    the CLEAN it is owed arrives, n1 is sealed by a newer recovery (epoch 3's sequencer
    recovering epoch 2). Epoch 1's outcome is final once its CLEAN was sent, so n1 must still
    purge (it used to answer PREEMPTED and keep the strays on disk for good)."""
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=2,
                           partition_connfail_ratio=0.0)
    with report(cluster, request):
        assert append_and_wait(cluster, b"q:0", via=S1).outcome == Status.OK
        # s1's next appends reach n1 only: single copies, never acknowledged.
        cluster.partition([S1], [N2, N3], 60_000)
        [cluster.append(LOG, (f"q:{i}".encode(),), via=S1) for i in range(1, 4)]
        wait(cluster, lambda: any(r.payload == b"q:3" for r in cluster.storage[N1].disk.records
                                  .values()), "stray copies on n1")
        cluster.crash_sequencer(S1)
        # s2 cannot reach n1: it recovers epoch 1 without it and owes n1 the CLEAN.
        cluster.partition([S2], [N1], 60_000)
        after = append_and_wait(cluster, b"q:s2", via=S2)
        assert after.outcome == Status.OK and lsn_to_epoch(after.first_lsn) == 2
        wait(cluster, lambda: core_of(cluster, S2).release_lsn >= after.last_lsn,
             "recovery of epoch 1 without n1")
        strays = [lsn for (log, lsn), r in cluster.storage[N1].disk.records.items()
                  if log == LOG and lsn_to_epoch(lsn) == 1 and r.payload in (b"q:1", b"q:2",
                                                                            b"q:3")]
        assert strays
        # The log moves to s1 (restarted; it reaches n1): epoch 3, whose recovery seals epoch
        # 2 on n1 before s2's owed CLEAN of epoch 1 (seal epoch 1) can get there.
        cluster.network.partitions = [p for p in cluster.network.partitions
                                      if S1 not in p.side_a]
        cluster.restart_sequencer(S1)
        cluster.failover(LOG, S1)
        third = append_and_wait(cluster, b"q:s1", via=S1)
        assert third.outcome == Status.OK and lsn_to_epoch(third.first_lsn) == 3
        wait(cluster, lambda: cluster.storage[N1].machine.state(LOG).sealed_epoch >= 2,
             "n1 sealed by epoch 3's recovery")
        assert not all(cluster.storage[N1].disk.records[(LOG, lsn)].is_hole for lsn in strays)
        # Meanwhile no reader is served a stray: through every f-majority (with n1 or not)
        # each stray LSN reads as a gap (n2 and n3 hold recovery's hole or bridge there).
        release = core_of(cluster, S1).release_lsn
        for members in ((N1, N2), (N1, N3), (N2, N3)):
            merged = merge([disk_answer(cluster.storage[m], LOG, release) for m in members],
                           Lsn(1), release, 10**9, 2**62)
            assert not {r[0] for r in merged.records} & set(strays), members
            assert all(any(g.lo <= lsn <= g.hi and g.kind in ("HOLE", "BRIDGE")
                           for g in merged.gaps) for lsn in strays), (members, merged.gaps)
        cluster.network.heal()
        # s1, whose earlier epochs are all clean now, purges: n1 reports epoch 1 as
        # unsettled, and s1 derives epoch 1's outcome from n2 and n3 (sequencer.core.purge).
        wait(cluster, lambda: all(cluster.storage[N1].disk.records[(LOG, lsn)].is_hole
                                  for lsn in strays), "n1 purged its stray copies")
        wait(cluster, lambda: 1 not in {e for e, _, _ in cluster.storage[N1].machine
                                        .on_get_log_state(GetLogState(log_id=LOG)).unclean},
             "n1 reports epoch 1 settled")
        heal_and_check(cluster)


def test_abandoned_attempts_copy_never_outranks_the_final_decision(
        request: pytest.FixtureRequest) -> None:
    """Issue 16 item 1, scripted with the simulation's faults (nodeset n1..n5 = A..E, R=3):
    e1n1 acked on A, B, C; e1n2 reaches only A; the sequencer dies. Recovery attempt 1 seals
    A, B, D, re-replicates e1n2 to A only (B and D stall) and times out; attempt 2 runs with
    B, C, E and bridges at e1n2; A, unreachable, gets no CLEAN. Every f-majority must still
    read the same at e1n2 (R2): A's copy from the abandoned attempt 1 must not outrank the
    bridge B, C and E hold once they applied their CLEAN."""
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=5, replication=3,
                           partition_connfail_ratio=0.0, recovery_timeout_ms=1_000)
    a, b, c, d, e = (NodeId(f"n{i}") for i in range(1, 6))
    with report(cluster, request):
        cluster.partition([S1], [d, e], 60_000)
        first = append_and_wait(cluster, b"i1:acked", via=S1)
        assert first.outcome == Status.OK
        cluster.partition([S1], [b, c], 60_000)
        cluster.append(LOG, (b"i1:stray",), via=S1)
        wait(cluster, lambda: on_disk_of(cluster, a, b"i1:stray"), "e1n2 on A only")
        cluster.crash_sequencer(S1)
        cluster.network.partitions = []
        # Attempt 1: S2 reaches A, B, D only; once they sealed and sent their digests, B is
        # cut off (its STORE is lost) and D stalls.
        cluster.partition([S2], [c, e], 60_000)
        cluster.append(LOG, (b"i1:s2",), via=S2)
        wait(cluster, lambda: LOG in cluster.sequencers[S2].cores
             and (r := core_of(cluster, S2).recovery) is not None
             and r.phase is Phase.MUTATING, "attempt 1 sealed and digested A, B, D")
        cluster.partition([S2], [b], 60_000)
        cluster.stall_storage(d, 60_000)
        wait(cluster, lambda: on_disk_of(cluster, a, b"i1:stray", written_by_recovery=True),
             "attempt 1 re-replicated e1n2 to A")
        # Attempt 2: S2 reaches B, C, E only (A and D are cut off).
        cluster.network.partitions = []
        cluster.partition([S2], [a, d], 60_000)
        wait(cluster, lambda: cluster.stats["recovery_restart"] >= 1, "attempt 2")
        wait(cluster, lambda: cluster.epoch_store.clean_epoch(LOG) >= 1, "epoch 1 recovered")
        cluster.run_for(200)  # B, C and E apply their CLEANs
        cluster.check_now()  # R2: through {A, B, D} and {B, C, E} alike
        heal_and_check(cluster)


def on_disk_of(cluster: SimCluster, node: NodeId, payload: bytes, *,
               written_by_recovery: bool = False) -> bool:
    return any(r.payload == payload and (
        not written_by_recovery or r.flags & RecordFlags.WRITTEN_BY_RECOVERY)
               for r in cluster.storage[node].disk.records.values())
