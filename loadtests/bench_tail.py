"""Tail latency: open-loop single appends at a fixed rate, read by a tailing ``Client.reader``
(storage nodes directly) and by an HTTP long-poll follower (``Client.follow``), each in its own
process; latency = the append's *intended* send time -> acknowledged / delivered.

Measured so that neither the generator nor the readers hide or add delay:

- Open loop, coordinated-omission safe: append *i* is due at ``start + i / rate``; latencies
  count from that due time, not from when the generator got round to sending it, so a stall
  of the generator (or of anything it waits on) shows in the figures instead of thinning the
  samples. ``generator_late`` reports how late appends actually left (the generator's own
  health: if its p99 is large, the generator is the bottleneck, not the cluster).
- The generator sends with ``Client.append_future`` (no Task per append) and never waits for
  answers before sending; every append due by now leaves in the same loop iteration, and it
  sleeps at least 1 ms between sends (no busy polling: it shares the cores with the cluster).
  Its CPU per record is reported (``generator_cpu_us_per_record``).
- Each reader runs in its own process (uvloop): decoding 1 KiB records for one reader must not
  delay the other's clock or the generator's sends. The due time travels in the payload
  (``#`` + 10-digit sequence + 20-digit ``CLOCK_MONOTONIC`` ns), and CLOCK_MONOTONIC is one
  clock for every process on the machine.
- ``direct_after_ack`` / ``http_after_ack``: record by record, acknowledged -> delivered
  (negative when a reader got it before the generator processed the answer): the read
  side's own share, which the append's latency does not blur.
- Every benchmark process uses the nodes' garbage-collector settings (``quiet_gc``).
- CPU per record: each reader's own (``*_reader.cpu_us_per_record``), and the user+system
  CPU of every node process over the measured phase (from /proc/PID/stat), divided by the
  records appended, split into sequencer and storage nodes.

``--rate`` fixes the offered rate; otherwise ``--probe-s`` seconds of closed-loop appends with
``--probe-inflight`` in flight find the maximum and ``--fraction`` of it is offered (what
docs/BENCHMARKS.md's "Tail latency" row reports). Starts its own cluster (3 storage nodes, 2
sequencers, R=3, fsync=always) unless ``--dir`` names a running one. Prints one JSON document.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_tail [--rate 4000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import multiprocessing
import multiprocessing.queues
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.bench_append import cpu_s, loadavg, percentile, process_cpu_s, run_on_loop
from seqlog import Client, Gap, Record
from services import local_cluster as lc
from services.node import GC_GEN0_THRESHOLD

READY_TIMEOUT_MS = 60_000
MARK = b"#"
SEQ_DIGITS = 10
DUE_DIGITS = 20
HEADER_BYTES = 1 + SEQ_DIGITS + DUE_DIGITS
SLEEP_NS_MIN = 1_000_000
DRAIN_TIMEOUT_S = 60.0
"""How long readers may take after the last append to deliver everything."""


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, help="a running local cluster (default: start one)")
    p.add_argument("--rate", type=float, help="offered appends/s (default: probe, then fraction)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--probe-s", type=float, default=10.0)
    p.add_argument("--probe-inflight", type=int, default=64)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--log", type=int, default=random.randrange(1_000, 1_000_000))
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    p.add_argument("--readers", default="direct,http",
                   help="comma-separated reader processes: direct, http (or none)")
    return p.parse_args(argv)


def stats_ms(values_ns: list[int]) -> dict[str, float]:
    ordered = sorted(v / 1e6 for v in values_ns)
    return {"count": len(ordered), "p50_ms": round(percentile(ordered, 50), 3),
            "p90_ms": round(percentile(ordered, 90), 3),
            "p99_ms": round(percentile(ordered, 99), 3),
            "max_ms": round(ordered[-1], 3) if ordered else float("nan")}


def payload(seq: int, due_ns: int, size: int) -> bytes:
    head = b"%c%0*d%0*d" % (MARK[0], SEQ_DIGITS, seq, DUE_DIGITS, due_ns)
    return head + b"." * max(0, size - len(head))


def parse_payload(data: bytes) -> tuple[int, int] | None:
    """(sequence, due ns) of a benchmark record, None for anything else."""
    if data[:1] != MARK or len(data) < HEADER_BYTES:
        return None
    return int(data[1:1 + SEQ_DIGITS]), int(data[1 + SEQ_DIGITS:HEADER_BYTES])


# ---- readers (one process each) ----------------------------------------------------------


async def _read(kind: str, urls: list[str], log_id: int, start_lsn: int, total: int,
                ready: multiprocessing.queues.Queue[Any]) -> dict[str, Any]:
    latencies: list[int] = []
    delivered: dict[int, int] = {}
    cpu_started_s = cpu_s()
    now_ns = time.monotonic_ns
    async with Client(urls, timeout_ms=60_000) as client:

        def take(entry: Record | Gap) -> bool:
            if isinstance(entry, Gap):
                return False
            parsed = parse_payload(entry.payload)
            if parsed is not None and parsed[0] not in delivered:
                t = delivered[parsed[0]] = now_ns()
                latencies.append(t - parsed[1])
            return len(delivered) >= total

        if kind == "direct":
            async with await client.reader(log_id, start_lsn, follow=True) as reader:
                ready.put(kind)
                async for entry in reader:
                    if take(entry):
                        break
        else:
            ready.put(kind)
            async for entry in client.follow(log_id, start_lsn):
                if take(entry):
                    break
    return {"latency": latencies, "delivered": delivered,
            "cpu_us_per_record": round((cpu_s() - cpu_started_s) * 1e6 / max(total, 1), 1)}


def quiet_gc() -> None:
    """The nodes' collector settings (services.node): with thousands of appends in flight,
    the default thresholds cost the generator whole seconds of collections per run (traced:
    3.6 s in 15 s, pauses up to 420 ms), which would be measured as the cluster's delay."""
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


