"""In-process micro-benchmark of the sequencer node's HTTP append path: the lean edge
(``services.http_edge``), the front end and the real ``SequencerRuntime``, with the storage
nodes replaced by a transport that answers every STORE with STORED in the next loop
iteration, and the client connections by in-memory transports (no sockets, no kernel).

It prints the CPU per append of that Python path alone, which is what the edge, the front end
and the sequencer cost a node per HTTP append apart from socket I/O and storage traffic; on a
shared machine it is steadier than a cluster benchmark. Prints one JSON line.

With ``--logs N`` the appends go to N logs round-robin (each round's appends to different
logs, as with many busy logs), which is where cross-log STORE batching pays.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_http_path [--connections 256]
[--rounds 200] [--logs 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import msgpack
from aiohttp import web
from prometheus_client import CollectorRegistry

from epoch_store.backends.memory import MemoryEpochStore
from frontend.service import FrontEnd
from sequencer.runtime import SequencerRuntime
from services.http_api import create_api_app
from services.http_edge import EdgeServer
from services.node import GC_GEN0_THRESHOLD
from shared.clock import SystemClock
from shared.config import ClusterConfig, NodeConfig, ProcessConfig, TransportConfig
from shared.net import PeerPool
from shared.status import Status
from shared.types import Epoch, NodeId
from shared.wire.store import Store, Stored
from shared.wire.store_batch import StoreBatch, StoredBatch

WARMUP_ROUNDS = 20
LOOP_TURNS_PER_ROUND = 4
"""Loop iterations per round: staging, STOREs, STOREDs and answers all run."""


class _InstantStorage:
    """The runtime's transport: every STORE (alone or in a STORE_BATCH) is answered OK in the
    next loop iteration."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()

    def request(self, node: NodeId, message: Any, callback: Callable[[Any], None], *,
                timeout_ms: int | None = None) -> None:
        if type(message) is StoreBatch:
            self._loop.call_soon(callback, StoredBatch(
                statuses=(int(Status.OK),) * len(message.stores)))
            return
        assert type(message) is Store, message
        self._loop.call_soon(callback, Stored(
            log_id=message.log_id, lsn=message.lsn, wave=message.wave, status=Status.OK,
            sealed_epoch=Epoch(0), sealed_by=None))

    def send(self, node: NodeId, message: Any) -> bool:
        return True

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any:
        raise AssertionError("not used on the append path")


class _Transport:
    """A client connection's transport: counts the answers written."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def bench(args: argparse.Namespace) -> dict[str, object]:
    seq = NodeId("seq1")
    cluster = ClusterConfig(cluster_name="bench", replication_factor=3, nodes=(
        NodeConfig(node_id=seq, roles=("sequencer",), http_port=9000, data_port=9001),
        *(NodeConfig(node_id=NodeId(f"st{i}"), roles=("storage",), http_port=9010 + i,
                     data_port=9020 + i) for i in range(1, 4))))
    config = ProcessConfig(node_id=seq, cluster=cluster, data_dir="/nonexistent")
    runtime = SequencerRuntime(
        node_id=seq, config=config.sequencer, cluster=cluster, transport=_InstantStorage(),
        epoch_store=MemoryEpochStore(), clock=SystemClock(), rng=random.Random(1))
    await runtime.start()
    pool = PeerPool(node_id=seq, cluster_fingerprint="bench", config=TransportConfig(),
                    addresses=lambda node: None)
    front = FrontEnd(config=config, pool=pool, sequencer=runtime,
                     epoch_store=MemoryEpochStore())
    app = create_api_app(front, config.api, CollectorRegistry())
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    edge = EdgeServer(runner.server, app)
    body = msgpack.packb({"payload": bytes(args.size)}, use_bin_type=True)
    requests = [(b"POST /v1/logs/%d/append HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n"
                 b"Content-Type: application/msgpack\r\nAccept: application/msgpack\r\n"
                 b"X-Seqlog-No-Forward: 1\r\nContent-Length: %d\r\n\r\n"
                 % (log_id, len(body))) + body for log_id in range(1, args.logs + 1)]
    next_log = [0]
    connections = []
    for _ in range(args.connections):
        conn, transport = edge(), _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        connections.append((conn, transport))

    async def one_round() -> None:
        for conn, _ in connections:
            conn.data_received(requests[next_log[0]])
            next_log[0] = (next_log[0] + 1) % len(requests)
        for _ in range(LOOP_TURNS_PER_ROUND):
            await asyncio.sleep(0)

    try:
        # Every log activated before measuring.
        for _ in range(max(WARMUP_ROUNDS, -(-args.logs // args.connections) + 2)):
            await one_round()
        answered_before = sum(t.writes for _, t in connections)
        gc.collect()
        # As a node runs (services.node): start-up objects frozen, generation 0 collected
        # rarely (the append path makes no cycles).
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
        cpu0_s = time.process_time()
        for _ in range(args.rounds):
            await one_round()
        cpu_s = time.process_time() - cpu0_s
        answered = sum(t.writes for _, t in connections) - answered_before
    finally:
        await runtime.close()
        await pool.close()
        await runner.cleanup()
    appends = args.connections * args.rounds
    return {"bench": "seqlog_http_path", "connections": args.connections, "size": args.size,
            "logs": args.logs, "appends": appends, "answered": answered,
            "cpu_us_per_append": round(cpu_s / appends * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--logs", type=int, default=1, help="logs appended to round-robin")
    args = p.parse_args(argv)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        print(json.dumps(runner.run(bench(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
