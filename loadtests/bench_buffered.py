"""Closed-loop benchmark of the buffered writer (``seqlog.BufferedWriter``), same semantics as
the peer benchmarks (shared/peers/common.py): at most ``--inflight`` appends are outstanding,
latency is per record from just before ``append`` to the moment its LSN is known (its batch is
durable), throughput counts records, MB is 10^6 bytes of payload.

Payloads are ``random`` (incompressible, distinct bytes) or ``json`` (realistic log lines from
``loadtests.json_log_lines``, averaging ``--size`` bytes); ``--compression`` picks the writer's
codec. The driver is how the caller uses the writer:

- ``handles`` (the default): what a high-throughput producer does (Kafka's ``send()`` in a
  loop): ``w.append_nowait`` (an ``AppendHandle`` per record, no future) while fewer than
  ``--inflight`` records are unanswered; with the window full it awaits the oldest record's
  handle, then takes every answered record off the front of the window, each with its own
  latency and outcome. Batches of one log may be answered out of order (``ordered=False``):
  a record answered behind an older unanswered one stays counted as outstanding, and its
  latency is taken when it leaves the window (late, never early).
- ``callbacks``: the window kept full from a done-callback per record (``w.append``: a future
  per record).
- ``tasks``: one coroutine per outstanding append (``await w.append``), like the peers'
  closed loop.

Prints one JSON line with records/s, MB/s, p50/p99, client CPU (and
the cluster's, when started from ``--dir``) per record, and the compression ratio (plain bytes
/ sent bytes).

Run from the repo root against a local cluster:
``.venv/bin/python -m loadtests.bench_buffered --dir DIR --inflight 4096 --payload json
--compression zstd``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import resource
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from loadtests.bench_append import cpu_s, loadavg, percentile, run_on_loop
from loadtests.json_log_lines import LogLineGenerator
from seqlog import AppendHandle, BufferedWriter, Client, LogError
from seqlog.buffered_writer import BATCHES_IN_FLIGHT_PER_LOG_MAX
from services.local_cluster import load_state
from shared import malloc_tuning

GC_GEN0_THRESHOLD = 50_000
"""``--gc-tuned``: services.node's setting."""
POOL_MIN = 4096
"""Distinct payloads cycled through (at least two batches' worth, so no batch repeats one)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group()
    target.add_argument("--url", action="append", help="node URL (repeatable)")
    target.add_argument("--dir", type=Path, help="local cluster directory (cluster.json)")
    p.add_argument("--records", type=int, default=200_000, help="measured records")
    p.add_argument("--size", type=int, default=1024, help="(average) payload bytes")
    p.add_argument("--inflight", type=int, default=4096, help="max outstanding appends")
    p.add_argument("--payload", choices=["random", "json"], default="random")
    p.add_argument("--compression", choices=["none", "lz4", "zstd"], default="none")
    p.add_argument("--linger-ms", type=float, default=5)
    p.add_argument("--batch-records-max", type=int, default=1000)
    p.add_argument("--batch-bytes-max", type=int, default=1024 * 1024)
    p.add_argument("--memory-bytes-max", type=int, default=256 * 1024 * 1024)
    p.add_argument("--ordered", action="store_true", help="ordered=True (one batch per log "
                   "in flight)")
    p.add_argument("--logs", type=int, default=1, help="logs written round-robin")
    p.add_argument("--first-log", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5000, help="unmeasured records sent first")
    p.add_argument("--driver", choices=["handles", "callbacks", "tasks"], default="handles")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--label", default="")
    p.add_argument("--gc-tuned", action="store_true",
                   help="gc.freeze() at start and a gen0 threshold of "
                        f"{GC_GEN0_THRESHOLD} (as the node processes do): each record's "
                        "future and callback survive a few young collections, which then "
                        "cost ~0.3-0.4 us per record at the default threshold")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="leave glibc malloc at its defaults (shared/malloc_tuning.py)")
    return p


def make_pool(args: argparse.Namespace) -> list[bytes]:
    count = max(POOL_MIN, 2 * args.batch_records_max)
    if args.payload == "json":
        return LogLineGenerator(seed=args.seed, size=args.size).lines(count)
    return [os.urandom(args.size) for _ in range(count)]


class Phase:
    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.errors: Counter[str] = Counter()
        self.payload_bytes = 0
        self.elapsed_s = 0.0
        self.cpu_s = 0.0
        self.cluster_cpu_s: float | None = None
        self.node_cpu_s: dict[str, float] = {}
        self.node_sys_s: dict[str, float] = {}
        """The kernel's share of ``node_cpu_s`` (system time)."""
        self.sys_s = 0.0


