"""Schemathesis from a node's own ``/openapi.json`` against a real local cluster: generated
requests, valid and invalid, with JSON and msgpack bodies, for every operation; every answer
checked against the document (``--checks all``: no 5xx, status codes, content types, headers,
bodies in JSON and in msgpack, valid data accepted, invalid data refused); every node healthy
and no 5xx counted in its ``/metrics`` after. A small budget runs in the default suite, a
large one with ``--run-slow``.

It runs the ``schemathesis`` command (its pytest plugin does not run on this pytest), with
``schemathesis_hooks.py`` (msgpack bodies and answers, real compressed batches, short long
polls) and ``schemathesis.toml`` (the statuses the contract gives that schemathesis' defaults
do not expect, each with its reason).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from seqlog_cluster_support import RunningCluster

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SMALL_EXAMPLES = 6
"""Test cases per operation and phase in the default suite (well under a minute)."""
SMALL_SEED = 19
"""The default suite's run is the same every time (a CI run is not a lottery); the large run
takes a fresh random seed each time, which it prints."""
LARGE_EXAMPLES = 300


def run_schemathesis(cluster: RunningCluster, max_examples: int, timeout_s: float,
                     workdir: Path, seed: int | None, token: str | None = None
                     ) -> subprocess.CompletedProcess[str]:
    """``workdir``: where schemathesis keeps its cache (crashes it would replay next time), so
    that each run starts fresh and nothing lands in the source tree."""
    command = Path(sys.executable).parent / "schemathesis"
    base = cluster.sequencer_urls[0]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), str(HERE),
                                                     os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run(
        [str(command), "--no-color", "--config-file", str(HERE / "schemathesis.toml"), "run",
         f"{base}/openapi.json", "--checks", "all", "--max-examples", str(max_examples),
         "--request-timeout", "30", "--suppress-health-check", "all", "--workers", "1",
         *([] if seed is None else ["--seed", str(seed)]),
         # A cluster with auth on (docs/SECURITY.md): every request carries the token, and
         # schemathesis also checks each operation refuses requests without it.
         *([] if token is None else ["--header", f"Authorization: Bearer {token}"])],
        env=env, cwd=workdir, capture_output=True, text=True, timeout=timeout_s, check=False)


def server_errors(cluster: RunningCluster, token: str | None = None) -> dict[str, float]:
    """HTTP answers with a 5xx code each node counted."""
    found: dict[str, float] = {}
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    for node in cluster.state.nodes:
        request = urllib.request.Request(f"http://{node.http}/metrics", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read().decode()
        found[node.node_id] = sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("seqlog_http_requests_total{") and 'code="5' in line)
    return found


def check_run(cluster: RunningCluster, max_examples: int, timeout_s: float,
              workdir: Path, seed: int | None = None, token: str | None = None) -> None:
    before = server_errors(cluster, token)
    done = run_schemathesis(cluster, max_examples, timeout_s, workdir, seed, token)
    tail = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failure" not in done.stdout.split("SUMMARY")[-1], tail
    for node in cluster.state.nodes:
        with urllib.request.urlopen(f"http://{node.http}/readyz", timeout=10) as answer:
            assert answer.status == 200, node.node_id
    assert server_errors(cluster, token) == before


def test_every_operation_keeps_its_contract(local_cluster: RunningCluster,
                                            tmp_path: Path) -> None:
    check_run(local_cluster, SMALL_EXAMPLES, timeout_s=240, workdir=tmp_path, seed=SMALL_SEED)


@pytest.mark.slow
def test_every_operation_keeps_its_contract_large(local_cluster: RunningCluster,
                                                  tmp_path: Path) -> None:
    check_run(local_cluster, LARGE_EXAMPLES, timeout_s=3600, workdir=tmp_path)
