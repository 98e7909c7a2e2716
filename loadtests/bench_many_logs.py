"""Many busy logs against one (issue 15, done-when 1): single appends through ``seqlog.Client``
with ``--inflight`` in flight, each to a log chosen at random out of N, on one local cluster,
N = 1 then each of ``--logs``, in ``--rounds`` rounds. Per run: records/s, its ratio to the
one-log run of the same round, and the CPU per record of every node process (from
/proc/PID/stat) and of this client, over the measured phase. Prints one JSON line per run
and a summary line with the medians.

The machine may be shared: compare the ratios and the CPU per record, not absolute rates.
Each run uses fresh log ids (the first append of each log, its activation, falls in the
warm-up when the warm-up covers every log: ``--warmup`` defaults to 3 appends per log).

Run from the repo root: ``.venv/bin/python -m loadtests.bench_many_logs --dir DIR``
(``DIR`` from ``python -m services.cli local up --dir DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from loadtests.bench_append import cpu_s, loadavg, process_cpu_s, run_on_loop
from seqlog import Client, LogError
from services.local_cluster import load_state


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="local cluster directory")
    p.add_argument("--logs", type=int, nargs="+", default=[1000, 10000],
                   help="numbers of logs to compare with one log")
    p.add_argument("--records", type=int, default=30000, help="measured appends per run")
    p.add_argument("--warmup-per-log", type=int, default=3,
                   help="unmeasured appends per log first (at least 3000 in all)")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--first-log", type=int, default=1_000_000,
                   help="log ids start here and never repeat within the invocation")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    return p


async def one_run(client: Client, log_ids: list[int], *, records: int, warmup: int,
                  inflight: int, payload: bytes, rng: random.Random,
                  pids: dict[str, int]) -> dict[str, Any]:
    """Warm up (every log at least once), then ``records`` appends to random logs."""
    errors: dict[str, int] = {}

    async def drive(count: int, first_each: bool) -> int:
        order = list(log_ids) if first_each else []
        order += [rng.choice(log_ids) for _ in range(count - len(order))]
        it = iter(order)
        ok = 0

        async def worker() -> None:
            nonlocal ok
            for log_id in it:
                try:
                    await client.append(log_id, payload)
                    ok += 1
                except LogError as exc:
                    errors[exc.status.name] = errors.get(exc.status.name, 0) + 1

        await asyncio.gather(*(worker() for _ in range(inflight)))
        return ok

    await drive(max(warmup, len(log_ids)), True)
    before = {node: process_cpu_s(pid) for node, pid in pids.items()}
    c0 = cpu_s()
    t0 = time.perf_counter()
    ok = await drive(records, False)
    elapsed_s = time.perf_counter() - t0
    client_s = cpu_s() - c0
    cpu_us: dict[str, float] = {}
    for node, pid in pids.items():
        after, start = process_cpu_s(pid), before[node]
        if after is not None and start is not None and ok:
            cpu_us[node] = round((after - start) / ok * 1e6, 2)
    return {"logs": len(log_ids), "records": ok, "elapsed_s": round(elapsed_s, 3),
            "records_per_s": round(ok / elapsed_s, 1),
            "client_cpu_us_per_record": round(client_s / ok * 1e6, 2) if ok else None,
            "node_cpu_us_per_record": cpu_us, "errors": errors}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    state = load_state(args.dir.resolve())
    if state is None:
        raise SystemExit(json.dumps({"error": f"no cluster.json in {args.dir}"}))
    pids = {str(n.node_id): n.pid for n in state.nodes}
    payload = os.urandom(args.size)
    rng = random.Random(args.seed)
    next_log = args.first_log
    results: list[dict[str, Any]] = []
    async with Client(state.sequencer_urls, connections_max=args.inflight,
                      ca=state.ca_file or None) as client:
        for round_no in range(1, args.rounds + 1):
            one_log_rate = None
            for logs in [1, *args.logs]:
                log_ids = list(range(next_log, next_log + logs))
                next_log += logs
                out = await one_run(client, log_ids, records=args.records,
                                    warmup=max(3000, args.warmup_per_log * logs),
                                    inflight=args.inflight, payload=payload, rng=rng,
                                    pids=pids)
                if logs == 1:
                    one_log_rate = out["records_per_s"]
                out.update(bench="seqlog_many_logs", round=round_no, inflight=args.inflight,
                           size=args.size, loadavg=loadavg(),
                           ratio_to_one_log=round(out["records_per_s"] / one_log_rate, 3)
                           if one_log_rate else None)
                print(json.dumps(out), flush=True)
                results.append(out)
    summary: dict[str, Any] = {"bench": "seqlog_many_logs_summary"}
    for logs in [1, *args.logs]:
        runs = [r for r in results if r["logs"] == logs]
        nodes = sorted({n for r in runs for n in r["node_cpu_us_per_record"]})
        summary[str(logs)] = {
            "ratio_median": statistics.median(r["ratio_to_one_log"] for r in runs),
            "records_per_s_median": statistics.median(r["records_per_s"] for r in runs),
            "cpu_us_per_record_median": {
                n: statistics.median(r["node_cpu_us_per_record"].get(n, 0.0) for r in runs)
                for n in nodes},
            "client_cpu_us_per_record_median": statistics.median(
                r["client_cpu_us_per_record"] for r in runs)}
    print(json.dumps(summary), flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_on_loop(args.loop, bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
