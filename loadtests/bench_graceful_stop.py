"""Many logs on one sequencer, end to end (issue 15): how fast first appends provision new logs,
and whether a graceful stop leaves every epoch clean so that the restart recovers nothing.

Starts a local cluster (3 storage nodes, 1 sequencer, R=3, storage ``fsync=never`` so that the
epoch store's cost shows; the file epoch store, or ``--with-zookeeper`` for a local ZooKeeper),
appends one record to each of ``--logs`` new logs through ``seqlog.Client`` (256 in flight),
then one more to each (the cost of an append without provisioning, for comparison), SIGTERMs
the sequencer (its own 20 s shutdown bound applies; SIGKILL only after 30 s), checks in the
epoch store that the last epoch of every log is clean, restarts the sequencer, appends to
every 10th log and reads how many recoveries the new sequencer started. Wall-clock rates
depend on the machine's load; the sequencer's CPU per log is the figure to compare.
Prints one JSON line::

    .venv/bin/python loadtests/bench_graceful_stop.py [--logs 10000] [--with-zookeeper]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import urllib.request
from pathlib import Path

from epoch_store import open_epoch_store
from seqlog import Client
from services import local_cluster as lc
from shared.status import Status
from shared.types import LogId

APPENDS_INFLIGHT_MAX = 256
STOP_TIMEOUT_MS = 30_000


def _metric(http: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _append_each(urls: list[str], logs: list[int], payload: bytes) -> None:
    sem = asyncio.Semaphore(APPENDS_INFLIGHT_MAX)
    async with Client(urls, timeout_ms=60_000) as client:

        async def append(log: int) -> None:
            async with sem:
                await client.append(log, payload)

        await asyncio.gather(*(append(log) for log in logs))


async def _clean_count(url: str, logs: list[int]) -> int:
    store = open_epoch_store(url)
    clean = 0
    try:
        for log in logs:
            status, meta = await store.get_metadata(LogId(log))
            _, lce = await store.get_last_clean_epoch(LogId(log))
            if status == Status.OK and meta and lce and lce.epoch == meta.next_epoch - 1:
                clean += 1
    finally:
        await store.close()
    return clean


def run(root: Path, logs_count: int, with_zookeeper: bool) -> dict[str, object]:
    state = lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never", with_zookeeper=with_zookeeper),
        ready_timeout_ms=60_000)
    try:
        sequencer = next(n for n in state.nodes if "sequencer" in n.roles)
        logs = list(range(1, logs_count + 1))
        cpu_s, started_s = _cpu_s(sequencer.pid), time.perf_counter()
        asyncio.run(_append_each(state.sequencer_urls, logs, b"first"))
        provision_s = time.perf_counter() - started_s
        cpu_s = _cpu_s(sequencer.pid) - cpu_s
        # The same logs again, now active: what an append costs without provisioning.
        again_cpu_s, started_s = _cpu_s(sequencer.pid), time.perf_counter()
        asyncio.run(_append_each(state.sequencer_urls, logs, b"second"))
        again_s = time.perf_counter() - started_s
        again_cpu_s = _cpu_s(sequencer.pid) - again_cpu_s
        started_s = time.perf_counter()
        lc.stop_nodes(root, [sequencer], stop_timeout_ms=STOP_TIMEOUT_MS)
        stop_s = time.perf_counter() - started_s
        node_log = (root / sequencer.node_id / "node.log").read_text(errors="replace")
        clean = asyncio.run(_clean_count(state.epoch_store, logs))
        restarted = lc.restart(root, sequencer.node_id)
        asyncio.run(_append_each(state.sequencer_urls, logs[::10], b"after"))
        recoveries = _metric(restarted.http, 'seqlog_sequencer_recovery_phases{phase="SEALING"}')
    finally:
        lc.down(root)
    return {
        "bench": "graceful_stop_many_logs",
        "epoch_store": "zookeeper" if with_zookeeper else "file",
        "logs": logs_count,
        "first_append_logs_per_s": round(logs_count / provision_s, 1),
        "sequencer_cpu_ms_per_new_log": round(cpu_s / logs_count * 1000, 3),
        "second_append_logs_per_s": round(logs_count / again_s, 1),
        "sequencer_cpu_ms_per_second_append": round(again_cpu_s / logs_count * 1000, 3),
        "stop_s": round(stop_s, 2),
        "stop_overran": "graceful shutdown overran" in node_log,
        "epochs_clean_after_stop": clean,
        "recoveries_after_restart": int(recoveries),
        "logs_appended_after_restart": len(logs[::10]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=10_000)
    parser.add_argument("--with-zookeeper", action="store_true")
    parser.add_argument("--dir", default="", help="cluster directory (default: a temp dir)")
    args = parser.parse_args()
    if args.logs < 10:
        parser.error("--logs must be at least 10")
    if args.dir:
        print(json.dumps(run(Path(args.dir), args.logs, args.with_zookeeper)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-graceful-stop-") as root:
        print(json.dumps(run(Path(root), args.logs, args.with_zookeeper)), flush=True)


if __name__ == "__main__":
    main()
