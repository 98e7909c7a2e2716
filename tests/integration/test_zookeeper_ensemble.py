"""A 3-node ZooKeeper ensemble loses its leader while several processes race epoch bumps:
no epoch is handed out twice and no bump that reported success is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from epoch_store import ZooKeeperEpochStore
from epoch_store import zk_server as zks
from shared.status import Status
from shared.types import LogId
from tests.zk_support import hosts, leader, start_ensemble, stop_all, unique_root

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 4
BUMPS_PER_PROCESS = 25
LOGS = 10
PACE_MS = 8
KILL_AFTER_SUCCESSES = 20
RUN_TIMEOUT_S = 120


async def _spawn(hosts_arg: str, root: str, writer: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.zk_bump_worker", hosts_arg, root, writer,
        str(BUMPS_PER_PROCESS), str(LOGS), str(PACE_MS), cwd=REPO_ROOT, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


async def _line(process: asyncio.subprocess.Process) -> dict[str, Any]:
    assert process.stdout is not None
    raw = await process.stdout.readline()
    assert raw, f"worker {process.pid} exited early (rc {process.returncode})"
    line: dict[str, Any] = json.loads(raw)
    return line


async def test_leader_kill_during_racing_bumps_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    ensemble = start_ensemble(tmp_path)
    workers: list[asyncio.subprocess.Process] = []
    try:
        old_leader = leader(ensemble)
        assert old_leader is not None
        root = unique_root()
        for i in range(PROCESSES):
            workers.append(await _spawn(hosts(ensemble), root, f"p{i}"))
        for worker in workers:
            assert await asyncio.wait_for(_line(worker), 30) == {"ready": True}
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
            await worker.stdin.drain()

        successes: list[dict[str, Any]] = []
        reports: list[dict[str, Any]] = []
        killed_at: list[float] = []

        async def collect(worker: asyncio.subprocess.Process) -> None:
            while True:
                line = await _line(worker)
                if line.get("done"):
                    reports.append(line)
                    return
                assert "failed" not in line, line
                successes.append(line)
                if len(successes) >= KILL_AFTER_SUCCESSES and not killed_at:
                    killed_at.append(time.time())
                    os.killpg(old_leader.pid, signal.SIGKILL)

        await asyncio.wait_for(asyncio.gather(*(collect(w) for w in workers)), RUN_TIMEOUT_S)
        assert killed_at, "the leader was never killed"
        epochs: dict[int, list[int]] = defaultdict(list)
        for success in successes:
            epochs[success["log"]].append(success["epoch"])

        # Every bump succeeded in the end, each with its own epoch.
        assert len(successes) == PROCESSES * BUMPS_PER_PROCESS
        for log_id, taken in epochs.items():
            assert len(set(taken)) == len(taken), f"log {log_id} handed out {sorted(taken)}"
        # The kill fell in the middle of the run: bumps completed after it.
        assert any(s["t"] > killed_at[0] for s in successes)

        # No reported bump was lost: the surviving quorum's next epoch is above all of them.
        survivors = [h for h in ensemble if h.pid != old_leader.pid]
        store = ZooKeeperEpochStore(hosts(survivors), root)
        try:
            for log_id, taken in epochs.items():
                status, meta = await store.get_metadata(LogId(log_id))
                assert status == Status.OK and meta is not None
                assert meta.next_epoch - 1 >= max(taken), (log_id, meta, sorted(taken))
        finally:
            await store.close()
        new_leader = leader(survivors)
        assert new_leader is not None and new_leader.pid != old_leader.pid
        print(f"retries after the kill: {[r['retries'] for r in reports]}, ambiguous writes: "
              f"{sum(r['ambiguous_writes'] for r in reports)}")
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
            await worker.wait()
        await asyncio.to_thread(stop_all, ensemble)
        assert not [h for h in ensemble if zks.alive(h)]
