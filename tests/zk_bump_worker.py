"""One racing process of the ZooKeeper ensemble test: bumps epochs and reports each success.

Run as ``python -m tests.zk_bump_worker HOSTS ROOT WRITER BUMPS LOGS PACE_MS``. It connects,
prints ``{"ready": true}``, waits for a line on stdin, then starts ``BUMPS`` activations, one
every ``PACE_MS`` ms, round-robin over logs ``1..LOGS``, all running concurrently. An
activation that fails with a retryable status is retried (as a sequencer would) until it
succeeds; every success is printed as ``{"log": L, "epoch": E, "t": unix_s}`` the moment it is
known, and the last line is ``{"done": true, "retries": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter

from epoch_store import ZkOptions, ZooKeeperEpochStore
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import LogId, NodeId

SPEC = ProvisionSpec(nodeset=(NodeId("s1"), NodeId("s2"), NodeId("s3")), replication_factor=2)
BUMP_DEADLINE_S = 60.0
RETRY_DELAY_S = 0.05


def _emit(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def _bump(store: ZooKeeperEpochStore, log_id: LogId, writer: NodeId,
                retries: Counter[str]) -> None:
    deadline = time.monotonic() + BUMP_DEADLINE_S
    while True:
        status, epoch, _ = await store.activate(log_id, writer=writer, provision=SPEC)
        if status == Status.OK:
            _emit({"log": log_id, "epoch": epoch, "t": time.time()})
            return
        if not status.retryable or time.monotonic() > deadline:
            _emit({"failed": status.name, "log": log_id})
            return
        retries[status.name] += 1
        await asyncio.sleep(RETRY_DELAY_S)


async def main(hosts: str, root: str, writer: str, bumps: int, logs: int, pace_ms: int) -> None:
    store = ZooKeeperEpochStore(hosts, root, options=ZkOptions(op_timeout_ms=3_000))
    retries: Counter[str] = Counter()
    try:
        status, _ = await store.get_metadata(LogId(1))
        assert status in (Status.OK, Status.NOTFOUND), status
        _emit({"ready": True})
        await asyncio.to_thread(sys.stdin.readline)
        tasks = []
        for i in range(bumps):
            log_id = LogId(1 + i % logs)
            tasks.append(asyncio.create_task(_bump(store, log_id, NodeId(writer), retries)))
            await asyncio.sleep(pace_ms / 1000)
        await asyncio.gather(*tasks)
    finally:
        await store.close()
    _emit({"done": True, "retries": dict(retries),
           "ambiguous_writes": store.zk.ambiguous_writes_count})


if __name__ == "__main__":
    hosts_arg, root_arg, writer_arg, bumps_arg, logs_arg, pace_arg = sys.argv[1:7]
    asyncio.run(main(hosts_arg, root_arg, writer_arg, int(bumps_arg), int(logs_arg),
                     int(pace_arg)))
