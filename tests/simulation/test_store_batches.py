"""Cross-log STORE batching in the simulation: the STOREs of several logs that a sequencer
node sends at one moment share one STORE_BATCH per storage node, and each STORE still gets
its own fate (PREEMPTED for one log, OK for the others; a lost batch fails every STORE in
it, whose appenders then send new waves)."""

from __future__ import annotations

import pytest

from sequencer.core.sequencer import SequencerState
from shared.status import Status
from shared.types import Epoch, LogId, NodeId
from tests.simulation.runner import heal_and_check
from tests.simulation.test_scenarios import (
    append_and_wait,
    holders,
    make_cluster,
    on_disk,
    report,
    wait,
)

A, B, C = LogId(1), LogId(2), LogId(3)
S1, S2 = NodeId("s1"), NodeId("s2")
N1 = NodeId("n1")


def test_one_log_preempted_in_a_batch_the_others_stored(request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=3,
                           logs_count=3, client_delay_ms_max=0, partition_connfail_ratio=0.0)
    cluster.epoch_store.preset(A, cluster.provision, next_epoch=Epoch(3), clean_epoch=Epoch(2))
    with report(cluster, request):
        for log_id in (A, B, C):
            assert append_and_wait(cluster, f"first:{log_id}".encode(), via=S1,
                                   log_id=log_id).outcome == Status.OK
        a_core = cluster.sequencers[S1].cores[A]
        assert a_core.sequencer.epoch == 3
        # s2 takes log A over (epoch 4): every node now refuses A's epoch-3 STOREs.
        assert append_and_wait(cluster, b"a:s2", via=S2, log_id=A).outcome == Status.OK
        assert all(n.machine.state(A).effective_seal[0] >= 3 for n in cluster.storage.values())
        batches_before = cluster.stats["store_batches"]
        appends = {log_id: cluster.append(log_id, (f"together:{log_id}".encode(),), via=S1)
                   for log_id in (A, B, C)}
        wait(cluster, lambda: all(a.outcome is not None for a in appends.values()), "answers")
        # One STORE_BATCH per storage node carried the three logs' STOREs.
        assert cluster.stats["store_batches"] - batches_before == 3
        assert appends[A].outcome == Status.TIMEDOUT
        assert appends[A].core_reply is not None and "preempted" in appends[A].core_reply.message
        assert on_disk(cluster, b"together:1") == []
        assert a_core.sequencer.state is SequencerState.PREEMPTED
        assert a_core.sequencer.sealed_epoch >= 3 and a_core.sequencer.sealed_by == S2
        for log_id in (B, C):
            assert appends[log_id].outcome == Status.OK
            assert sorted(holders(cluster, appends[log_id])) == ["n1", "n2", "n3"]
        heal_and_check(cluster)


def test_a_batch_lost_with_its_node_fails_every_store_in_it(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(storage_nodes_count=4, replication=2, logs_count=3,
                           client_delay_ms_max=0, disk_delay_ms_max=0)
    with report(cluster, request):
        for log_id in (A, B, C):
            assert append_and_wait(cluster, f"first:{log_id}".encode(),
                                   log_id=log_id).outcome == Status.OK
        cluster.crash_storage(N1, down_ms=5_000)
        appends = [cluster.append(log_id, (f"round{i}:{log_id}".encode(),))
                   for i in range(10) for log_id in (A, B, C)]
        wait(cluster, lambda: all(a.outcome is not None for a in appends), "answers")
        assert [a.outcome for a in appends] == [Status.OK] * len(appends)
        assert cluster.stats["store_batches"] > 0
        assert cluster.stats["store_retry_wave"] > 0  # n1's STOREs went again elsewhere
        assert all(N1 not in holders(cluster, a) and len(holders(cluster, a)) == 2
                   for a in appends)
        heal_and_check(cluster)
