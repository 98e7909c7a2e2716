"""A storage node with a damaged disk in the simulation (issue 16 item 3): it comes back
knowing it lost copies (authoritative status), and neither recovery nor readers take its
silence for absence. Each scenario then heals and runs every checker (C1-C5; R1 reads like a
reader that asks one more node when the ones it has cannot vouch; L1, L2)."""

from __future__ import annotations

import pytest

from sequencer.core.recovery import Phase
from shared.status import Status
from shared.types import NodeId, lsn_to_epoch
from tests.simulation.runner import heal_and_check
from tests.simulation.test_recovery_scenarios import core_of
from tests.simulation.test_scenarios import LOG, S1, S2, append_and_wait, make_cluster, report, wait

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def test_a_damaged_node_comes_back_non_authoritative_and_every_record_reads_back(
        request: pytest.FixtureRequest) -> None:
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=3, replication=2)
    with report(cluster, request):
        first = [append_and_wait(cluster, f"d:{i}".encode(), via=S1) for i in range(20)]
        assert all(a.outcome == Status.OK for a in first)
        cluster.crash_storage(N1)
        assert cluster.storage[N1].damage_disk(keep_fraction=0.0)
        cluster.restart_storage(N1)
        assert cluster.storage[N1].disk.authority.damaged
        after = append_and_wait(cluster, b"d:after", via=S1)
        assert after.outcome == Status.OK
        heal_and_check(cluster)  # R1: f-majorities with n1 read everything through one more


def test_recovery_sealed_with_a_damaged_node_waits_for_one_that_vouches(
        request: pytest.FixtureRequest) -> None:
    """Nodeset n1..n5, R=3 (f-majority 3). The sequencer dies with appends in flight; n1's
    disk is damaged meanwhile; the successor reaches only n1, n4, n5 at first. Sealed by them
    it must not digest (n1 vouches for nothing), so it plugs nothing an acknowledged append
    had on n2 and n3: it waits until they answer."""
    cluster = make_cluster(sequencer_nodes_count=2, storage_nodes_count=5, replication=3,
                           window_appends_max=32, delay_ms_max=8)
    with report(cluster, request):
        assert append_and_wait(cluster, b"w", via=S1).outcome == Status.OK
        _flight = [cluster.append(LOG, (f"f:{i}".encode(),), via=S1) for i in range(20)]
        cluster.run_for(6)
        cluster.crash_sequencer(S1)
        cluster.crash_storage(N1)
        cluster.storage[N1].damage_disk(keep_fraction=0.0)
        cluster.restart_storage(N1)
        cluster.partition([S2], [N2, N3], 2_000)
        after = cluster.append(LOG, (b"after",), via=S2)
        cluster.run_for(1_000)
        recovery = core_of(cluster, S2).recovery
        assert recovery is not None and recovery.phase is Phase.SEALING
        wait(cluster, lambda: after.outcome is not None, "the append after recovery")
        assert after.outcome == Status.OK and lsn_to_epoch(after.first_lsn) == 2
        heal_and_check(cluster)  # C5: no acknowledged LSN plugged; R1: all read back
