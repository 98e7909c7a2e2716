"""Retention benchmark: how much disk age-based retention frees on a real local cluster, and
how long it takes.

Starts ``seqlog local up``-style processes (3 storage nodes, 1 sequencer, R=3) with
``log_backlog_ms = --backlog-ms`` and ``--segment-mib`` segments, writes ``--mib`` MiB of
payload across ``--logs`` logs (append-batch of ``--batch`` records of ``--record-bytes``), and
a small record to one more log that is kept forever (a ``log_backlogs`` override) every
``--kept-every`` batches, so that some segments are mixed and must be compacted rather than
deleted. Then it waits until every aged log is trimmed to its last record and the storage
nodes' segment files stop shrinking, and prints one JSON line: disk bytes per storage node
right after writing and at the end, the time from "the last record is older than the backlog"
to "every node's disk is at its final size", and the nodes' reclaim counters.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_retention --dir DIR [--mib 64]``
(DIR must not hold a running cluster; it is stopped at the end unless ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from seqlog import Client, Gap, Record
from services import local_cluster as lc
from shared.config import LogBacklog, StorageConfig
from shared.types import Lsn

FIRST_LOG = 1000
KEPT_LOG = 999
POLL_S = 0.1
STABLE_POLLS = 10
"""The disk counts as reclaimed once no node's size changed for this many polls."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="cluster directory (created)")
    p.add_argument("--mib", type=int, default=64, help="MiB of payload written to aged logs")
    p.add_argument("--logs", type=int, default=4, help="aged logs written round-robin")
    p.add_argument("--record-bytes", type=int, default=16 * 1024, help="payload per record")
    p.add_argument("--batch", type=int, default=16, help="records per append-batch")
    p.add_argument("--kept-every", type=int, default=8,
                   help="one record to the kept-forever log every N batches (0: none)")
    p.add_argument("--backlog-ms", type=int, default=15_000, help="retention of aged logs")
    p.add_argument("--segment-mib", type=int, default=4, help="segment_bytes_max in MiB")
    p.add_argument("--retention-interval-ms", type=int, default=1_000)
    p.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    p.add_argument("--timeout-s", type=float, default=600, help="give up after this long")
    p.add_argument("--keep", action="store_true", help="leave the cluster running")
    return p


def segments_bytes(data_dir: str) -> int:
    directory = Path(data_dir) / "segments"
    return sum(p.stat().st_size for p in directory.iterdir() if p.name.endswith(".seg"))


def storage_metrics(http: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = ("disk_bytes", "segments", "live_bytes", "segments_deleted", "bytes_deleted",
              "segments_compacted", "bytes_compacted", "bytes_copied", "segments_rolled",
              "checkpoint_entries", "retention_passes", "retention_trims", "reclaim_failures")
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("seqlog_storage_") and name[len("seqlog_storage_"):] in wanted:
            values[name[len("seqlog_storage_"):]] = float(value)
    return values


async def write(client: Client, args: argparse.Namespace) -> tuple[dict[int, int], int, int]:
    """Append the aged logs' records (and the kept log's); returns each aged log's last
    LSN, the kept log's record count and the payload bytes written."""
    batches = max(1, args.mib * 1024 * 1024 // (args.record_bytes * args.batch))
    last: dict[int, int] = {}
    kept = written = 0
    for index in range(batches):
        log_id = FIRST_LOG + index % args.logs
        payloads = [((b"%d:%d:%d " % (log_id, index, j)) * args.record_bytes)[:args.record_bytes]
                    for j in range(args.batch)]
        last[log_id] = (await client.append_batch(log_id, payloads)).last_lsn
        written += args.record_bytes * args.batch
        if args.kept_every and index % args.kept_every == 0:
            await client.append(KEPT_LOG, b"kept %d" % kept)
            kept += 1
    return last, kept, written


async def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = lc.LocalClusterSpec(
        dir=args.dir, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync=args.fsync, log_backlog_ms=args.backlog_ms,
        log_backlogs=(LogBacklog(first_log_id=KEPT_LOG, last_log_id=KEPT_LOG, backlog_ms=0),),
        storage=StorageConfig(segment_bytes_max=args.segment_mib * 1024 * 1024,
                              retention_interval_ms=args.retention_interval_ms))
    state = await asyncio.to_thread(lc.up, spec, ready_timeout_ms=60_000)
    storage = [n for n in state.nodes if "storage" in n.roles]
    try:
        async with Client(state.sequencer_urls, timeout_ms=60_000) as client:
            started_s = time.monotonic()
            last, kept, written = await write(client, args)
            written_s = time.monotonic()
            before = {n.node_id: segments_bytes(n.data_dir) for n in storage}
            # The last record ages at written_s + backlog: no earlier measurement counts.
            aged_s = written_s + args.backlog_ms / 1000
            deadline = time.monotonic() + args.timeout_s
            for log_id, last_lsn in last.items():
                while (await client.tail(log_id)).trim_lsn < last_lsn:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"log {log_id} was not trimmed in time")
                    await asyncio.sleep(POLL_S)
            trimmed_s = time.monotonic()
            sizes = {n.node_id: segments_bytes(n.data_dir) for n in storage}
            stable = 0
            final_s = time.monotonic()
            while stable < STABLE_POLLS:
                if time.monotonic() > deadline:
                    raise TimeoutError("the disk never stopped shrinking")
                await asyncio.sleep(POLL_S)
                now = {n.node_id: segments_bytes(n.data_dir) for n in storage}
                if now != sizes:
                    sizes, stable, final_s = now, 0, time.monotonic()
                else:
                    stable += 1
            first = await client.read(FIRST_LOG, Lsn(1), limit=10)
            entries = first.entries()
            kept_ok = True
            if kept:
                kept_read = await client.read(KEPT_LOG, Lsn(1), limit=kept)
                kept_ok = [e.payload for e in kept_read.entries() if isinstance(e, Record)] == [
                    b"kept %d" % i for i in range(kept)]
        metrics = {n.node_id: storage_metrics(n.http) for n in storage}
    finally:
        if not args.keep:
            await asyncio.to_thread(lc.down, args.dir)
    return {
        "bench": "retention", "mib": args.mib, "logs": args.logs,
        "record_bytes": args.record_bytes, "batch": args.batch, "fsync": args.fsync,
        "backlog_ms": args.backlog_ms, "segment_mib": args.segment_mib,
        "retention_interval_ms": args.retention_interval_ms, "kept_records": kept,
        "payload_bytes_written": written, "write_s": round(written_s - started_s, 2),
        "measured_before_aging": written_s < aged_s,
        "disk_bytes_before": before, "disk_bytes_after": sizes,
        "freed_fraction": round(1 - sum(sizes.values()) / max(sum(before.values()), 1), 4),
        "trimmed_after_aging_s": round(trimmed_s - aged_s, 2),
        "reclaimed_after_aging_s": round(max(final_s, trimmed_s) - aged_s, 2),
        "first_entry_is_trim_gap": bool(entries) and isinstance(entries[0], Gap)
        and entries[0].type == "TRIM",
        "kept_log_intact": kept_ok,
        "storage_metrics": metrics,
    }


def main() -> int:
    args = build_parser().parse_args()
    if args.mib < 1 or args.logs < 1 or args.batch < 1 or args.record_bytes < 16:
        print("bench_retention: --mib, --logs, --batch must be >= 1, --record-bytes >= 16",
              file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
