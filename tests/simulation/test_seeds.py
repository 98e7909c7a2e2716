"""The randomized simulation over many seeds: every seed must pass every checker.

A failure prints the checker, the seed's options, the last events and the
``reproduce with: python -m tests.simulation.run --seed N`` line.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.simulation.runner import SimulationFailure, run_simulation

SEEDS = range(1, 241)
SOAK_SEEDS = range(1_000, 6_000)


def run_seed(seed: int) -> None:
    result = run_simulation(seed)
    assert result.outcomes.get("OK", 0) > 0, result.summary()


@pytest.mark.parametrize("seed", SEEDS)
def test_seed(seed: int) -> None:
    run_seed(seed)


def test_default_seeds_exercise_the_recovery_faults() -> None:
    """The generated mix restarts recovery attempts, loses CLEANs and stalls members (else
    the seeds above prove nothing about them), damages disks, and the R2 checker reads along."""
    seen: Counter[str] = Counter()
    for seed in range(1, 21):
        seen.update(run_simulation(seed).stats)
    for kind in ("recovery_restart", "lost_clean", "lost_cleaned", "storage_stall",
                 "storage_damaged", "reader_checks"):
        assert seen[kind] > 0, (kind, seen)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 5000 seeds take several minutes on 2 cores
def test_soak_seeds() -> None:
    failures: list[str] = []
    for seed in SOAK_SEEDS:
        try:
            run_simulation(seed)
        except SimulationFailure as failure:
            failures.append(str(failure))
    assert not failures, f"{len(failures)} seeds failed; first:\n{failures[0]}"