def node_cpu_s(processes: list[psutil.Process], names: list[str]
               ) -> dict[str, tuple[float, float]]:
    """(CPU seconds, of which system) of each cluster process by node id (missing ones
    left out)."""
    out: dict[str, tuple[float, float]] = {}
    for process, name in zip(processes, names, strict=True):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            out[name] = (times.user + times.system, times.system)
    return out


def cluster_cpu_s(processes: list[psutil.Process]) -> float | None:
    if not processes:
        return None
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            return None
        total += times.user + times.system
    return total


async def run_tasks(w: BufferedWriter, n: int, inflight: int, payloads: itertools.cycle[bytes],
                    logs: list[int], phase: Phase) -> None:
    """One coroutine per outstanding append, like the peers' closed loop."""
    indices = iter(range(n))
    pc = time.perf_counter
    nlogs = len(logs)

    async def worker() -> None:
        for i in indices:
            payload = next(payloads)
            t0 = pc()
            try:
                await w.append(logs[i % nlogs], payload)
            except LogError as exc:
                phase.errors[exc.status.name] += 1
                continue
            phase.latencies_s.append(pc() - t0)
            phase.payload_bytes += len(payload)

    await asyncio.gather(*(worker() for _ in range(max(1, inflight))))


async def run_callbacks(w: BufferedWriter, n: int, inflight: int,
                        payloads: itertools.cycle[bytes], logs: list[int],
                        phase: Phase) -> None:
    """The window kept full from done-callbacks: no coroutine per outstanding append, and one
    callback function for all of them (each record's start time and size wait in a dict keyed
    by its future, rather than in a closure made per record)."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    pc = time.perf_counter
    nlogs = len(logs)
    issued = 0
    outstanding = 0
    latencies = phase.latencies_s
    started: dict[asyncio.Future[Any], tuple[float, int]] = {}

    def issue() -> None:
        nonlocal issued, outstanding
        i = issued
        issued += 1
        outstanding += 1
        payload = next(payloads)
        t0 = pc()
        try:
            future = w.append(logs[i % nlogs], payload)
        except LogError as exc:
            phase.errors[exc.status.name] += 1
            loop.call_soon(after_one)
            return
        started[future] = (t0, len(payload))
        future.add_done_callback(done)

    def done(future: asyncio.Future[Any]) -> None:
        t0, size = started.pop(future)
        if future.exception() is None:
            latencies.append(pc() - t0)
            phase.payload_bytes += size
        else:
            exc = future.exception()
            phase.errors[getattr(getattr(exc, "status", None), "name", repr(exc))] += 1
        after_one()

    def after_one() -> None:
        nonlocal outstanding
        outstanding -= 1
        if issued < n:
            issue()
        elif outstanding == 0 and not finished.done():
            finished.set_result(None)

    for _ in range(min(inflight, n)):
        issue()
    await finished


async def run_handles(w: BufferedWriter, n: int, inflight: int,
                      payloads: itertools.cycle[bytes], logs: list[int], phase: Phase) -> None:
    """Fire ``append_nowait`` while fewer than ``inflight`` records are unanswered; when full,
    await the oldest record and take every answered record off the front of the window (see
    the module docstring). One wake-up per answered batch, nothing per record but the append,
    a timestamp and the check of its outcome. ``phase.payload_bytes`` is counted per batch
    by the writer (``stats.payload_bytes_ok``)."""
    pc = time.perf_counter
    nlogs = len(logs)
    append = w.append_nowait
    handles: deque[AppendHandle] = deque()
    starts: deque[float] = deque()
    latencies = phase.latencies_s
    errors = phase.errors
    bytes0 = w.stats.payload_bytes_ok
    issued = 0
    while issued < n or handles:
        room = min(inflight - len(handles), n - issued)
        for i in range(issued, issued + room):
            t0 = pc()
            try:
                handle = append(logs[i % nlogs], next(payloads))
            except LogError as exc:
                errors[exc.status.name] += 1
                continue
            handles.append(handle)
            starts.append(t0)
        issued += room
        if not handles:
            continue
        with contextlib.suppress(LogError):
            await handles[0]
        now = pc()
        while handles and handles[0].done():
            exc = handles.popleft().exception()
            t0 = starts.popleft()
            if exc is None:
                latencies.append(now - t0)
            else:
                errors[exc.status.name] += 1
    phase.payload_bytes = w.stats.payload_bytes_ok - bytes0


async def measure(w: BufferedWriter, n: int, args: argparse.Namespace,
                  payloads: itertools.cycle[bytes], logs: list[int],
                  cluster: list[psutil.Process], names: list[str] | None = None) -> Phase:
    phase = Phase()
    run = {"handles": run_handles, "callbacks": run_callbacks, "tasks": run_tasks}[args.driver]
    names = names or []
    n0 = node_cpu_s(cluster, names) if names else {}
    s0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    c0, k0, t0 = cpu_s(), cluster_cpu_s(cluster), time.perf_counter()
    await run(w, n, args.inflight, payloads, logs, phase)
    phase.elapsed_s = time.perf_counter() - t0
    phase.cpu_s = cpu_s() - c0
    phase.sys_s = resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0
    k1 = cluster_cpu_s(cluster)
    if k0 is not None and k1 is not None:
        phase.cluster_cpu_s = k1 - k0
    if names:
        n1 = node_cpu_s(cluster, names)
        phase.node_cpu_s = {k: n1[k][0] - n0[k][0] for k in n1 if k in n0}
        phase.node_sys_s = {k: n1[k][1] - n0[k][1] for k in n1 if k in n0}
    return phase


def resolve(args: argparse.Namespace) -> tuple[list[str], list[psutil.Process], list[str]]:
    if args.dir is None:
        return list(args.url or ["http://127.0.0.1:7400"]), [], []
    state = load_state(args.dir.resolve())
    if state is None:
        raise SystemExit(json.dumps({"error": f"no cluster.json in {args.dir}"}))
    processes = []
    names = []
    for node in state.nodes:
        with contextlib.suppress(psutil.Error):
            processes.append(psutil.Process(node.pid))
            names.append(node.node_id)
    return state.sequencer_urls, processes, names


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    urls, cluster, names = resolve(args)
    pool = make_pool(args)
    payloads = itertools.cycle(pool)
    logs = list(range(args.first_log, args.first_log + args.logs))
    compression = None if args.compression == "none" else args.compression
    # Enough connections for every batch the writer may have in flight at once.
    connections = BATCHES_IN_FLIGHT_PER_LOG_MAX * args.logs + 4
    async with Client(urls, connections_max=connections) as client:
        w = client.buffered_writer(
            linger_ms=args.linger_ms, batch_records_max=args.batch_records_max,
            batch_bytes_max=args.batch_bytes_max, compression=compression,
            ordered=args.ordered, memory_bytes_max=args.memory_bytes_max)
        async with w:
            warm = await measure(w, max(args.warmup, len(logs)), args, payloads, logs, [])
            if warm.errors and not warm.latencies_s:
                hint = (" (BADMSG with compression: this server does not take compressed "
                        "append-batch bodies)" if compression and "BADMSG" in warm.errors
                        else "")
                raise SystemExit(json.dumps(
                    {"error": f"warmup failed: {dict(warm.errors)}{hint}"}))
            plain0, sent0 = client.batch_bytes_plain, client.batch_bytes_sent
            stats0 = (w.stats.batches_ok, w.stats.records_ok)
            phase = await measure(w, args.records, args, payloads, logs, cluster, names)
            plain = client.batch_bytes_plain - plain0
            sent = client.batch_bytes_sent - sent0
            batches = w.stats.batches_ok - stats0[0]
            batch_records = w.stats.records_ok - stats0[1]
    return report(args, phase, urls, ratio=plain / sent if sent else 1.0,
                  batches=batches, batch_records=batch_records,
                  pool_avg=sum(map(len, pool)) / len(pool))


def report(args: argparse.Namespace, phase: Phase, urls: list[str], *, ratio: float,
           batches: int, batch_records: int, pool_avg: float) -> dict[str, Any]:
    lat = sorted(phase.latencies_s)
    el = phase.elapsed_s
    n = len(lat)
    out: dict[str, Any] = {
        "bench": "seqlog_buffered",
        "label": args.label,
        "records": n,
        "size": args.size,
        "avg_payload_bytes": round(pool_avg, 1),
        "inflight": args.inflight,
        "payload": args.payload,
        "compression": args.compression,
        "compression_ratio": round(ratio, 3),
        "linger_ms": args.linger_ms,
        "ordered": args.ordered,
        "logs": args.logs,
        "driver": args.driver,
        "loop": args.loop,
        "elapsed_s": round(el, 4),
        "records_per_s": round(n / el, 1) if el > 0 else None,
        "MB_per_s": round(phase.payload_bytes / el / 1e6, 3) if el > 0 else None,
        "p50_ms": round(percentile(lat, 50) * 1e3, 4),
        "p99_ms": round(percentile(lat, 99) * 1e3, 4),
        "p999_ms": round(percentile(lat, 99.9) * 1e3, 4),
        "max_ms": round(lat[-1] * 1e3, 4) if lat else None,
        "batches": batches,
        "records_per_batch": round(batch_records / batches, 1) if batches else None,
        "client_cpu_util": round(phase.cpu_s / el, 3) if el > 0 else None,
        "client_cpu_us_per_record": round(phase.cpu_s / n * 1e6, 2) if n else None,
        "cluster_cpu_us_per_record": (round(phase.cluster_cpu_s / n * 1e6, 2)
                                      if n and phase.cluster_cpu_s is not None else None),
        "node_cpu_us_per_record": ({k: round(v / n * 1e6, 2)
                                    for k, v in sorted(phase.node_cpu_s.items())} if n else None),
        "client_sys_us_per_record": round(phase.sys_s / n * 1e6, 2) if n else None,
        "node_sys_us_per_record": ({k: round(v / n * 1e6, 2)
                                    for k, v in sorted(phase.node_sys_s.items())} if n else None),
        "malloc_tuned": args.malloc_tuned,
        "gc_tuned": args.gc_tuned,
        "loadavg_start": args.loadavg_start,
        "loadavg_end": loadavg(),
        "errors": dict(phase.errors),
        "urls": urls,
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.records, args.size, args.inflight, args.logs, args.first_log) < 1:
        print(json.dumps({"error": "records, size, inflight, logs must be >= 1"}))
        return 2
    args.loadavg_start = loadavg()
    args.malloc_tuned = False if args.no_malloc_tuning else malloc_tuning.tune()
    if args.gc_tuned:
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    out = run_on_loop(args.loop, bench(args))
    return 0 if out["records"] else 1


if __name__ == "__main__":
    sys.exit(main())
