"""A seed is a complete description of a run: same seed, same trace, in this process and in
another one with a different string-hash seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simulation.run import main
from tests.simulation.runner import SimulationFailure, run_simulation

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120


def fingerprint(seed: int) -> str:
    """The trace digest of a passing run, or the whole report of a failing one."""
    try:
        return run_simulation(seed).digest
    except SimulationFailure as failure:
        return str(failure)


def test_same_seed_same_trace() -> None:
    for seed in (3, 17, 42):
        assert fingerprint(seed) == fingerprint(seed)


def test_same_trace_under_another_hash_seed() -> None:
    code = ("from tests.simulation.test_determinism import fingerprint; "
            "print(fingerprint(42), end='')")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                               capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert completed.stdout == fingerprint(42)


def test_runner_reports_every_seed_and_exits_nonzero_on_failure(
        capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["--seeds", "4..6"])
    out = capsys.readouterr().out
    verdicts = {seed: f"seed {seed}: ok" in out for seed in (4, 5, 6)}
    assert all(verdicts[s] or f"seed {s}: FAILED" in out for s in verdicts), out
    assert status == (0 if all(verdicts.values()) else 1)
    assert out.splitlines()[-1].startswith(f"{sum(verdicts.values())}/3 seeds passed")
