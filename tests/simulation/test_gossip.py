"""Simulation of the gossip failure detector: convergence, crash detection within the
threshold, restart through SUSPECT, partitions, asymmetric links and message loss."""

from __future__ import annotations

import pytest

from gossip.core.failure_detector import NodeState
from shared.config import GossipConfig
from shared.types import NodeId
from tests.simulation.gossip_sim import GossipSim

CONFIG = GossipConfig()  # production defaults: 100 ms, 30 intervals, 10 s suspect
THRESHOLD_MS = CONFIG.gossip_interval_ms * CONFIG.gossip_threshold_intervals
N0, N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(5))


def _converged(seed: int, nodes: int = 5, **options: float) -> GossipSim:
    sim = GossipSim(nodes, CONFIG, seed=seed, **options)  # type: ignore[arg-type]
    sim.run_for(2_000)
    assert sim.all_alive()
    return sim


@pytest.mark.parametrize("seed", range(5))
def test_crashed_node_is_dead_everywhere_within_the_threshold(seed: int) -> None:
    sim = _converged(seed)
    sim.crash(N2)
    # Others last heard of it at most an interval or two before the crash; one more interval
    # covers the tick that notices.
    elapsed_ms = sim.run_until(lambda: sim.state_everywhere(N2, NodeState.DEAD),
                               THRESHOLD_MS + 3 * CONFIG.gossip_interval_ms)
    assert elapsed_ms >= THRESHOLD_MS - 2 * CONFIG.gossip_interval_ms
    assert all(sim.cores[o].state(n) is NodeState.ALIVE
               for o in sim.up for n in sim.up)


@pytest.mark.parametrize("seed", range(3))
def test_restarted_node_comes_back_through_suspect(seed: int) -> None:
    sim = _converged(seed)
    sim.crash(N1)
    sim.run_until(lambda: sim.state_everywhere(N1, NodeState.DEAD), 2 * THRESHOLD_MS)
    sim.start(N1)
    sim.run_until(lambda: sim.state_everywhere(N1, NodeState.SUSPECT), 2_000)
    # The restarted node learns from peers that it restarted and holds itself SUSPECT too,
    # so it does not claim logs that others route elsewhere.
    assert sim.cores[N1].state(N1) is NodeState.SUSPECT
    sim.run_for(CONFIG.suspect_duration_ms - 2_000)
    assert sim.state_everywhere(N1, NodeState.SUSPECT)
    sim.run_until(sim.all_alive, 3_000)


def test_quick_restart_that_never_went_dead_still_passes_through_suspect() -> None:
    sim = _converged(7)
    sim.crash(N3)
    sim.run_for(500)
    sim.start(N3)
    sim.run_until(lambda: sim.state_everywhere(N3, NodeState.SUSPECT), 2_000)
    sim.run_until(sim.all_alive, CONFIG.suspect_duration_ms + 2_000)


@pytest.mark.parametrize("seed", range(3))
def test_partition_each_side_sees_the_other_dead_and_heals(seed: int) -> None:
    sim = _converged(seed)
    minority, majority = {N0, N1}, {N2, N3, N4}
    sim.partition(minority, majority)
    sim.run_for(THRESHOLD_MS + 500)
    for a in minority:
        assert all(sim.cores[a].state(b) is NodeState.DEAD for b in majority)
        assert all(sim.cores[b].state(a) is NodeState.DEAD for b in majority)
        assert sim.cores[a].state(a) is NodeState.ALIVE  # a node never declares itself dead
    sim.heal()
    sim.run_until(lambda: all(sim.cores[a].state(b) is NodeState.SUSPECT
                              and sim.cores[b].state(a) is NodeState.SUSPECT
                              for a in minority for b in majority), 2_000)
    sim.run_until(sim.all_alive, CONFIG.suspect_duration_ms + 2_000)


def test_asymmetric_links_are_bridged_by_other_nodes() -> None:
    sim = _converged(11)
    # n0 hears nobody directly and n1 cannot reach n2: gossip still relays every heartbeat.
    for other in (N1, N2, N3, N4):
        sim.cut_one_way(other, N0)
    sim.cut_one_way(N1, N2)
    sim.run_for(5 * THRESHOLD_MS)
    assert sim.all_alive() is False  # n0 alone: it never hears any gossip
    assert all(sim.cores[o].view() == dict.fromkeys(sim.ids, NodeState.ALIVE)
               for o in (N1, N2, N3, N4))


def test_node_that_only_sends_is_seen_alive_but_sees_others_dead() -> None:
    sim = _converged(3, nodes=3)
    sim.cut_one_way(N1, N0)
    sim.cut_one_way(N2, N0)
    sim.run_for(THRESHOLD_MS + 500)
    assert sim.cores[N1].state(N0) is NodeState.ALIVE
    assert sim.cores[N2].state(N0) is NodeState.ALIVE
    assert sim.cores[N0].state(N1) is NodeState.DEAD


@pytest.mark.parametrize("seed", range(3))
def test_lossy_network_raises_no_false_alarm(seed: int) -> None:
    sim = _converged(seed, loss=0.3, delay_ms_max=40)
    sim.run_for(20_000)
    assert sim.all_alive()


def test_starting_cluster_with_a_node_down_marks_only_it_dead() -> None:
    sim = GossipSim(4, CONFIG, seed=5)
    sim.crash(NodeId("n3"))
    sim.run_for(THRESHOLD_MS - 200)
    # A node nobody ever heard of is counted silent from each node's start.
    assert sim.all_alive()
    sim.run_until(lambda: sim.state_everywhere(NodeId("n3"), NodeState.DEAD), 500)
    assert all(sim.cores[o].state(n) is NodeState.ALIVE for o in sim.up for n in sim.up)
