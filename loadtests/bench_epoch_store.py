"""Latency of one ``activate()`` on the file epoch store (uncontended, one process).

Prints one JSON line: activations measured, p50/p99/max in ms. Usage::

    .venv/bin/python loadtests/bench_epoch_store.py [--activations N] [--dir /abs/dir]

Without ``--dir`` it uses a fresh temporary directory (on the same file system as /tmp; fsync
cost depends on where that is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time

from epoch_store import FileEpochStore
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import LogId, NodeId

LOGS_COUNT = 4
WARMUP_ACTIVATIONS = 10


def percentile_ms(sorted_ns: list[int], fraction: float) -> float:
    index = min(len(sorted_ns) - 1, round(fraction * (len(sorted_ns) - 1)))
    return round(sorted_ns[index] / 1e6, 3)


async def measure(root_dir: str, activations: int) -> dict[str, object]:
    store = FileEpochStore(root_dir)
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
        "bench": "epoch_store.file.activate",
        "activations": activations,
        "latency_ms_p50": percentile_ms(durations_ns, 0.50),
        "latency_ms_p99": percentile_ms(durations_ns, 0.99),
        "latency_ms_max": percentile_ms(durations_ns, 1.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activations", type=int, default=500)
    parser.add_argument("--dir", default="", help="absolute directory (default: a temp dir)")
    args = parser.parse_args()
    if args.activations < 1:
        parser.error("--activations must be at least 1")
    if args.dir:
        result = asyncio.run(measure(args.dir, args.activations))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-epoch-store-") as root_dir:
            result = asyncio.run(measure(root_dir, args.activations))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
