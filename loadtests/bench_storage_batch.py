"""Micro-benchmark of one storage node serving many logs (not a test): closed-loop
STORE_BATCH frames through ``StorageNode.on_message`` (no network), each carrying ``--batch``
one-record STOREs of different logs (``--logs`` logs round-robin), each followed by a
RELEASE_BATCH of the pointers the previous batch's answers released, as a sequencer busy with
many logs sends them (issue 15).

Frames are encoded outside the measurement (the sequencer's cost) and decoded inside it.
``cpu_us_per_record`` is this process's CPU time (all threads) per measured record. Prints one
JSON line.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_storage_batch [--logs 1000]
[--batch 128] [--inflight 2] [--records 60000] [--held-logs 20000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from typing import Any

from shared.config import StorageConfig
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import decode, encode
from shared.wire.store import Store, payloads_checksum
from shared.wire.store_batch import ReleaseBatch, StoreBatch, StoredBatch
from storage_node.runtime import StorageNode

NODE = NodeId("bench-storage")
SEQUENCER = NodeId("bench-seq")
COPYSET = (NODE, NodeId("bench-st2"), NodeId("bench-st3"))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Driver:
    def __init__(self, node: StorageNode, args: argparse.Namespace) -> None:
        self._node = node
        self._args = args
        self._payload = os.urandom(args.size)
        self._next_esn: dict[int, int] = {}
        self._log = 0
        self._first_log = 1
        self._released: dict[int, int] = {}

    def _frame(self) -> tuple[bytes, list[Store]]:
        stores = []
        logs = self._args.logs
        for _ in range(self._args.batch):
            self._log = self._log % logs + 1
            log_id = self._first_log + self._log - 1
            esn = self._next_esn.get(log_id, 1)
            per_store = self._args.per_store
            self._next_esn[log_id] = esn + per_store
            payloads = (self._payload,) * per_store
            stores.append(Store(
                log_id=LogId(log_id), lsn=compose_lsn(Epoch(1), Esn(esn)), wave=1,
                sequencer_node=SEQUENCER, copyset=COPYSET, timestamp_ms=0,
                last_known_good=Esn(max(esn - 1, 0)),
                release_lsn=Lsn(compose_lsn(Epoch(1), Esn(esn - 1)) if esn > 1 else 0),
                timeout_ms=10_000, key=None, payloads=payloads,
                checksum=payloads_checksum(payloads)))
        return encode(StoreBatch(stores=tuple(stores)), 1)[4:], stores

    async def run(self, batches: int) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        frames = [self._frame() for _ in range(batches)]
        remaining = batches
        issued = 0

        def issue() -> None:
            nonlocal issued
            body, stores = frames[issued]
            issued += 1
            decoded = decode(body)
            assert not isinstance(decoded, Status)

            def reply(message: Any) -> None:
                nonlocal remaining
                assert type(message) is StoredBatch and all(
                    s == int(Status.OK) for s in message.statuses), message
                # The sequencer releases what was stored: one RELEASE_BATCH with every log.
                release = ReleaseBatch(releases=tuple(
                    (s.log_id, s.last_lsn) for s in stores))
                released = decode(encode(release, 0)[4:])
                assert not isinstance(released, Status)
                self._node.on_message(SEQUENCER, released[1], lambda _: None)
                remaining -= 1
                if remaining == 0:
                    done.set_result(None)
                elif issued < batches:
                    issue()

            self._node.on_message(SEQUENCER, decoded[1], reply)

        for _ in range(min(self._args.inflight, batches)):
            issue()
        await done


async def bench(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    node = StorageNode(node_id=NODE, data_dir=data_dir,
                       config=StorageConfig(fsync=args.fsync, disk_free_bytes_min=0))
    await node.start()
    try:
        driver = Driver(node, args)
        if args.held_logs:
            # Logs the node already holds (a node that served many logs before): one record
            # each, then the measured logs start after them.
            measured = (args.logs, args.batch, args.per_store)
            args.logs, args.batch, args.per_store = args.held_logs, 128, 1
            await driver.run(max(args.held_logs // args.batch, 1))
            args.logs, args.batch, args.per_store = measured
            driver._first_log, driver._log = args.held_logs + 1, 0
        await driver.run(max(args.logs // args.batch, 1) * 2)
        batches = args.records // (args.batch * args.per_store)
        before = node.stats()
        profiler = None
        if args.profile:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        cpu_start, wall_start = cpu_s(), time.perf_counter()
        await driver.run(batches)
        wall_s = time.perf_counter() - wall_start
        cpu_used_s = cpu_s() - cpu_start
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        after = node.stats()
    finally:
        await node.close()
    records = batches * args.batch * args.per_store
    return {
        "bench": "storage_node.store_batch", "fsync": args.fsync, "logs": args.logs,
        "held_logs": args.held_logs,
        "batch": args.batch, "per_store": args.per_store, "inflight": args.inflight,
        "records": records,
        "records_per_s": round(records / wall_s, 1),
        "cpu_us_per_record": round(cpu_used_s / records * 1e6, 2),
        "fsyncs": after["fsyncs"] - before["fsyncs"],
        "commit_batches": after["commit_batches"] - before["commit_batches"],
        "release_entries": after.get("release_entries", 0) - before.get("release_entries", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=60_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--logs", type=int, default=1000)
    p.add_argument("--batch", type=int, default=128, help="STOREs per STORE_BATCH")
    p.add_argument("--inflight", type=int, default=2, help="STORE_BATCHes outstanding")
    p.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    p.add_argument("--per-store", type=int, default=1, help="records per STORE")
    p.add_argument("--held-logs", type=int, default=0,
                   help="logs the node holds a record of before the measured logs")
    p.add_argument("--profile", default="", help="write a cProfile of the measured phase here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-storage-batch-") as data_dir:
        print(json.dumps(asyncio.run(bench(args, data_dir))))


if __name__ == "__main__":
    main()
