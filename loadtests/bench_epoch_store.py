"""Latency of one ``activate()`` (an epoch bump) on the file and the ZooKeeper epoch stores
(uncontended, one process).

Prints one JSON line per backend: activations measured, p50/p99/max in ms. Usage::

    .venv/bin/python loadtests/bench_epoch_store.py [--backend file|zookeeper|both]
        [--activations N] [--dir /abs/dir] [--zk zk://host:port/root]

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
from shared.types import LogId, NodeId

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


def bench_file(directory: str, activations: int) -> dict[str, object]:
    if directory:
        return asyncio.run(measure("file", lambda: FileEpochStore(directory), activations))
    with tempfile.TemporaryDirectory(prefix="bench-epoch-store-") as root_dir:
        return asyncio.run(measure("file", lambda: FileEpochStore(root_dir), activations))


def bench_zookeeper(url: str, activations: int) -> dict[str, object]:
    root = f"/bench-{time.time_ns()}"
    if url:
        return asyncio.run(measure("zookeeper", lambda: ZooKeeperEpochStore.from_url(url),
                                   activations))
    with tempfile.TemporaryDirectory(prefix="bench-zookeeper-") as zk_dir:
        server = zks.start_standalone(Path(zk_dir))
        try:
            return asyncio.run(measure(
                "zookeeper", lambda: ZooKeeperEpochStore(server.address, root), activations))
        finally:
            zks.stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("file", "zookeeper", "both"), default="both")
    parser.add_argument("--activations", type=int, default=500)
    parser.add_argument("--dir", default="", help="absolute directory (default: a temp dir)")
    parser.add_argument("--zk", default="", help="zk:// URL (default: a local server)")
    args = parser.parse_args()
    if args.activations < 1:
        parser.error("--activations must be at least 1")
    if args.backend in ("file", "both"):
        print(json.dumps(bench_file(args.dir, args.activations)), flush=True)
    if args.backend in ("zookeeper", "both"):
        print(json.dumps(bench_zookeeper(args.zk, args.activations)), flush=True)


if __name__ == "__main__":
    main()
