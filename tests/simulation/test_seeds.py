"""The randomized simulation over many seeds: every seed must pass every checker.

A failure prints the checker, the seed's options, the last events and the
``reproduce with: python -m tests.simulation.run --seed N`` line.
"""

from __future__ import annotations

import pytest

from tests.simulation.runner import SimulationFailure, hung_on_stored_copies, run_simulation

SEEDS = range(1, 241)
SOAK_SEEDS = range(1_000, 6_000)


def run_seed(seed: int) -> None:
    try:
        result = run_simulation(seed)
    except SimulationFailure as failure:
        # A known core bug, reported and shown by a strict xfail in test_scenarios.py; only
        # a liveness failure with exactly its signature is excused, anything else fails.
        if failure.checker in ("L1", "L2") and hung_on_stored_copies(failure.cluster):
            pytest.xfail(f"seed {seed}: appender hung after a wave over stored copies "
                         "(see test_wave_over_nodes_already_holding_copies_completes)")
        raise
    assert result.outcomes.get("OK", 0) > 0, result.summary()


@pytest.mark.parametrize("seed", SEEDS)
def test_seed(seed: int) -> None:
    run_seed(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SOAK_SEEDS)
def test_soak_seed(seed: int) -> None:
    run_seed(seed)
