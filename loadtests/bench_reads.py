"""Read-side benchmark: catch-up throughput, find-time latency (checked against a brute-force
scan) and tail latency at half the measured maximum append rate.

Starts its own local cluster (3 storage nodes, 2 sequencers, R=3, fsync=always, file epoch
store) unless ``--dir`` names a running one, and prints one JSON document:

1. ``fill``: ``--records`` records of ``--size`` bytes appended to one log as append-batches
   (``--fill-batch`` records, ``--fill-inflight`` in flight), waiting until all are released.
2. ``catchup_direct``: ``Client.reader`` (reads the storage nodes directly) from LSN 1 to the
   end: records/s and MB/s (payload bytes, 10^6). ``catchup_http``: the same through
   ``GET /v1/logs/{id}/records`` pages of ``--http-page`` records, over at most
   ``--http-records`` records.
3. ``find_time``: ``--queries`` timestamps (every record timestamp's neighbours, sampled, plus
   both ends); each answer is compared with a brute-force scan of the records read in step 2
   (``mismatches`` must be 0), and the latency of each call is recorded.
4. ``max_append``: closed-loop single appends with ``--probe-inflight`` in flight for
   ``--probe-s`` seconds on a fresh log: the maximum rate.
5. ``tail``: open-loop single appends at ``--tail-fraction`` (0.5) of that rate for
   ``--tail-s`` seconds on a fresh log, read by a tailing ``Client.reader`` and by an HTTP
   long-poll follower (``Client.follow``), each in its own process
   (``loadtests.bench_tail.run_tail``): latency = the append's due time -> acknowledged /
   delivered to the reader, so a stalled generator cannot hide delay (coordinated omission).

Run from the repo root: ``.venv/bin/python -m loadtests.bench_reads [--records 1000000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.bench_append import loadavg, percentile
from loadtests.bench_tail import probe_max, run_tail
from seqlog import Client, Record
from services import local_cluster as lc

READY_TIMEOUT_MS = 60_000


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, help="a running local cluster (default: start one)")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--fill-batch", type=int, default=500)
    p.add_argument("--fill-inflight", type=int, default=4)
    p.add_argument("--http-records", type=int, default=200_000)
    p.add_argument("--http-page", type=int, default=1000)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--probe-s", type=float, default=10.0)
    p.add_argument("--probe-inflight", type=int, default=64)
    p.add_argument("--tail-s", type=float, default=20.0)
    p.add_argument("--tail-fraction", type=float, default=0.5)
    p.add_argument("--first-log", type=int, default=random.randrange(1_000, 1_000_000))
    return p.parse_args()


def _stats_ms(values_s: list[float]) -> dict[str, float]:
    ordered = sorted(v * 1000 for v in values_s)
    return {"count": len(ordered), "p50_ms": round(percentile(ordered, 50), 3),
            "p99_ms": round(percentile(ordered, 99), 3),
            "max_ms": round(ordered[-1], 3) if ordered else float("nan")}


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _fill(client: Client, log_id: int, args: argparse.Namespace) -> dict[str, Any]:
    payload = b"x" * args.size
    batches = -(-args.records // args.fill_batch)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(batches):
        queue.put_nowait(min(args.fill_batch, args.records - i * args.fill_batch))
    last = 0

    async def worker() -> None:
        nonlocal last
        while not queue.empty():
            count = queue.get_nowait()
            result = await client.append_batch(log_id, [payload] * count)
            last = max(last, result.last_lsn)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(args.fill_inflight)))
    release_deadline = time.monotonic() + 120
    while (await client.tail(log_id)).release_lsn < last:
        if time.monotonic() > release_deadline:
            raise RuntimeError(f"log {log_id}: release never reached {last}")
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - started
    return {"records": args.records, "seconds": round(elapsed, 2),
            "records_per_s": round(args.records / elapsed), "last_lsn": last}


async def _catchup_direct(client: Client, log_id: int,
                          size: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    stamps: list[tuple[int, int]] = []
    gaps = 0
    started = time.monotonic()
    async with await client.reader(log_id) as reader:
        async for entry in reader:
            if isinstance(entry, Record):
                stamps.append((entry.lsn, entry.timestamp_ms))
            else:
                gaps += 1
    elapsed = time.monotonic() - started
    return {"records": len(stamps), "gaps": gaps, "seconds": round(elapsed, 2),
            "records_per_s": round(len(stamps) / elapsed),
            "MB_per_s": round(len(stamps) * size / elapsed / 1e6, 2)}, stamps


async def _catchup_http(client: Client, log_id: int, args: argparse.Namespace) -> dict[str, Any]:
    records = 0
    cursor = 1
    started = time.monotonic()
    while records < args.http_records:
        result = await client.read(log_id, cursor, limit=args.http_page)
        records += len(result.records)
        if result.next_lsn == cursor or result.next_lsn > result.release_lsn:
            break
        cursor = result.next_lsn
    elapsed = time.monotonic() - started
    return {"records": records, "seconds": round(elapsed, 2),
            "records_per_s": round(records / elapsed),
            "MB_per_s": round(records * args.size / elapsed / 1e6, 2)}


async def _find_time(client: Client, log_id: int, stamps: list[tuple[int, int]],
                     queries: int) -> dict[str, Any]:
    times = [t for _, t in stamps]
    # Record timestamps are what the index holds: nondecreasing within the log here (one
    # sequencer, one epoch), so the first LSN at or after t is found by bisection; the
    # running maximum keeps this right even if a clock stepped back.
    running: list[int] = []
    high = -1
    for t in times:
        high = max(high, t)
        running.append(high)
    release = (await client.tail(log_id)).release_lsn
    distinct = sorted(set(times))
    candidates = [distinct[0] - 1, distinct[-1] + 1]
    for t in random.sample(distinct, min(len(distinct), queries)):
        candidates += [t - 1, t, t + 1]
    candidates = candidates[:queries]
    latencies: list[float] = []
    mismatches: list[tuple[int, int, int]] = []
    for t in candidates:
        index = bisect.bisect_left(running, t)
        expected = stamps[index][0] if index < len(stamps) else release + 1
        started = time.monotonic()
        got = await client.find_time(log_id, t)
        latencies.append(time.monotonic() - started)
        if got != expected:
            mismatches.append((t, got, expected))
    return {**_stats_ms(latencies), "mismatches": len(mismatches),
            "mismatch_examples": mismatches[:5]}


async def _max_append(client: Client, log_id: int, args: argparse.Namespace) -> dict[str, Any]:
    rate = await probe_max(client, log_id, args.probe_s, args.probe_inflight, args.size)
    return {"inflight": args.probe_inflight, "seconds": args.probe_s,
            "records_per_s": round(rate)}


async def _run(args: argparse.Namespace, urls: list[str],
               nodes: tuple[lc.NodeEntry, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"loadavg_start": loadavg(), "records": args.records,
                           "size": args.size}
    async with Client(urls, timeout_ms=60_000) as client:
        log_id = args.first_log
        _progress(f"fill: {args.records} records")
        out["fill"] = await _fill(client, log_id, args)
        _progress("catch-up through the direct reader")
        out["catchup_direct"], stamps = await _catchup_direct(client, log_id, args.size)
        _progress("catch-up over HTTP")
        out["catchup_http"] = await _catchup_http(client, log_id, args)
        _progress("find-time")
        out["find_time"] = await _find_time(client, log_id, stamps, args.queries)
        _progress("max append rate")
        out["max_append"] = await _max_append(client, log_id + 1, args)
        rate = out["max_append"]["records_per_s"] * args.tail_fraction
    _progress(f"tail latency at {rate:.0f} appends/s")
    out["tail"] = await run_tail(urls, log_id + 2, rate, args.tail_s, args.size, "asyncio",
                                 ["direct", "http"], nodes)
    out["loadavg_end"] = loadavg()
    return out


def main() -> int:
    args = _args()
    if args.dir is not None:
        state = lc.load_state(args.dir)
        assert state is not None, f"no cluster in {args.dir}"
        result = asyncio.run(_run(args, state.sequencer_urls, state.nodes))
    else:
        with tempfile.TemporaryDirectory(prefix="seqlog-bench-reads-") as root:
            spec = lc.LocalClusterSpec(dir=Path(root), storage_nodes=3, sequencers=2,
                                       replication=3, base_port=lc.free_base_port(5),
                                       fsync="always")
            state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
            try:
                result = asyncio.run(_run(args, state.sequencer_urls, state.nodes))
            finally:
                lc.down(Path(root))
    print(json.dumps(result, indent=2))
    return 1 if result["find_time"]["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
