"""Throughput micro-benchmark of the node-to-node transport (not a test).

A server process answers every STORE with STORED at once; this process keeps ``--inflight``
1 KiB STOREs outstanding through one ``PeerPool`` connection for ``--duration-s`` seconds
and prints one JSON line with the request rate. Run:

    .venv/bin/python loadtests/bench_transport.py [--inflight 256] [--duration-s 5] [--asyncio]
        [--tls]

``--tls``: mutual TLS between the two ends with node certificates (docs/SECURITY.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import uvloop

from shared.config import TlsConfig, TransportConfig
from shared.net import PeerPool, ReplyFn, start_server
from shared.net.node_auth import NodeSecurity
from shared.status import Status
from shared.tls import NodeTls
from shared.types import Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.codec import Message
from shared.wire.store import Store, Stored, payloads_checksum

FINGERPRINT = "bench"
SERVER_ID = NodeId("server")
CONFIG = TransportConfig()
WARMUP_S = 0.5


class EchoStored:
    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        if isinstance(message, Store):
            reply(Stored(log_id=message.log_id, lsn=message.lsn, wave=message.wave,
                         status=Status.OK, sealed_epoch=Epoch(0), sealed_by=None))


def _security(tls_dir: str | None) -> NodeSecurity | None:
    if tls_dir is None:
        return None
    return NodeSecurity(tls=NodeTls(TlsConfig(
        cert_file=f"{tls_dir}/node.pem", key_file=f"{tls_dir}/node-key.pem",
        ca_file=f"{tls_dir}/ca.pem")))


def run_server(port_out: multiprocessing.SimpleQueue[int], use_uvloop: bool,
               tls_dir: str | None = None) -> None:
    async def main() -> None:
        server = await start_server("127.0.0.1", 0, node_id=SERVER_ID,
                                    cluster_fingerprint=FINGERPRINT, handler=EchoStored(),
                                    config=CONFIG, security=_security(tls_dir))
        port_out.put(server.port)
        await asyncio.Event().wait()  # runs until the parent terminates this process

    runner = uvloop.run if use_uvloop else asyncio.run
    runner(main())


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) used so far by process ``pid``; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_store(payload_bytes: int) -> Store:
    payloads = (b"\x5a" * payload_bytes,)
    return Store(log_id=LogId(1), lsn=Lsn(1), wave=1, sequencer_node=NodeId("client"),
                 copyset=(SERVER_ID,), timestamp_ms=0, last_known_good=Esn(0),
                 release_lsn=Lsn(0), timeout_ms=1000, key=None, payloads=payloads,
                 checksum=payloads_checksum(payloads))


async def drive(port: int, server_pid: int, inflight: int, duration_s: float,
                payload_bytes: int, tls_dir: str | None = None) -> dict[str, object]:
    pool = PeerPool(node_id=NodeId("client"), cluster_fingerprint=FINGERPRINT, config=CONFIG,
                    addresses=lambda node: ("127.0.0.1", port), security=_security(tls_dir))
    message = make_store(payload_bytes)
    assert isinstance(await pool.call(SERVER_ID, message, timeout_ms=5_000), Stored)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[float, float]] = loop.create_future()
    state: dict[str, float] = {"completed": 0, "errors": 0, "measuring": False,
                               "server_cpu_s": float("nan")}
    start_s = loop.time()
    measure_from_s = start_s + WARMUP_S
    stop_s = measure_from_s + duration_s
    at_start: tuple[int, int, float, float | None] = (0, 0, 0.0, None)

    def on_reply(result: Message | Status) -> None:
        nonlocal at_start
        if done.done():
            return  # the stragglers after the measurement, or SHUTDOWN from close()
        now_s = loop.time()
        if not isinstance(result, Stored):
            state["errors"] += 1
        if state["measuring"]:
            state["completed"] += 1
        elif now_s >= measure_from_s:
            state["measuring"] = True
            at_start = (pool.counters.writes, pool.counters.frames_sent, time.process_time(),
                        process_cpu_s(server_pid))
        if now_s < stop_s:
            pool.request(SERVER_ID, message, callback)
        else:
            done.set_result((now_s, time.process_time()))
            server_cpu_s = process_cpu_s(server_pid)
            if server_cpu_s is not None and at_start[3] is not None:
                state["server_cpu_s"] = server_cpu_s - at_start[3]

    callback: Callable[[Message | Status], None] = on_reply
    for _ in range(inflight):
        pool.request(SERVER_ID, message, callback)
    end_s, end_cpu_s = await done
    writes = pool.counters.writes - at_start[0]
    frames = pool.counters.frames_sent - at_start[1]
    await pool.close()
    elapsed_s = end_s - measure_from_s
    completed = int(state["completed"])
    return {
        "bench": "transport_store_stored",
        "requests_per_s": round(completed / elapsed_s),
        "client_cpu_us_per_request": round((end_cpu_s - at_start[2]) / completed * 1e6, 1),
        "server_cpu_us_per_request": round(state["server_cpu_s"] / completed * 1e6, 1),
        "inflight": inflight,
        "payload_bytes": payload_bytes,
        "duration_s": round(elapsed_s, 3),
        "errors": state["errors"],
        "client_frames_per_write": round(frames / max(writes, 1), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--asyncio", action="store_true", help="plain asyncio instead of uvloop")
    parser.add_argument("--tls", action="store_true", help="mutual TLS between the ends")
    args = parser.parse_args()
    tls_dir: str | None = None
    if args.tls:
        from services.certs import make_secure_dir
        tls_dir = tempfile.mkdtemp(prefix="bench-transport-tls-")
        make_secure_dir(Path(tls_dir))
    use_uvloop = not args.asyncio
    context = multiprocessing.get_context("spawn")
    port_out: multiprocessing.SimpleQueue[int] = context.SimpleQueue()
    server = context.Process(target=run_server, args=(port_out, use_uvloop, tls_dir),
                             daemon=True)
    server.start()
    try:
        port = port_out.get()
        runner = uvloop.run if use_uvloop else asyncio.run
        started = time.monotonic()
        assert server.pid is not None
        result = runner(drive(port, server.pid, args.inflight, args.duration_s, args.payload_bytes,
                              tls_dir))
        result["loop"] = "uvloop" if use_uvloop else "asyncio"
        result["tls"] = args.tls
        result["wall_s"] = round(time.monotonic() - started, 3)
        print(json.dumps(result))
    finally:
        server.terminate()
        server.join(timeout=5)


if __name__ == "__main__":
    main()
