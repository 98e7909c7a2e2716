"""Idle logs cost nothing (issue 15, done-when 3): what ``--logs`` active but idle logs cost the
sequencer, and what they do to an unrelated busy log's latency.

Starts a local cluster (3 storage nodes, 1 sequencer, R=3, storage ``fsync=never`` so that disk
noise does not hide the sequencer's), then:

1. busy log alone: 64 appends of 100 bytes in flight to log 1 through ``seqlog.Client`` for
   ``--busy-s``; per-append latency p50/p99;
2. a quiet window (``--quiet-s``) with no other logs: the sequencer's CPU, then its
   event-loop lag;
3. one first append to each of ``--logs`` other logs (256 in flight): they are now active;
4. ``--idle-s`` idle: the sequencer's CPU (from /proc, user+system), then for half as long
   its event-loop lag;
5. the busy log again, now beside the idle logs;
6. with ``--idle-deactivate-ms``: waits for the idle sequencers to be deactivated, appends
   once more to every 10th idle log and reads it back (both records, in order), and reports
   how many recoveries the sequencer started (none expected).

Event-loop lag is measured from outside: a separate process asks the sequencer's ``/healthz``
every 5 ms on one kept-alive connection; an answer that takes long means the sequencer's loop
was busy (a stall), so the largest round trip bounds the longest stall from above (the
probe's own scheduling adds to it on a loaded machine). Prints one JSON line::

    .venv/bin/python loadtests/bench_idle_logs.py [--logs 10000] [--idle-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from seqlog import Client
from services import local_cluster as lc
from shared.config import SequencerConfig

BUSY_INFLIGHT = 64
FIRST_APPENDS_INFLIGHT = 256
PROBE_INTERVAL_S = 0.005
STALL_MS = 10.0


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _probe(http_addr: str, duration_s: float, out: Connection) -> None:
    """Round trips of GET /healthz every PROBE_INTERVAL_S, in ms."""
    host, port = http_addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    samples: list[float] = []
    end_s = time.perf_counter() + duration_s
    while time.perf_counter() < end_s:
        started_s = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        samples.append((time.perf_counter() - started_s) * 1000)
        time.sleep(PROBE_INTERVAL_S)
    conn.close()
    out.send(samples)


def _metric(http_addr: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def _quiet_window(pid: int, http_addr: str, seconds: float) -> dict[str, Any]:
    """With no appends: the sequencer's CPU share over ``seconds`` (no probe running, whose
    requests cost CPU too), then the probe's round trips over half as long."""
    cpu_s, started_s = _cpu_s(pid), time.perf_counter()
    time.sleep(seconds)
    cpu_s, wall_s = _cpu_s(pid) - cpu_s, time.perf_counter() - started_s
    receiver, sender = multiprocessing.Pipe(duplex=False)
    probe = multiprocessing.Process(target=_probe, args=(http_addr, seconds / 2, sender))
    probe.start()
    samples: list[float] = receiver.recv()
    probe.join()
    samples.sort()
    return {
        "cpu_seconds": round(wall_s, 1),
        "sequencer_cpu_pct": round(cpu_s / wall_s * 100, 2),
        "probe_seconds": seconds / 2,
        "probe_p50_ms": round(samples[len(samples) // 2], 2),
        "probe_p99_ms": round(samples[int(len(samples) * 0.99)], 2),
        "probe_max_ms": round(samples[-1], 2),
        "probes_over_10ms": sum(1 for s in samples if s > STALL_MS),
        "probes": len(samples),
    }


async def _busy(urls: list[str], seconds: float) -> dict[str, Any]:
    payload = b"b" * 100
    latencies: list[float] = []
    async with Client(urls, timeout_ms=60_000) as client:
        end_s = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < end_s:
                started_s = time.perf_counter()
                await client.append(1, payload)
                latencies.append((time.perf_counter() - started_s) * 1000)

        await asyncio.gather(*(worker() for _ in range(BUSY_INFLIGHT)))
    latencies.sort()
    return {
        "appends": len(latencies),
        "appends_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)], 2),
    }


async def _first_appends(urls: list[str], logs: list[int]) -> None:
    sem = asyncio.Semaphore(FIRST_APPENDS_INFLIGHT)
    async with Client(urls, timeout_ms=120_000) as client:

        async def append(log: int) -> None:
            async with sem:
                await client.append(log, b"first")

        await asyncio.gather(*(append(log) for log in logs))


async def _again_and_read(urls: list[str], logs: list[int]) -> int:
    """Append "again" to each log, then read it back: how many logs read exactly
    ["first", "again"] in LSN order."""
    sem = asyncio.Semaphore(FIRST_APPENDS_INFLIGHT)
    async with Client(urls, timeout_ms=120_000) as client:

        async def one(log: int) -> bool:
            async with sem:
                await client.append(log, b"again")
                result = await client.read(log, limit=10)
                lsns = [r.lsn for r in result.records]
                return (lsns == sorted(lsns)
                        and [r.payload for r in result.records] == [b"first", b"again"])

        return sum(await asyncio.gather(*(one(log) for log in logs)))


def _deactivation(http_addr: str, urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Wait for the idle sequencers to be deactivated, then append to every 10th idle log once
    more: it must come back with no recovery and read both records in order."""
    deadline_s = time.perf_counter() + args.idle_deactivate_ms / 1000 + 120
    while _metric(http_addr, "seqlog_sequencer_logs") > 0 and time.perf_counter() < deadline_s:
        time.sleep(0.5)
    held = _metric(http_addr, "seqlog_sequencer_logs")
    deactivated = _metric(http_addr, "seqlog_sequencer_idle_deactivations")
    logs = list(range(2, args.logs + 2, 10))
    read_ok = asyncio.run(_again_and_read(urls, logs))
    return {
        "logs_held_after_idle": held,
        "deactivations": deactivated,
        "logs_appended_again": len(logs),
        "logs_read_back_in_order": read_ok,
        "recoveries": _metric(http_addr, 'seqlog_sequencer_recovery_phases{phase="SEALING"}'),
    }


def run(root: Path, args: argparse.Namespace) -> dict[str, object]:
    extra: dict[str, Any] = {}
    if args.idle_deactivate_ms:
        # Only where the setting exists (not on trees before it).
        extra["sequencer"] = SequencerConfig(idle_deactivate_ms=args.idle_deactivate_ms)
    state = lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never", **extra), ready_timeout_ms=60_000)
    try:
        sequencer = next(n for n in state.nodes if "sequencer" in n.roles)
        pid, http_addr, urls = sequencer.pid, sequencer.http, state.sequencer_urls
        busy_alone = asyncio.run(_busy(urls, args.busy_s))
        quiet = _quiet_window(pid, http_addr, args.quiet_s)
        started_s = time.perf_counter()
        asyncio.run(_first_appends(urls, list(range(2, args.logs + 2))))
        activate_s = time.perf_counter() - started_s
        time.sleep(1.0)  # let the first appends' release broadcasts run out
        logs_held = _metric(http_addr, "seqlog_sequencer_logs")
        idle = _quiet_window(pid, http_addr, args.idle_s)
        busy_beside = asyncio.run(_busy(urls, args.busy_s))
        deactivation = (_deactivation(http_addr, urls, args) if args.idle_deactivate_ms
                        else None)
    finally:
        lc.down(root)
    return {
        "bench": "idle_logs",
        "idle_logs": args.logs,
        "sequencer_logs_held": logs_held,
        "activate_logs_per_s": round(args.logs / activate_s, 1),
        "no_idle_logs": quiet,
        "with_idle_logs": idle,
        "busy_alone": busy_alone,
        "busy_beside_idle_logs": busy_beside,
        "busy_p99_ratio": round(busy_beside["p99_ms"] / busy_alone["p99_ms"], 2),
        "deactivation": deactivation,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=10_000)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--quiet-s", type=float, default=5.0)
    parser.add_argument("--busy-s", type=float, default=10.0)
    parser.add_argument("--idle-deactivate-ms", type=int, default=0,
                        help="set sequencer.idle_deactivate_ms, and at the end wait for the "
                        "idle logs to be deactivated and append to every 10th once more")
    parser.add_argument("--dir", default="", help="cluster directory (default: a temp dir)")
    args = parser.parse_args()
    if args.logs < 1:
        parser.error("--logs must be at least 1")
    if args.dir:
        print(json.dumps(run(Path(args.dir), args)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-idle-logs-") as root:
        print(json.dumps(run(Path(root), args)), flush=True)


if __name__ == "__main__":
    main()
