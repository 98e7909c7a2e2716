"""CPU per append of ``SequencerRuntime`` alone (not a test): the driver, its effect glue
(``sequencer/handlers.py``) and the cores, with a transport that answers every STORE (and
STORE_BATCH, where the tree has it) with OK on the next loop turn (no network, no storage
node, no decoding).

``--inflight`` appends are kept outstanding over ``--logs`` logs (4 by default;
round-robin, each log activated before the measured phase); prints one JSON line with this
process's CPU time per append. For a same-run A/B of two source trees, interleave runs:

    for i in 1 2 3; do for t in /path/before /path/after; do
      PYTHONPATH=$t .venv/bin/python -m loadtests.bench_sequencer_glue; done; done
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

from epoch_store import open_epoch_store
from sequencer.runtime import SequencerRuntime
from shared.clock import SystemClock
from shared.config import ClusterConfig, NodeConfig, SequencerConfig
from shared.status import Status
from shared.types import Epoch, LogId, NodeId
from shared.wire.store import Store, Stored

STORAGE = tuple(NodeId(f"st{i}") for i in range(1, 4))
LOGS = 4


class InstantTransport:
    """STORED OK for every STORE, next loop turn; every other request fails."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def request(self, node: NodeId, message: Any, callback: Callable[[Any], None], *,
                timeout_ms: int | None = None) -> None:
        if type(message) is Store:
            self._loop.call_soon(callback, Stored(
                log_id=message.log_id, lsn=message.lsn, wave=message.wave, status=Status.OK,
                sealed_epoch=Epoch(0), sealed_by=None))
        elif type(message).__name__ == "StoreBatch":
            from shared.wire.store_batch import StoredBatch  # trees before batching lack it
            self._loop.call_soon(callback, StoredBatch(
                statuses=(int(Status.OK),) * len(message.stores)))
        else:
            self._loop.call_soon(callback, Status.CONNFAILED)

    def send(self, node: NodeId, message: Any) -> bool:
        return True

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any:
        return Status.CONNFAILED


async def run(appends: int, inflight: int, logs: int = LOGS, shared_waves: bool = True) -> float:
    cluster = ClusterConfig(
        nodes=(NodeConfig(node_id=NodeId("seq"), roles=("sequencer",)),
               *(NodeConfig(node_id=n, roles=("storage",), data_port=1) for n in STORAGE)),
        replication_factor=3)
    store = open_epoch_store(f"file://{tempfile.mkdtemp(prefix='bench-glue-')}/epochs")
    runtime = SequencerRuntime(
        node_id=NodeId("seq"), config=SequencerConfig(shared_waves=shared_waves), cluster=cluster,
        transport=InstantTransport(asyncio.get_running_loop()), epoch_store=store,
        clock=SystemClock(), rng=random.Random(1))
    await runtime.start()
    for first in range(1, logs + 1, 256):
        await asyncio.gather(*(runtime.append(LogId(log), (b"warm",), None)
                               for log in range(first, min(first + 256, logs + 1))))
    done = asyncio.Event()
    issued = answered = 0
    payload = (b"p" * 100,)

    def issue() -> None:
        nonlocal issued
        issued += 1
        runtime.append_nowait(LogId(1 + issued % logs), payload, None, None, on_answer)

    def on_answer(result: Any) -> None:
        nonlocal answered
        answered += 1
        if issued < appends:
            issue()
        elif answered == appends:
            done.set()

    started_s = time.process_time()
    for _ in range(inflight):
        issue()
    await done.wait()
    cpu_s = time.process_time() - started_s
    await runtime.close()
    await store.close()
    return cpu_s / appends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=60_000)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--logs", type=int, default=LOGS)
    parser.add_argument("--no-shared-waves", action="store_true",
                        help="sequencer.shared_waves off (each appender its own first wave)")
    args = parser.parse_args()
    cpu_s = asyncio.run(run(args.appends, args.inflight, args.logs, not args.no_shared_waves))
    print(json.dumps({"bench": "sequencer_glue", "appends": args.appends,
                      "inflight": args.inflight, "logs": args.logs,
                      "shared_waves": not args.no_shared_waves,
                      "cpu_us_per_append": round(cpu_s * 1e6, 2)}))


if __name__ == "__main__":
    main()
