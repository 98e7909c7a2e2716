"""Closed-loop append benchmark for Seqlog, same semantics as the peer benchmarks
(shared/peers/common.py) so the numbers can be put side by side.

``--client seqlog`` is the public ``seqlog.Client`` over the binary protocol (its default),
``seqlog-http`` the same client over HTTP/msgpack, ``raw`` a minimal HTTP/1.1 client. With
``--dir`` the output also gives the CPU the sequencer nodes' processes spent per record over
the measured phase (``sequencer_cpu_us_per_record``, from /proc/PID/stat), and every run the
client's own (``client_cpu_us_per_record``).

At most ``--inflight`` requests are outstanding; each carries ``--batch`` records (one
append, or one append-batch when B > 1). Latency is per request, from just before it is
issued to its acknowledgement; throughput counts records, MB is 10^6 bytes of payload.
``--warmup`` records go first, unmeasured; they also teach the client each log's sequencer,
so measured requests go straight to it. Prints one JSON line.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_append --dir DIR ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Literal

from loadtests.raw_append_client import LoopConnections, RawAppender
from seqlog import Client, LogError
from services.local_cluster import load_state


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group()
    target.add_argument("--url", action="append", help="node URL (repeatable)")
    target.add_argument("--dir", type=Path, help="local cluster directory (cluster.json)")
    p.add_argument("--records", type=int, default=10000, help="measured records (after warmup)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes per record")
    p.add_argument("--inflight", type=int, default=1, help="max outstanding requests")
    p.add_argument("--batch", type=int, default=1, help="records per request (>1: append-batch)")
    p.add_argument("--logs", type=int, default=1, help="logs written round-robin")
    p.add_argument("--first-log", type=int, default=1, help="id of the first log written")
    p.add_argument("--warmup", type=int, default=200, help="unmeasured records sent first")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--retries", type=int, default=5, help="client retries on 429/503")
    p.add_argument("--timeout-ms", type=int, default=30_000, help="client request timeout")
    p.add_argument("--label", default="", help="free text copied into the JSON output")
    p.add_argument("--client", choices=["seqlog", "seqlog-http", "raw"], default="seqlog",
                   help="seqlog: the public seqlog.Client (binary protocol); seqlog-http: the "
                        "same client with protocol='http' (aiohttp); raw: a minimal keep-alive "
                        "HTTP/1.1 client that costs far less CPU per request "
                        "(loadtests.raw_append_client), to measure the servers")
    return p


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def loadavg() -> str | None:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return None


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far (Linux), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Phase:
    """Latencies, errors and CPU of one closed-loop run."""

    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.errors: Counter[str] = Counter()
        self.records_ok = 0
        self.elapsed_s = 0.0
        self.cpu_s = 0.0
        self.server_cpu_s: dict[str, float] = {}
        """CPU seconds each sequencer node's process spent during the phase."""


async def closed_loop(
    op: Callable[[int], Awaitable[int]], requests: int, inflight: int, start_index: int = 0,
    server_pids: dict[str, int] | None = None,
) -> Phase:
    """Run ``await op(i)`` (returns records written) for ``requests`` indices with
    ``inflight`` workers sharing one iterator."""
    phase = Phase()
    indices = iter(range(start_index, start_index + requests))
    pc = time.perf_counter

    async def worker() -> None:
        for i in indices:
            t0 = pc()
            try:
                written = await op(i)
            except LogError as exc:
                phase.errors[exc.status.name] += 1
                continue
            phase.latencies_s.append(pc() - t0)
            phase.records_ok += written

    pids = server_pids or {}
    s0 = {node: process_cpu_s(pid) for node, pid in pids.items()}
    c0 = cpu_s()
    t0 = pc()
    await asyncio.gather(*(worker() for _ in range(max(1, inflight))))
    phase.elapsed_s = pc() - t0
    phase.cpu_s = cpu_s() - c0
    for node, pid in pids.items():
        before, after = s0[node], process_cpu_s(pid)
        if before is not None and after is not None:
            phase.server_cpu_s[node] = after - before
    return phase


def report(args: argparse.Namespace, phase: Phase, urls: list[str]) -> dict[str, Any]:
    lat = sorted(phase.latencies_s)
    el = phase.elapsed_s
    n = phase.records_ok
    out: dict[str, Any] = {
        "bench": "seqlog_append",
        "label": args.label,
        "records": n,
        "requests": len(lat),
        "size": args.size,
        "inflight": args.inflight,
        "batch": args.batch,
        "logs": args.logs,
        "loop": args.loop,
        "client": args.client,
        "elapsed_s": round(el, 4),
        "records_per_s": round(n / el, 1) if el > 0 else None,
        "MB_per_s": round(n * args.size / el / 1e6, 3) if el > 0 else None,
        "p50_ms": round(percentile(lat, 50) * 1e3, 4),
        "p99_ms": round(percentile(lat, 99) * 1e3, 4),
        "p999_ms": round(percentile(lat, 99.9) * 1e3, 4),
        "max_ms": round(lat[-1] * 1e3, 4) if lat else None,
        "client_cpu_util": round(phase.cpu_s / el, 3) if el > 0 else None,
        "client_cpu_us_per_record": round(phase.cpu_s / n * 1e6, 2) if n else None,
        "sequencer_cpu_us_per_record": (
            round(sum(phase.server_cpu_s.values()) / n * 1e6, 2)
            if n and phase.server_cpu_s else None),
        "sequencer_cpu_s": {k: round(v, 3) for k, v in phase.server_cpu_s.items()},
        "loadavg_start": args.loadavg_start,
        "loadavg_end": loadavg(),
        "errors": dict(phase.errors),
        "urls": urls,
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(out), flush=True)
    return out


