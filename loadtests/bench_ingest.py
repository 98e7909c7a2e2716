"""Spark ingest benchmark: throughput of ``seqlog ingest`` into Parquet, and freshness (how
long from an append's acknowledgement until the record is visible in Parquet).

Throughput: ``--records`` records of ``--size`` random bytes are appended over ``--logs`` fresh
logs, then the ingest job (``python -m spark_ingest.job``, ``--trigger available-now``, the
given ``--master``) copies them to Parquet. Reported: wall time of the whole job (JVM start
included) and of its micro-batches alone, as records/s, payload MB/s (10^6 bytes) and Parquet
MB/s (bytes of the committed files).

Freshness: a continuous ingest (``--interval-ms``) of one more fresh log runs while one record
is appended every ``--freshness-every-ms``; a watcher polls the sink's ``_spark_metadata`` log
every 20 ms and reads each newly committed file. Freshness of a record = the moment its file
was seen committed minus the moment its append was acknowledged (same process clock).

Prints one JSON line. Run from the repo root, against a running cluster:
``.venv/bin/python -m loadtests.bench_ingest --dir DIR --records 1000000 --size 1024``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from seqlog import Client, LogError, Status
from services.local_cluster import load_state

ROOT = Path(__file__).resolve().parents[1]
WATCH_INTERVAL_S = 0.02
APPEND_ATTEMPTS_MAX = 5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", action="append", help="node URL (repeatable)")
    target.add_argument("--dir", type=Path, help="local cluster directory (cluster.json)")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024, help="payload bytes per record")
    p.add_argument("--logs", type=int, default=4, help="logs the records are spread over")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--max-records-per-trigger", type=int)
    p.add_argument("--records-per-partition", type=int)
    p.add_argument("--work-dir", type=Path, help="output and checkpoints (default: a temp dir)")
    p.add_argument("--freshness-s", type=float, default=30.0, help="0 skips freshness")
    p.add_argument("--freshness-every-ms", type=int, default=100)
    p.add_argument("--interval-ms", type=int, default=500, help="micro-batch interval")
    p.add_argument("--label", default="")
    return p


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def committed_files(out: Path) -> list[Path]:
    """Files the sink's ``_spark_metadata`` log lists as committed."""
    meta = out / "_spark_metadata"
    found: list[Path] = []
    if not meta.is_dir():
        return found
    for entry in sorted(meta.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        for line in entry.read_text().splitlines()[1:]:
            item = json.loads(line)
            if item.get("action", "add") == "add":
                found.append(Path(item["path"].removeprefix("file:")))
    return found


def job_command(urls: list[str], logs: list[int], out: Path, checkpoint: Path,
                args: argparse.Namespace, trigger: str) -> list[str]:
    command = [sys.executable, "-m", "spark_ingest.job", "--url", ",".join(urls),
               "--logs", ",".join(map(str, logs)), "--to", str(out), "--checkpoint",
               str(checkpoint), "--master", args.master, "--trigger", trigger,
               "--interval-ms", str(args.interval_ms), "--progress-interval-ms", "0"]
    if args.max_records_per_trigger:
        command += ["--max-records-per-trigger", str(args.max_records_per_trigger)]
    if args.records_per_partition:
        command += ["--records-per-partition", str(args.records_per_partition)]
    return command


def fresh_logs(count: int) -> list[int]:
    first = int.from_bytes(os.urandom(4), "big") + 10_000_000
    return list(range(first, first + count))


async def fill(urls: list[str], logs: list[int], records: int, size: int) -> dict[str, Any]:
    """Appends ``records`` random payloads round-robin over ``logs`` in batches of 500.
    A timed-out batch (outcome unknown) is sent again. It carries a producer id and sequence,
    but Seqlog does not deduplicate them yet (README, "What is not built yet"), so such a
    retry may write the batch twice; the ingest side counts what the log holds."""
    batch = 500
    started = time.monotonic()
    producer = f"bench-ingest-{os.getpid()}-{time.time_ns()}"
    async with Client(urls) as client:
        gate = asyncio.Semaphore(4)

        async def one(log: int, count: int, seq: int) -> None:
            async with gate:
                # Random and distinct: Parquet would compress repeated payloads to nothing.
                blob = os.urandom(size * count)
                payloads = [blob[i * size:(i + 1) * size] for i in range(count)]
                for attempt in range(APPEND_ATTEMPTS_MAX):
                    try:
                        await client.append_batch(log, payloads,
                                                  producer_id=f"{producer}-{log}",
                                                  producer_seq=seq)
                        return
                    except LogError as exc:
                        if exc.status is not Status.TIMEDOUT or attempt + 1 == APPEND_ATTEMPTS_MAX:
                            raise

        jobs = []
        left = records
        seq = 0
        while left > 0:
            seq += 1
            for log in logs:
                count = min(batch, left)
                if count <= 0:
                    break
                jobs.append(one(log, count, seq))
                left -= count
        await asyncio.gather(*jobs)
    elapsed = time.monotonic() - started
    return {"fill_s": round(elapsed, 2), "fill_records_per_s": round(records / elapsed)}


def throughput(urls: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    logs = fresh_logs(args.logs)
    result = asyncio.run(fill(urls, logs, args.records, args.size))
    out, checkpoint = work / "throughput-out", work / "throughput-checkpoint"
    started = time.monotonic()
    done = subprocess.run(job_command(urls, logs, out, checkpoint, args, "available-now"),
                          cwd=ROOT, capture_output=True, text=True, timeout=7200)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"ingest failed ({done.returncode}):\n{done.stderr[-5000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    report = json.loads((checkpoint / "seqlog-ingest-report.json").read_text())
    batches_s = sum(b["duration_ms"] for b in report["batches"]) / 1000
    parquet_bytes = sum(p.stat().st_size for p in committed_files(out))
    records = summary["records"]
    payload_mb = summary["payload_bytes"] / 1e6
    if records != args.records:
        raise SystemExit(f"ingested {records} records, expected {args.records}")
    return {
        **result,
        "records": records,
        "batches": summary["batches"],
        "job_wall_s": round(wall_s, 2),
        "batches_s": round(batches_s, 2),
        "records_per_s_wall": round(records / wall_s),
        "records_per_s_batches": round(records / batches_s),
        "payload_mb_per_s_wall": round(payload_mb / wall_s, 2),
        "payload_mb_per_s_batches": round(payload_mb / batches_s, 2),
        "parquet_mb": round(parquet_bytes / 1e6, 1),
        "parquet_mb_per_s_batches": round(parquet_bytes / 1e6 / batches_s, 2),
    }


class Watcher:
    """Polls ``_spark_metadata``; for each newly committed file, when it was first seen."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.seen_at: dict[int, float] = {}
        """LSN -> monotonic time its file was seen committed."""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._files: set[Path] = set()

    def _run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for path in committed_files(self.out):
                if path in self._files:
                    continue
                self._files.add(path)
                for lsn in pq.read_table(path, columns=["lsn"]).column("lsn").to_pylist():
                    self.seen_at.setdefault(lsn, now)
            self.stop.wait(WATCH_INTERVAL_S)


def freshness(urls: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    log = fresh_logs(1)[0]
    out, checkpoint = work / "fresh-out", work / "fresh-checkpoint"
    acked_at: dict[int, float] = {}

    async def first_record() -> None:
        async with Client(urls) as client:
            await client.append(log, b"warm-up")

    asyncio.run(first_record())
    job = subprocess.Popen(job_command(urls, [log], out, checkpoint, args, "continuous-interval"),
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    watcher = Watcher(out)
    watcher.thread.start()
    try:
        deadline = time.monotonic() + 300
        while not watcher.seen_at:  # the job is up once the warm-up record is committed
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the continuous ingest did not start")
            time.sleep(0.1)

        async def append_steadily() -> None:
            async with Client(urls) as client:
                end = time.monotonic() + args.freshness_s
                while time.monotonic() < end:
                    answer = await client.append(log, os.urandom(args.size))
                    acked_at[answer.lsn] = time.monotonic()
                    await asyncio.sleep(args.freshness_every_ms / 1000)

        asyncio.run(append_steadily())
        deadline = time.monotonic() + 120
        while not set(acked_at) <= set(watcher.seen_at) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watcher.stop.set()
        watcher.thread.join(timeout=30)
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
    lags_ms = [(watcher.seen_at[lsn] - t) * 1000 for lsn, t in acked_at.items()
               if lsn in watcher.seen_at]
    return {
        "freshness_records": len(acked_at),
        "freshness_missing": len(acked_at) - len(lags_ms),
        "freshness_interval_ms": args.interval_ms,
        "freshness_p50_ms": round(percentile(lags_ms, 50)),
        "freshness_p90_ms": round(percentile(lags_ms, 90)),
        "freshness_p99_ms": round(percentile(lags_ms, 99)),
        "freshness_max_ms": round(max(lags_ms, default=float("nan"))),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dir is not None:
        state = load_state(args.dir.resolve())
        if state is None:
            raise SystemExit(f"no cluster.json in {args.dir}")
        urls = state.sequencer_urls
    else:
        urls = [u for item in args.url for u in item.split(",") if u]
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = args.work_dir or Path(tmp)
        result: dict[str, Any] = {"bench": "ingest", "label": args.label,
                                  "master": args.master, "size": args.size, "logs": args.logs,
                                  "loadavg_start": os.getloadavg()[0]}
        if args.records > 0:
            result.update(throughput(urls, args, work))
        if args.freshness_s > 0:
            result.update(freshness(urls, args, work))
        result["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
