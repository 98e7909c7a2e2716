"""Shared first waves in the simulation (``sequencer.core.shared_wave``): appends of different
logs that reach a sequencer at one moment share one copyset, one timer and one count of
answers; each still gets its own LSNs and answer, and when the wave cannot complete (a node
refuses, a preemption, a lost batch, the timeout) every appender goes on alone under the
per-log rules. The generated seeds see few such moments (1..3 logs), so these runs make many:
8 logs, most workload slots bursts, no client delay, with every fault the seed generates."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator

import pytest

from sequencer import handlers
from sequencer.core.shared_wave import SharedWave
from shared.status import Status
from shared.types import LogId, NodeId
from tests.simulation.runner import heal_and_check, run_simulation
from tests.simulation.sim_options import SimOptions
from tests.simulation.test_scenarios import append_and_wait, holders, make_cluster, report, wait

SHARED_WAVE_SEEDS = range(7_000, 7_060)


@pytest.fixture
def wave_counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many shared waves completed and how many were handed back to their logs."""
    counts: Counter[str] = Counter()
    complete, dissolve = handlers.EffectDriver._complete_wave, handlers.EffectDriver._dissolve

    def completed(self: handlers.EffectDriver, wave: SharedWave, now_ms: int) -> None:
        counts["completed"] += 1
        counts["completed_appenders"] += len(wave.entries)
        complete(self, wave, now_ms)

    def dissolved(self: handlers.EffectDriver, wave: SharedWave, now_ms: int) -> None:
        counts["dissolved"] += 1
        dissolve(self, wave, now_ms)

    monkeypatch.setattr(handlers.EffectDriver, "_complete_wave", completed)
    monkeypatch.setattr(handlers.EffectDriver, "_dissolve", dissolved)
    yield counts


def many_logs_options(seed: int) -> SimOptions:
    generated = SimOptions.generate(random.Random(seed))
    return dataclasses.replace(generated, logs_count=8, burst_ratio=0.8, burst_appends_max=12,
                               client_delay_ms_max=0, appends_count=120,
                               append_group_records_max=max(
                                   4, generated.append_group_records_max))


def test_many_logs_seeds(wave_counts: Counter[str]) -> None:
    for seed in SHARED_WAVE_SEEDS:
        result = run_simulation(seed, options=many_logs_options(seed))
        assert result.outcomes.get("OK", 0) > 0, result.summary()
    # The runs do exercise shared waves, both ways they end.
    assert wave_counts["completed"] > 100 and wave_counts["dissolved"] > 10, wave_counts


def test_appends_of_many_logs_at_one_moment_share_a_wave_and_keep_their_own_lsns(
        request: pytest.FixtureRequest, wave_counts: Counter[str]) -> None:
    logs = [LogId(i) for i in range(1, 7)]
    cluster = make_cluster(storage_nodes_count=4, replication=2, logs_count=6,
                           client_delay_ms_max=0, disk_delay_ms_max=0)
    with report(cluster, request):
        for log_id in logs:
            assert append_and_wait(cluster, f"first:{log_id}".encode(),
                                   log_id=log_id).outcome == Status.OK
        before = Counter(wave_counts)
        appends = [cluster.append(log_id, (f"round{i}:{log_id}".encode(),))
                   for i in range(3) for log_id in logs]
        wait(cluster, lambda: all(a.outcome is not None for a in appends), "answers")
        assert [a.outcome for a in appends] == [Status.OK] * len(appends)
        assert wave_counts["completed_appenders"] - before["completed_appenders"] == len(logs)
        assert wave_counts["dissolved"] == before["dissolved"]
        for log_id in logs:
            mine = [a for a in appends if a.log_id == log_id]
            lsns = [a.first_lsn for a in mine]
            assert lsns == sorted(lsns) and len(set(lsns)) == 3
        # One copyset for the whole wave: every record of it on the same two nodes.
        assert len({tuple(sorted(holders(cluster, a))) for a in appends}) == 1
        heal_and_check(cluster)


def test_a_node_down_ends_the_wave_and_each_appender_goes_on_alone(
        request: pytest.FixtureRequest, wave_counts: Counter[str]) -> None:
    logs = [LogId(i) for i in range(1, 7)]
    n1 = NodeId("n1")
    cluster = make_cluster(storage_nodes_count=3, replication=2, logs_count=6,
                           client_delay_ms_max=0, disk_delay_ms_max=0,
                           partition_connfail_ratio=0.0)
    with report(cluster, request):
        for log_id in logs:
            assert append_and_wait(cluster, f"first:{log_id}".encode(),
                                   log_id=log_id).outcome == Status.OK
        cluster.crash_storage(n1, down_ms=5_000)
        appends = [cluster.append(log_id, (f"round{i}:{log_id}".encode(),))
                   for i in range(5) for log_id in logs]
        wait(cluster, lambda: all(a.outcome is not None for a in appends), "answers")
        assert [a.outcome for a in appends] == [Status.OK] * len(appends)
        assert wave_counts["dissolved"] > 0  # waves whose copyset held n1 timed out
        assert all(n1 not in holders(cluster, a) and len(holders(cluster, a)) == 2
                   for a in appends)
        heal_and_check(cluster)
