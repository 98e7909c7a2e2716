"""Targeted scenarios on the simulation harness (TigerBeetle's replica_test style): each one
scripts a fault, asserts what the cores must do, then heals and runs the liveness and disk
checkers like every randomized seed. The safety checkers watch every event throughout."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from sequencer.core.sequencer import SequencerState
from shared.status import Status
from shared.types import Epoch, LogId, NodeId, lsn_to_epoch
from shared.wire.store import RecordFlags
from tests.simulation.runner import failure_report, heal_and_check
from tests.simulation.sim_client import ClientAppend
from tests.simulation.sim_cluster import SimCluster
from tests.simulation.sim_options import SimOptions

LOG = LogId(1)
S1, S2 = NodeId("s1"), NodeId("s2")
N1 = NodeId("n1")
WAIT_MS = 30_000


def make_cluster(seed: int = 1, **overrides: Any) -> SimCluster:
    return SimCluster(seed, SimOptions.calm(**overrides), random.Random(seed))


def report(cluster: SimCluster,
           request: pytest.FixtureRequest) -> contextlib.AbstractContextManager[None]:
    return failure_report(cluster, f"reproduce with: pytest '{request.node.nodeid}'")


def wait(cluster: SimCluster, predicate: Callable[[], bool], what: str) -> None:
    assert cluster.run_until(predicate, timeout_ms=WAIT_MS), f"not within {WAIT_MS}ms: {what}"


def append_and_wait(cluster: SimCluster, payload: bytes, *, via: NodeId | None = None,
                    log_id: LogId = LOG) -> ClientAppend:
    append = cluster.append(log_id, (payload,), via=via)
    wait(cluster, lambda: append.outcome is not None, f"answer to {payload!r}")
    return append


def on_disk(cluster: SimCluster, payload: bytes) -> list[NodeId]:
    return [node_id for node_id, node in cluster.storage.items()
            if any(r.payload == payload for r in node.disk.records.values())]


def holders(cluster: SimCluster, append: ClientAppend) -> list[NodeId]:
    return [node_id for node_id, node in cluster.storage.items()
            if (append.log_id, append.first_lsn) in node.disk.records]


def test_storage_node_down_all_run_appends_succeed_via_new_waves(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(storage_nodes_count=3, replication=2)
    with report(cluster, request):
        cluster.crash_storage(N1)
        appends = []
        for index in range(40):
            appends.append(cluster.append(LOG, (f"down:{index}".encode(),)))
            cluster.run_for(5)
        wait(cluster, lambda: all(a.outcome is not None for a in appends), "all answers")
        assert [a.outcome for a in appends] == [Status.OK] * 40
        assert cluster.stats["store_retry_wave"] > 0  # n1 was picked, failed, replaced
        assert not cluster.storage[N1].disk.records
        assert all(sorted(holders(cluster, a)) == ["n2", "n3"] for a in appends)
        heal_and_check(cluster)


def test_store_of_sealed_epoch_is_preempted_and_old_appends_end_timedout(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, partition_connfail_ratio=0.0)
    cluster.epoch_store.preset(LOG, cluster.provision, next_epoch=Epoch(3),
                               clean_epoch=Epoch(2))
    with report(cluster, request):
        assert append_and_wait(cluster, b"old:0", via=S1).outcome == Status.OK
        old_core = cluster.sequencers[S1].cores[LOG]
        assert old_core.sequencer.epoch == 3
        # s1's STOREs now vanish, so its appends stay in flight while s2 takes epoch 4.
        cluster.partition([S1], list(cluster.storage), 2_000)
        old = [cluster.append(LOG, (f"old:{i}".encode(),), via=S1) for i in range(1, 4)]
        cluster.run_for(20)
        for index in range(20):
            assert append_and_wait(cluster, f"new:{index}".encode(), via=S2).outcome == Status.OK
            if all(node.machine.state(LOG).effective_seal[0] >= 3
                   for node in cluster.storage.values()):
                break
        assert cluster.sequencers[S2].cores[LOG].sequencer.epoch == 4
        assert all(n.machine.state(LOG).effective_seal[0] >= 3 for n in cluster.storage.values())
        wait(cluster, lambda: all(a.outcome is not None for a in old), "old appends answered")
        for append in old:
            assert append.outcome == Status.TIMEDOUT, append
            assert append.core_reply is not None and "preempted" in append.core_reply.message
            assert on_disk(cluster, append.payloads[0]) == []
        assert old_core.sequencer.state is SequencerState.PREEMPTED
        assert old_core.sequencer.sealed_epoch >= 3
        assert cluster.stats["stored_preempted"] >= 1
        heal_and_check(cluster)


def test_full_window_answers_seqnobufs_and_stores_nothing(
        request: pytest.FixtureRequest) -> None:
    # One appender per append, as when appends arrive one by one.
    cluster = make_cluster(window_appends_max=2, partition_connfail_ratio=0.0,
                           append_group_records_max=1)
    with report(cluster, request):
        assert append_and_wait(cluster, b"w:0").outcome == Status.OK
        cluster.partition([S1], list(cluster.storage), 500)
        appends = [cluster.append(LOG, (f"w:{i}".encode(),)) for i in range(1, 6)]
        wait(cluster, lambda: all(a.outcome is not None for a in appends), "all answers")
        assert Counter(a.outcome for a in appends) == {Status.OK: 2, Status.SEQNOBUFS: 3}
        for append in appends:
            if append.outcome == Status.SEQNOBUFS:
                assert on_disk(cluster, append.payloads[0]) == []
                assert (LOG, append.first_lsn) not in cluster.checker.assigned
        heal_and_check(cluster)


def test_sequencer_restart_recovers_the_old_epoch_then_releases_the_new_one(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster()
    with report(cluster, request):
        first = [append_and_wait(cluster, f"e1:{i}".encode()) for i in range(5)]
        assert all(a.outcome == Status.OK for a in first)
        cluster.crash_sequencer(S1)
        cluster.restart_sequencer(S1)
        second = [append_and_wait(cluster, f"e2:{i}".encode()) for i in range(5)]
        assert all(a.outcome == Status.OK and lsn_to_epoch(a.first_lsn) == 2 for a in second)
        sequencer = cluster.sequencers[S1].cores[LOG].sequencer
        wait(cluster, lambda: sequencer.releasable, "recovery of epoch 1")
        assert cluster.epoch_store.clean_epoch(LOG) == 1
        assert cluster.epoch_store.lce[LOG].tail_lsn == first[-1].last_lsn
        wait(cluster, lambda: sequencer.release_lsn >= second[-1].last_lsn, "release")
        # Epoch 1 ends with a bridge right after its last record, on R nodes.
        bridge = (LOG, first[-1].last_lsn + 1)
        assert len([n for n in cluster.storage.values()
                    if (r := n.disk.records.get(bridge)) is not None
                    and r.flags & RecordFlags.BRIDGE]) >= 2
        heal_and_check(cluster)


def test_drained_epoch_is_clean_so_the_next_one_releases(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster()
    with report(cluster, request):
        first = [append_and_wait(cluster, f"d1:{i}".encode()) for i in range(3)]
        cluster.drain_sequencer(S1, down_ms=10)
        node = cluster.sequencers[S1]
        wait(cluster, lambda: node.up and not node.draining, "drained and restarted")
        assert cluster.epoch_store.clean_epoch(LOG) == 1
        assert cluster.epoch_store.lce[LOG].tail_lsn == first[-1].last_lsn
        second = append_and_wait(cluster, b"d2:0")
        sequencer = node.cores[LOG].sequencer
        assert second.outcome == Status.OK and sequencer.epoch == 2 and sequencer.releasable
        assert sequencer.release_lsn == second.last_lsn
        heal_and_check(cluster)


def test_esn_exhaustion_rolls_over_and_recovery_keeps_releasing(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(esn_max=12)
    with report(cluster, request):
        appends = [append_and_wait(cluster, f"r:{i}".encode()) for i in range(30)]
        assert all(a.outcome == Status.OK for a in appends)
        assert sorted({lsn_to_epoch(a.first_lsn) for a in appends}) == [1, 2, 3]
        sequencer = cluster.sequencers[S1].cores[LOG].sequencer
        wait(cluster, lambda: sequencer.release_lsn >= appends[-1].last_lsn, "release")
        assert sequencer.epoch == 3 and sequencer.releasable
        heal_and_check(cluster)


def test_restarted_storage_node_rebuilds_its_soft_seal_from_disk(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=3)
    with report(cluster, request):
        assert append_and_wait(cluster, b"s1:0", via=S1).outcome == Status.OK
        assert append_and_wait(cluster, b"s2:0", via=S2).outcome == Status.OK  # epoch 2
        for node_id in list(cluster.storage):
            cluster.crash_storage(node_id)
            cluster.restart_storage(node_id)
            assert cluster.storage[node_id].machine.state(LOG).effective_seal[0] == 1
        stale = append_and_wait(cluster, b"s1:1", via=S1)
        assert stale.outcome == Status.TIMEDOUT and on_disk(cluster, b"s1:1") == []
        heal_and_check(cluster)


def test_epoch_store_failures_answer_nosequencer_and_write_nothing(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(epoch_store_failure_ratio=1.0)
    with report(cluster, request):
        failed = [append_and_wait(cluster, f"f:{i}".encode()) for i in range(4)]
        assert [a.outcome for a in failed] == [Status.NOSEQUENCER] * 4
        assert all(on_disk(cluster, a.payloads[0]) == [] for a in failed)
        cluster.sequencer_env.epoch_store_failure_ratio = 0.0
        assert append_and_wait(cluster, b"f:ok").outcome == Status.OK
        heal_and_check(cluster)


def test_wave_over_nodes_already_holding_copies_completes(
        request: pytest.FixtureRequest) -> None:
    # A round trip (100ms) longer than the first store timeouts (10, 20, 40, 80ms): waves
    # overlap and STORED OKs of earlier waves arrive while a later wave is out.
    for seed in range(1, 31):
        cluster = make_cluster(seed, storage_nodes_count=3, replication=1, delay_ms_min=50,
                               delay_ms_max=50, store_timeout_ms_min=10, client_delay_ms_max=0,
                               epoch_store_delay_ms_max=0, disk_delay_ms_max=0)
        with report(cluster, request):
            append = append_and_wait(cluster, f"slow:{seed}".encode())
            assert append.outcome == Status.OK, f"seed {seed}: {append.outcome!r}"
            heal_and_check(cluster)


def test_concurrent_appends_share_an_appender_and_a_full_window_refuses_the_group(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(window_appends_max=2, partition_connfail_ratio=0.0,
                           client_delay_ms_max=0)
    with report(cluster, request):
        assert append_and_wait(cluster, b"g:0").outcome == Status.OK
        cluster.partition([S1], list(cluster.storage), 500)
        bursts = []
        for burst in range(3):  # each burst arrives at one moment: one group
            bursts.append([cluster.append(LOG, (f"g:{burst}:{i}".encode(),)) for i in range(3)])
            cluster.run_for(1)
        wait(cluster, lambda: all(a.outcome is not None for b in bursts for a in b), "answers")
        first, second, refused = bursts
        assert all(a.outcome == Status.OK for a in first + second)
        lsns = [a.first_lsn for a in first + second]
        assert lsns == list(range(lsns[0], lsns[0] + 6))  # own LSNs, in arrival order
        assert all(a.outcome == Status.SEQNOBUFS for a in refused)
        assert all(on_disk(cluster, a.payloads[0]) == [] for a in refused)
        heal_and_check(cluster)


def test_idle_core_is_deactivated_and_comes_back_without_recovery(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(idle_deactivate_ms=300, logs_count=2)
    node = cluster.sequencers[S1]
    with report(cluster, request):
        before = [append_and_wait(cluster, b"before:%d" % i) for i in range(10)]
        other = append_and_wait(cluster, b"other", log_id=LogId(2))
        wait(cluster, lambda: LOG not in node.cores and LogId(2) not in node.cores,
             "idle cores deactivated")
        assert cluster.stats["idle_clean_epoch_ok"] == 2
        after = [append_and_wait(cluster, b"after:%d" % i) for i in range(10)]
        appends = [*before, *after]
        assert [a.outcome for a in [*appends, other]] == [Status.OK] * 21
        lsns = [a.first_lsn for a in appends]
        assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
        assert lsn_to_epoch(after[0].first_lsn) == lsn_to_epoch(before[-1].first_lsn) + 1
        # The clean mark covered the idle epoch: the new one released with no recovery.
        assert cluster.stats["activation_over_unclean"] == 0
        assert not any(k.startswith("recovery_") for k in cluster.stats if cluster.stats[k])
        heal_and_check(cluster)  # R1: readers see every acknowledged record, in order
