"""A million logs (issue 15, done-when 3): the sequencer's memory with ``--provisioned`` logs in
the epoch store and ``--active`` of them active.

Starts a local cluster (3 storage nodes, 1 sequencer, R=3, storage ``fsync=never``; the file
epoch store, or ``--with-zookeeper``), then:

1. provisions ``--provisioned`` logs straight in the cluster's epoch store, as sequencers would
   have over the cluster's life: each gets an epoch and is marked clean at it (a log that
   was used and then stopped gracefully), ``--concurrency`` at a time;
2. restarts the sequencer, so that it starts with all of them in the store, and reads its RSS
   once it is ready and idle;
3. appends one 100-byte record to each of the first ``--active`` logs (256 in flight) through
   ``seqlog.Client``: each takes a new epoch (no recovery: its last epoch is clean) and stays
   active (``idle_deactivate_ms`` is far longer than the run);
4. reads the sequencer's RSS again (and its peak, VmHWM), and how many logs it holds.

Prints one JSON line::

    .venv/bin/python -m loadtests.bench_many_logs_rss [--provisioned 1000000] [--active 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from epoch_store.factory import open_epoch_store
from seqlog import Client
from services import local_cluster as lc
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import LogId, Lsn, NodeId

FIRST_APPENDS_INFLIGHT = 256
ATTEMPTS = 5
"""Tries per log when the epoch store times out (a loaded machine's ZooKeeper does)."""
SETTLE_S = 3.0
"""After the appends: let release broadcasts and allocator caches settle before reading RSS."""


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _memory(pid: int) -> dict[str, float]:
    return {"rss_mib": round(_status_kib(pid, "VmRSS") / 1024, 1),
            "peak_rss_mib": round(_status_kib(pid, "VmHWM") / 1024, 1)}


def _metric(http_addr: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def _provision(url: str, spec: ProvisionSpec, logs: int, concurrency: int) -> float:
    store = open_epoch_store(url)
    writer = NodeId("bench")
    next_log = iter(range(1, logs + 1))

    async def worker() -> None:
        for log in next_log:
            for _ in range(ATTEMPTS):
                # A timed-out activation may have taken an epoch: mark clean the epoch that
                # the successful one took, whatever it is.
                status, epoch, _ = await store.activate(LogId(log), writer=writer,
                                                        provision=spec)
                if status is Status.OK:
                    status = await store.set_last_clean_epoch(LogId(log), epoch, Lsn(0))
                if status is not Status.TIMEDOUT:
                    break
            if status is not Status.OK:
                raise RuntimeError(f"log {log}: {status.name}")

    started_s = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await store.close()
    return time.perf_counter() - started_s


async def _first_appends(urls: list[str], logs: int) -> int:
    sem = asyncio.Semaphore(FIRST_APPENDS_INFLIGHT)
    failed = 0
    async with Client(urls, timeout_ms=120_000) as client:

        async def append(log: int) -> None:
            nonlocal failed
            async with sem:
                try:
                    await client.append(log, b"x" * 100)
                except Exception:  # counted: the figure is only valid with none
                    failed += 1

        await asyncio.gather(*(append(log) for log in range(1, logs + 1)))
    return failed


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    spec = lc.LocalClusterSpec(dir=root, storage_nodes=3, sequencers=1, replication=3,
                               base_port=lc.free_base_port(4), fsync="never",
                               with_zookeeper=args.with_zookeeper)
    state = lc.up(spec, ready_timeout_ms=120_000)
    try:
        storage = tuple(NodeId(n.node_id) for n in state.nodes if "storage" in n.roles)
        sequencer = next(n for n in state.nodes if "sequencer" in n.roles)
        url = state.epoch_store
        provision_s = asyncio.run(_provision(
            url, ProvisionSpec(nodeset=storage, replication_factor=3), args.provisioned,
            args.concurrency))
        restart_started_s = time.perf_counter()
        sequencer = lc.restart(root, sequencer.node_id, ready_timeout_ms=300_000)
        restart_s = time.perf_counter() - restart_started_s
        time.sleep(SETTLE_S)
        idle = _memory(sequencer.pid)
        started_s = time.perf_counter()
        failed = asyncio.run(_first_appends([f"http://{sequencer.http}"], args.active))
        activate_s = time.perf_counter() - started_s
        time.sleep(SETTLE_S)
        active = _memory(sequencer.pid)
        held = _metric(sequencer.http, "seqlog_sequencer_logs")
        recoveries = _metric(sequencer.http, 'seqlog_sequencer_recovery_phases{phase="SEALING"}')
    finally:
        lc.down(root)
    return {
        "bench": "many_logs_rss",
        "epoch_store": "zookeeper" if args.with_zookeeper else "file",
        "provisioned_logs": args.provisioned,
        "provision_logs_per_s": round(args.provisioned / provision_s, 1),
        "sequencer_restart_s": round(restart_s, 2),
        "sequencer_after_restart": idle,
        "active_logs": args.active,
        "activate_logs_per_s": round(args.active / activate_s, 1),
        "appends_failed": failed,
        "sequencer_logs_held": held,
        "recoveries": recoveries,
        "sequencer_with_active_logs": active,
        "rss_bar_mib": 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provisioned", type=int, default=1_000_000)
    parser.add_argument("--active", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--with-zookeeper", action="store_true")
    parser.add_argument("--dir", default="", help="cluster directory (default: a temp dir)")
    args = parser.parse_args()
    if args.dir:
        print(json.dumps(run(Path(args.dir), args)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-many-logs-") as root:
        print(json.dumps(run(Path(root), args)))


if __name__ == "__main__":
    main()