def sequencer_pids(args: argparse.Namespace) -> dict[str, int]:
    """The sequencer nodes' process ids of a local cluster (``--dir``), else none."""
    if args.dir is None:
        return {}
    state = load_state(args.dir.resolve())
    if state is None:
        return {}
    return {n.node_id: n.pid for n in state.nodes if "sequencer" in n.roles}


def cluster_ca(args: argparse.Namespace) -> str | None:
    """The CA of a secure local cluster (``local up --secure``), else SEQLOG_CA, else none."""
    if args.dir is not None:
        state = load_state(args.dir.resolve())
        if state is not None and state.ca_file:
            return state.ca_file
    return os.environ.get("SEQLOG_CA") or None


def resolve_urls(args: argparse.Namespace) -> list[str]:
    if args.dir is not None:
        state = load_state(args.dir.resolve())
        if state is None:
            raise SystemExit(json.dumps({"error": f"no cluster.json in {args.dir}"}))
        return state.sequencer_urls
    return list(args.url or ["http://127.0.0.1:7400"])


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.client == "raw":
        return await bench_raw(args)
    urls = resolve_urls(args)
    payload = os.urandom(args.size)
    batch = [payload] * args.batch
    first_log, logs = args.first_log, args.logs
    protocol: Literal["binary", "http"] = "http" if args.client == "seqlog-http" else "binary"
    async with Client(
        urls, connections_max=args.inflight, retries_max=args.retries, timeout_ms=args.timeout_ms,
        protocol=protocol, ca=cluster_ca(args),
    ) as client:

        async def one(i: int) -> int:
            await client.append(first_log + i % logs, payload)
            return 1

        async def many(i: int) -> int:
            result = await client.append_batch(first_log + i % logs, batch)
            return result.count

        op = many if args.batch > 1 else one
        # Every log gets at least one warmup request, so each log's sequencer is known.
        warmup_requests = max(math.ceil(args.warmup / args.batch), logs)
        warm = await closed_loop(op, warmup_requests, args.inflight)
        if warm.errors and not warm.latencies_s:
            raise SystemExit(json.dumps({"error": f"warmup failed: {dict(warm.errors)}"}))
        requests = math.ceil(args.records / args.batch)
        phase = await closed_loop(op, requests, args.inflight, start_index=warmup_requests,
                                  server_pids=sequencer_pids(args))
    return report(args, phase, urls)


async def bench_raw(args: argparse.Namespace) -> dict[str, Any]:
    """``bench`` with ``loadtests.raw_append_client``: same closed loop, same report. With at
    least one connection per log (``--inflight`` >= ``--logs``) the requests go out from the
    connections' read callbacks (``RawAppender.loop_connections``: no coroutine step per
    request); connection *k* then always appends to log ``first_log + k % logs``."""
    urls = resolve_urls(args)
    payloads = [os.urandom(args.size)] * args.batch
    first_log, logs, batch = args.first_log, args.logs, args.batch
    appender = RawAppender(urls)
    try:
        for log_id in range(first_log, first_log + logs):
            await appender.prepare(log_id, payloads)
        warmup_requests = max(math.ceil(args.warmup / batch), logs)
        requests = math.ceil(args.records / batch)
        if args.inflight >= logs:
            pool = await appender.loop_connections(list(range(first_log, first_log + logs)),
                                                   args.inflight)
            try:
                warm = await raw_loop(pool, warmup_requests, batch)
                if warm.errors and not warm.latencies_s:
                    raise SystemExit(json.dumps({"error": f"warmup failed: {dict(warm.errors)}"}))
                phase = await raw_loop(pool, requests, batch, sequencer_pids(args))
            finally:
                pool.close()
            return report(args, phase, urls)

        async def op(i: int) -> int:
            await appender.append(first_log + i % logs)
            return len(payloads)

        warm = await closed_loop(op, warmup_requests, args.inflight)
        if warm.errors and not warm.latencies_s:
            raise SystemExit(json.dumps({"error": f"warmup failed: {dict(warm.errors)}"}))
        phase = await closed_loop(op, requests, args.inflight, start_index=warmup_requests,
                                  server_pids=sequencer_pids(args))
    finally:
        await appender.close()
    return report(args, phase, urls)


async def raw_loop(pool: LoopConnections, requests: int, batch: int,
                   server_pids: dict[str, int] | None = None) -> Phase:
    """``closed_loop``'s measurement around ``LoopConnections.run``."""
    phase = Phase()
    pids = server_pids or {}
    s0 = {node: process_cpu_s(pid) for node, pid in pids.items()}
    c0 = cpu_s()
    t0 = time.perf_counter()
    result = await pool.run(requests)
    phase.elapsed_s = time.perf_counter() - t0
    phase.cpu_s = cpu_s() - c0
    for node, pid in pids.items():
        before, after = s0[node], process_cpu_s(pid)
        if before is not None and after is not None:
            phase.server_cpu_s[node] = after - before
    phase.latencies_s = result.latencies_s
    phase.errors = result.errors
    phase.records_ok = len(result.latencies_s) * batch
    return phase


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.records, args.size, args.inflight, args.batch, args.logs, args.first_log) < 1:
        print(json.dumps({"error": "records, size, inflight, batch, logs must be >= 1"}))
        return 2
    args.loadavg_start = loadavg()
    out = run_on_loop(args.loop, bench(args))
    return 0 if out["records"] else 1


def run_on_loop(loop: str, main: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run a benchmark's coroutine on a fresh ``asyncio`` or ``uvloop`` event loop."""
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


if __name__ == "__main__":
    sys.exit(main())
