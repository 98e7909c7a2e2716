"""Append latency during a rebuild against a restart without one, in the same run (issue 17).

A local cluster of 3 storage nodes and 2 sequencers (R=2, fsync=always) is filled with
RECORDS records of 200 B in append-batches of 500 (logs 1-4); then 8 writers append single
200 B records to logs 5-8 the whole time while:

1. ``before``: nothing happens (BEFORE_S seconds);
2. ``restart``: st2 is killed with -9 and restarted on its data (no rebuild), for PHASE_S;
3. ``rebuild``: st2 is killed with -9, its data directory wiped and restarted; until the
   cluster state says it is AUTHORITATIVE again (at most PHASE_S);
4. ``after``: PHASE_S more seconds.

Prints p50/p99 of the appends acknowledged in each phase (an append counts in the phase it
was sent in) and the storage processes' CPU per phase.

    python loadtests/bench_rebuild_latency.py DIR RECORDS RATE_BYTES_PER_S [PHASE_S]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from seqlog import Client
from services import local_cluster as lc
from shared.config import StorageConfig

BEFORE_S = 8.0
WRITERS = 8


def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shard(http: str, node: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/v1/cluster", timeout=10) as answer:
        shards = json.loads(answer.read())["shards"]
    found: dict[str, Any] = next(s for s in shards if s["node_id"] == node)
    return found


def wipe(data_dir: str) -> None:
    for name in os.listdir(data_dir):
        if name in ("config.json", "node.log"):
            continue
        path = os.path.join(data_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def fill(urls: list[str], records: int) -> None:
    async with Client(urls, timeout_ms=60_000) as client:
        payload = b"x" * 200
        limit = asyncio.Semaphore(8)

        async def one(i: int) -> None:
            async with limit:
                await client.append_batch(1 + i % 4, [payload] * 500)

        await asyncio.gather(*(one(i) for i in range(records // 500)))


async def run(root: Path, state: lc.ClusterState, phase_s: float) -> dict[str, Any]:
    phase = ["before"]
    latencies: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    stop = asyncio.Event()
    nodes: dict[str, lc.NodeEntry] = {str(n.node_id): n for n in state.nodes}
    storage = ("st1", "st2", "st3")
    pids = {n: nodes[n].pid for n in storage}
    cpu: dict[str, dict[str, float]] = {}

    syncs: dict[str, list[float]] = {}

    def fsync_probe() -> None:
        """4 KiB written and fdatasynced every 20 ms on the nodes' filesystem: how busy the
        (shared) disk is in each phase."""
        path = root / "fsync-probe"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while not stop.is_set():
                started = time.monotonic()
                os.pwrite(fd, b"p" * 4096, 0)
                os.fdatasync(fd)
                syncs.setdefault(phase[0], []).append(time.monotonic() - started)
                time.sleep(0.02)
        finally:
            os.close(fd)

    probe = threading.Thread(target=fsync_probe, daemon=True)
    probe.start()
    async with Client(state.sequencer_urls, timeout_ms=30_000) as client:
        async def writer(w: int) -> None:
            payload = b"y" * 200
            while not stop.is_set():
                name = phase[0]
                started = time.monotonic()
                try:
                    await client.append(5 + w % 4, payload)
                except Exception:
                    failures[name] = failures.get(name, 0) + 1
                    await asyncio.sleep(0.05)
                    continue
                latencies.setdefault(name, []).append(time.monotonic() - started)

        def enter(name: str) -> dict[str, float]:
            phase[0] = name
            return {n: cpu_s(pids[n]) for n in storage}

        def leave(name: str, before: dict[str, float]) -> None:
            cpu[name] = {n: round(cpu_s(pids[n]) - before[n], 2) for n in storage}

        tasks = [asyncio.create_task(writer(w)) for w in range(WRITERS)]
        marks = enter("before")
        await asyncio.sleep(BEFORE_S)
        leave("before", marks)

        marks = enter("restart")
        started = time.monotonic()
        os.kill(pids["st2"], signal.SIGKILL)
        await asyncio.sleep(0.5)
        restarted = await asyncio.to_thread(lc.restart, root, "st2")
        pids["st2"] = restarted.pid
        marks["st2"] = cpu_s(restarted.pid)
        await asyncio.sleep(max(0.0, phase_s - (time.monotonic() - started)))
        leave("restart", marks)

        marks = enter("rebuild")
        started = time.monotonic()
        os.kill(pids["st2"], signal.SIGKILL)
        await asyncio.sleep(0.5)
        wipe(nodes["st2"].data_dir)
        restarted = await asyncio.to_thread(lc.restart, root, "st2")
        pids["st2"] = restarted.pid
        marks["st2"] = cpu_s(restarted.pid)
        rebuilt_s = None
        spy_dir = os.environ.get("BENCH_PY_SPY_DIR")
        if spy_dir:  # profile the rebuild phase (py-spy, raw stacks per thread)
            import subprocess
            for name in ("st1", "st2"):
                subprocess.Popen(  # noqa: ASYNC220 (a profiler, started once)
                    [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "-d",
                     "8", "-r", "250", "-f", "raw", "--threads", "-o",
                     os.path.join(spy_dir, f"{name}.txt"), "-p", str(pids[name])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while time.monotonic() - started < phase_s:
            found = await asyncio.to_thread(shard, nodes["st1"].http, "st2")
            if found["status"] == "AUTHORITATIVE" and found["rebuilds_count"]:
                rebuilt_s = round(time.monotonic() - started, 1)
                break
            await asyncio.sleep(0.2)
        leave("rebuild", marks)

        marks = enter("after")
        await asyncio.sleep(phase_s)
        leave("after", marks)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"rebuilt_s": rebuilt_s, "phases": {
        name: {"appends": len(latencies.get(name, [])), "failed": failures.get(name, 0),
               "p50_ms": pct(latencies.get(name, []), 0.5),
               "p99_ms": pct(latencies.get(name, []), 0.99), "cpu_s": cpu.get(name),
               "fsync_p50_ms": pct(syncs.get(name, []), 0.5),
               "fsync_p99_ms": pct(syncs.get(name, []), 0.99)}
        for name in ("before", "restart", "rebuild", "after")}}


def main(argv: list[str]) -> None:
    root, records, rate = Path(argv[1]), int(argv[2]), int(argv[3])
    phase_s = float(argv[4]) if len(argv) > 4 else 20.0
    shutil.rmtree(root, ignore_errors=True)
    state = lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=2, replication=2, base_port=lc.free_base_port(5),
        fsync="always", storage=StorageConfig(rebuild_rate_bytes_per_s=rate)),
        ready_timeout_ms=60_000)
    try:
        asyncio.run(fill(state.sequencer_urls, records))
        result = asyncio.run(run(root, state, phase_s))
        print(json.dumps({"records": records, "rate_limit": rate, **result}, indent=1))
    finally:
        lc.down(root)


if __name__ == "__main__":
    main(sys.argv)