def _reader_main(kind: str, urls: list[str], log_id: int, start_lsn: int, total: int,
                 loop: str, ready: multiprocessing.queues.Queue[Any],
                 results: multiprocessing.queues.Queue[Any]) -> None:
    quiet_gc()
    try:
        result = run_on_loop(loop, _read(kind, urls, log_id, start_lsn, total, ready))
        results.put((kind, result))
    except BaseException as exc:  # reported, not raised: the parent must not hang
        results.put((kind, {"error": repr(exc)}))
        ready.put(kind)


# ---- generator -----------------------------------------------------------------------------


async def probe_max(client: Client, log_id: int, seconds: float, inflight: int,
                    size: int) -> float:
    """Closed-loop appends/s with ``inflight`` in flight."""
    data = b"p" * size
    done = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await client.append(log_id, data)
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return done / (time.monotonic() - started)


async def generate(client: Client, log_id: int, rate: float, seconds: float,
                   size: int) -> dict[str, Any]:
    total = int(rate * seconds)
    interval_ns = 1e9 / rate
    acked: list[int] = []
    acked_at: dict[int, int] = {}
    service: list[int] = []
    late: list[int] = []
    errors: list[str] = []
    inflight = 0
    inflight_max = 0
    finished = asyncio.get_running_loop().create_future()
    now_ns = time.monotonic_ns

    def on_done(seq: int, due_ns: int, sent_ns: int, future: asyncio.Future[Any]) -> None:
        nonlocal inflight
        inflight -= 1
        t = now_ns()
        if future.cancelled() or future.exception() is not None:
            errors.append(repr(future.exception()) if not future.cancelled() else "cancelled")
        else:
            acked.append(t - due_ns)
            acked_at[seq] = t
            service.append(t - sent_ns)
        if len(acked) + len(errors) == total and not finished.done():
            finished.set_result(None)

    quiet_gc()
    started_ns = now_ns()
    cpu_started_s = cpu_s()
    seq = 0
    while seq < total:
        t = now_ns()
        while seq < total:
            due_ns = started_ns + int(seq * interval_ns)
            if due_ns > t:
                break
            future = client.append_future(log_id, payload(seq, due_ns, size))
            sent_ns = now_ns()
            late.append(sent_ns - due_ns)
            inflight += 1
            future.add_done_callback(functools.partial(on_done, seq, due_ns, sent_ns))
            seq += 1
        inflight_max = max(inflight_max, inflight)
        if seq < total:
            # At least 1 ms: uvloop's timers have millisecond resolution, and a shorter sleep
            # becomes a busy poll that would take a core from the cluster it measures.
            await asyncio.sleep(max(started_ns + int(seq * interval_ns) - now_ns(),
                                    SLEEP_NS_MIN) / 1e9)
    await asyncio.wait_for(finished, DRAIN_TIMEOUT_S)
    elapsed_s = (now_ns() - started_ns) / 1e9
    cpu_used_s = cpu_s() - cpu_started_s
    return {"offered_per_s": round(rate), "records": total, "seconds": round(elapsed_s, 2),
            "errors": len(errors), "error_examples": errors[:3],
            "inflight_max": inflight_max,
            "append_ack": stats_ms(acked), "append_service": stats_ms(service),
            "generator_late": stats_ms(late),
            "generator_cpu_us_per_record": round(cpu_used_s * 1e6 / total, 1),
            "acked_at": acked_at}


