"""The chaos suite's runs on real processes: one small seeded run in the default suite
(about two minutes: 2 sequencer nodes, 3 storage nodes, R=2, 90 s of faults, among them a
kill -9 of every node at once), and with ``--run-slow`` longer multi-seed runs and a
ten-minute mixed run on a larger cluster. A failure names the seed; replay it
with ``python -m tests.chaos.run --seed N --duration-s S [--large]``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosResult, run
from tests.chaos.run import config_for

SMALL_SEED = 20240605
SMALL_DURATION_S = 90.0
AUTH_DURATION_S = 30.0
SLOW_SEEDS = (1, 2, 3)
SLOW_DURATION_S = 300.0
TEN_MINUTES_SEED = 7
TEN_MINUTES_S = 600.0
MIXED = ("kill", "pause", "killall", "failpoint")
"""Fault kinds the ten-minute run must have exercised: kill -9 of sequencers and storage
nodes, SIGSTOP, kill -9 of all nodes, crashes at failpoints."""


def _assert_sound(result: ChaosResult) -> None:
    figures = result.figures
    print(result.summary())
    assert not result.violations, result.failure_message()
    # The run must have exercised something, or passing means nothing.
    assert figures["appends_acked"] > 500, f"seed {result.seed}: too few acks {figures}"
    assert figures["reads"] > 100, f"seed {result.seed}: too few reads {figures}"
    assert figures["links_carrying_traffic"] == figures["links"], (
        f"seed {result.seed}: some node-to-node links bypassed the proxies {figures}")
    assert not figures["unscanned"], f"seed {result.seed}: {figures['unscanned']}"
    assert figures["reader_mismatches"] == [], (
        f"seed {result.seed}: the direct reader and HTTP reads differ {figures}")


@pytest.mark.integration
@pytest.mark.timeout(420)
async def test_small_chaos_run(tmp_path: Path) -> None:
    result = await run(config_for(SMALL_SEED, SMALL_DURATION_S, large=False), tmp_path)
    _assert_sound(result)


@pytest.mark.integration
async def test_small_chaos_run_with_auth_on(tmp_path: Path) -> None:
    """The same checks with client authentication on (docs/SECURITY.md): the workload and
    the readers carry the cluster's token through crashes, partitions and restarts."""
    config = replace(config_for(SMALL_SEED + 1, AUTH_DURATION_S, large=False), auth=True)
    _assert_sound(await run(config, tmp_path))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(int(SLOW_DURATION_S) + 600)
@pytest.mark.parametrize("seed", SLOW_SEEDS)
async def test_long_chaos_run(tmp_path: Path, seed: int) -> None:
    result = await run(config_for(seed, SLOW_DURATION_S, large=True), tmp_path)
    _assert_sound(result)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(int(TEN_MINUTES_S) + 900)
async def test_ten_minute_mixed_fault_run(tmp_path: Path) -> None:
    result = await run(config_for(TEN_MINUTES_SEED, TEN_MINUTES_S, large=True), tmp_path)
    _assert_sound(result)
    done = result.figures["faults"]
    for kind in MIXED:
        assert done.get(kind, 0) >= 1, f"the run never did a {kind}: {done}"
