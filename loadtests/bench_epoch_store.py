"""Epoch store benchmarks on the file and the ZooKeeper epoch stores (one process).

Modes (``--mode``, default ``latency``):

- ``latency``: latency of one ``activate()`` (an epoch bump), uncontended: p50/p99/max in ms.
- ``provision``: how fast new logs get their first epoch, as a sequencer does on the first
  append to a log (``activate`` with a provision spec, then ``get_last_clean_epoch``), with
  ``--concurrency`` logs at a time: logs/s and CPU seconds of this process per 1,000 logs.
- ``clean_marks``: a graceful stop's epoch-store work: ``--logs`` active logs (activated first,
  untimed), then ``set_last_clean_epoch`` for all of them at once, as ``SequencerRuntime.drain``
  does. Reports how many were marked within ``--bound-s`` (the drain's share of the shutdown
  bound) and how long all of them took.

Prints one JSON line per backend and mode. Usage::

    .venv/bin/python loadtests/bench_epoch_store.py [--backend file|zookeeper|both]
        [--mode latency|provision|clean_marks] [--activations N] [--logs N]
        [--concurrency N] [--bound-s S] [--dir /abs/dir] [--zk zk://host:port/root]

Without ``--dir`` the file store lives in a fresh temporary directory (on the same file system
as /tmp; fsync cost depends on where that is). Without ``--zk`` a local standalone ZooKeeper
server (Debian's package, default settings, so every write is fsynced) is started in a
temporary directory and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from epoch_store import CasEpochStore, FileEpochStore, ZooKeeperEpochStore
from epoch_store import zk_server as zks
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId

SPEC = ProvisionSpec(nodeset=(NodeId("s1"), NodeId("s2"), NodeId("s3")), replication_factor=2)
LOGS_COUNT = 4
WARMUP_ACTIVATIONS = 10


def percentile_ms(sorted_ns: list[int], fraction: float) -> float:
    index = min(len(sorted_ns) - 1, round(fraction * (len(sorted_ns) - 1)))
    return round(sorted_ns[index] / 1e6, 3)


async def measure(
    name: str, open_store: Callable[[], CasEpochStore], activations: int
) -> dict[str, object]:
    store = open_store()
    spec = ProvisionSpec(nodeset=(NodeId("s1"), NodeId("s2"), NodeId("s3")), replication_factor=2)
    writer = NodeId("bench")
    try:
        for i in range(WARMUP_ACTIVATIONS):
            await store.activate(LogId(1 + i % LOGS_COUNT), writer=writer, provision=spec)
        durations_ns: list[int] = []
        for i in range(activations):
            started_ns = time.perf_counter_ns()
            status, _, _ = await store.activate(
                LogId(1 + i % LOGS_COUNT), writer=writer, provision=spec
            )
            durations_ns.append(time.perf_counter_ns() - started_ns)
            assert status == Status.OK, status
    finally:
        await store.close()
    durations_ns.sort()
    return {
        "bench": f"epoch_store.{name}.activate",
        "activations": activations,
        "latency_ms_p50": percentile_ms(durations_ns, 0.50),
        "latency_ms_p99": percentile_ms(durations_ns, 0.99),
        "latency_ms_max": percentile_ms(durations_ns, 1.0),
    }


async def measure_provision(
    name: str, open_store: Callable[[], CasEpochStore], logs: int, concurrency: int
) -> dict[str, object]:
    store = open_store()
    writer = NodeId("bench")
    statuses: list[Status] = []
    next_log = iter(range(1, logs + 1))

    async def worker() -> None:
        for log in next_log:
            status, _, _ = await store.activate(LogId(log), writer=writer, provision=SPEC)
            if status == Status.OK:
                status, _ = await store.get_last_clean_epoch(LogId(log))
            statuses.append(status)

    try:
        # One log first, so that one-time set-up (directories, a ZooKeeper session) is not
        # counted.
        await store.activate(LogId(logs + 1), writer=writer, provision=SPEC)
        cpu_s, started_s = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed_s, cpu_s = time.perf_counter() - started_s, time.process_time() - cpu_s
    finally:
        await store.close()
    return {
        "bench": f"epoch_store.{name}.provision",
        "logs": logs,
        "concurrency": concurrency,
        "ok": statuses.count(Status.OK),
        "logs_per_s": round(logs / elapsed_s, 1),
        "cpu_s_per_1000_logs": round(cpu_s / logs * 1000, 3),
    }


async def measure_clean_marks(
    name: str, open_store: Callable[[], CasEpochStore], logs: int, bound_s: float
) -> dict[str, object]:
    store = open_store()
    writer = NodeId("bench")
    sem = asyncio.Semaphore(256)

    async def activate(log: LogId) -> None:
        # As a sequencer activates: take an epoch, then read the last clean epoch.
        async with sem:
            status, _, _ = await store.activate(log, writer=writer, provision=SPEC)
            assert status == Status.OK, status
            status, _ = await store.get_last_clean_epoch(log)
            assert status == Status.OK, status

    marked_in_bound = 0

    async def mark(log: LogId) -> Status:
        nonlocal marked_in_bound
        status = await store.set_last_clean_epoch(log, Epoch(1), Lsn(0))
        if status == Status.OK and time.perf_counter() - started_s <= bound_s:
            marked_in_bound += 1
        return status

    try:
        await asyncio.gather(*(activate(LogId(i)) for i in range(1, logs + 1)))
        cpu_s, started_s = time.process_time(), time.perf_counter()
        statuses = await asyncio.gather(*(mark(LogId(i)) for i in range(1, logs + 1)))
        elapsed_s, cpu_s = time.perf_counter() - started_s, time.process_time() - cpu_s
    finally:
        await store.close()
    return {
        "bench": f"epoch_store.{name}.clean_marks",
        "logs": logs,
        "bound_s": bound_s,
        "marked_within_bound": marked_in_bound,
        "ok": statuses.count(Status.OK),
        "seconds_all": round(elapsed_s, 3),
        "cpu_s": round(cpu_s, 3),
    }


def run_mode(
    name: str, open_store: Callable[[], CasEpochStore], args: argparse.Namespace
) -> dict[str, object]:
    if args.mode == "provision":
        return asyncio.run(measure_provision(name, open_store, args.logs, args.concurrency))
    if args.mode == "clean_marks":
        return asyncio.run(measure_clean_marks(name, open_store, args.logs, args.bound_s))
    return asyncio.run(measure(name, open_store, args.activations))


def bench_file(args: argparse.Namespace) -> dict[str, object]:
    if args.dir:
        return run_mode("file", lambda: FileEpochStore(args.dir), args)
    with tempfile.TemporaryDirectory(prefix="bench-epoch-store-") as root_dir:
        return run_mode("file", lambda: FileEpochStore(root_dir), args)


def bench_zookeeper(args: argparse.Namespace) -> dict[str, object]:
    root = f"/bench-{time.time_ns()}"
    if args.zk:
        return run_mode("zookeeper", lambda: ZooKeeperEpochStore.from_url(args.zk), args)
    with tempfile.TemporaryDirectory(prefix="bench-zookeeper-") as zk_dir:
        server = zks.start_standalone(Path(zk_dir))
        try:
            return run_mode(
                "zookeeper", lambda: ZooKeeperEpochStore(server.address, root), args)
        finally:
            zks.stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("file", "zookeeper", "both"), default="both")
    parser.add_argument("--mode", choices=("latency", "provision", "clean_marks"),
                        default="latency")
    parser.add_argument("--activations", type=int, default=500)
    parser.add_argument("--logs", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--bound-s", type=float, default=5.0)
    parser.add_argument("--dir", default="", help="absolute directory (default: a temp dir)")
    parser.add_argument("--zk", default="", help="zk:// URL (default: a local server)")
    args = parser.parse_args()
    if min(args.activations, args.logs, args.concurrency) < 1 or args.bound_s <= 0:
        parser.error("--activations, --logs, --concurrency and --bound-s must be positive")
    if args.backend in ("file", "both"):
        print(json.dumps(bench_file(args)), flush=True)
    if args.backend in ("zookeeper", "both"):
        print(json.dumps(bench_zookeeper(args)), flush=True)


if __name__ == "__main__":
    main()