def _cpu(pids: dict[str, int]) -> dict[str, float | None]:
    return {node: process_cpu_s(pid) for node, pid in pids.items()}


async def run_tail(urls: list[str], log_id: int, rate: float, seconds: float, size: int,
                   loop: str, readers: list[str],
                   nodes: tuple[lc.NodeEntry, ...] = ()) -> dict[str, Any]:
    """The tail phase against a running cluster (``nodes``, if given, for CPU per record)."""
    context = multiprocessing.get_context("spawn")
    ready: multiprocessing.queues.Queue[Any] = context.Queue()
    results: multiprocessing.queues.Queue[Any] = context.Queue()
    async with Client(urls, timeout_ms=60_000) as client:
        first = await client.append(log_id, b"start")
        start_lsn = first.lsn + 1
        total = int(rate * seconds)
        procs = [context.Process(target=_reader_main, daemon=True,
                                 args=(kind, urls, log_id, start_lsn, total, loop, ready,
                                       results)) for kind in readers]
        for proc in procs:
            proc.start()
        for _ in procs:
            await asyncio.to_thread(ready.get, True, 60)
        await asyncio.sleep(0.5)  # the readers' first long polls are held by now
        pids = {str(n.node_id): n.pid for n in nodes}
        roles = {str(n.node_id): "sequencer" if "sequencer" in n.roles else "storage"
                 for n in nodes}
        cpu_before = _cpu(pids)
        out = await generate(client, log_id, rate, seconds, size)
        cpu_after = _cpu(pids)
    for _ in procs:
        kind, result = await asyncio.to_thread(results.get, True, DRAIN_TIMEOUT_S + 60)
        if "latency" not in result:
            out[f"{kind}_reader"] = result
            continue
        out[f"{kind}_reader"] = {**stats_ms(result["latency"]),
                                 "cpu_us_per_record": result["cpu_us_per_record"]}
        # The read side's own share, record by record: acknowledged -> delivered.
        out[f"{kind}_after_ack"] = stats_ms([
            t - out["acked_at"][seq] for seq, t in result["delivered"].items()
            if seq in out["acked_at"]])
    out.pop("acked_at", None)
    for proc in procs:
        proc.join(10)
    if pids:
        per_role: dict[str, float] = {}
        for node, before in cpu_before.items():
            after = cpu_after[node]
            if before is not None and after is not None:
                per_role[roles[node]] = per_role.get(roles[node], 0.0) + after - before
        out["cpu_us_per_record"] = {role: round(s * 1e6 / out["records"], 1)
                                    for role, s in per_role.items()}
    return out


async def _main(args: argparse.Namespace, state: lc.ClusterState) -> dict[str, Any]:
    urls = state.sequencer_urls
    out: dict[str, Any] = {"loadavg_start": loadavg(), "size": args.size}
    rate = args.rate
    if rate is None:
        async with Client(urls, timeout_ms=60_000) as client:
            await client.append(args.log + 1, b"warm")
            best = await probe_max(client, args.log + 1, args.probe_s, args.probe_inflight,
                                   args.size)
        out["max_append"] = {"inflight": args.probe_inflight, "records_per_s": round(best)}
        rate = best * args.fraction
    readers = [r for r in args.readers.split(",") if r in ("direct", "http")]
    out["tail"] = await run_tail(urls, args.log, rate, args.seconds, args.size, args.loop,
                                 readers, state.nodes)
    out["loadavg_end"] = loadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.dir is not None:
        state = lc.load_state(args.dir)
        assert state is not None, f"no cluster in {args.dir}"
        result = run_on_loop(args.loop, _main(args, state))
    else:
        with tempfile.TemporaryDirectory(prefix="seqlog-bench-tail-") as root:
            spec = lc.LocalClusterSpec(dir=Path(root), storage_nodes=3, sequencers=2,
                                       replication=3, base_port=lc.free_base_port(5),
                                       fsync="always")
            state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
            try:
                result = run_on_loop(args.loop, _main(args, state))
            finally:
                lc.down(Path(root))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
