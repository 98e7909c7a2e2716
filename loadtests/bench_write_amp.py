"""Write amplification: bytes the storage nodes write per byte appended, divided by R.

Starts a local cluster (3 storage nodes, 1 sequencer, R=3, fsync=always, file epoch store)
unless ``--dir`` names a running one, and for each ``--size`` appends records of that size to
a fresh log at full load, closed loop: ``--inflight`` single appends outstanding (``seqlog.Client``
over the binary protocol), or with ``--batch N`` (N > 1) append-batches of N records, for
``--seconds`` per size. Before and after each phase it reads every storage node's /metrics:

- ``bytes_written``: what the nodes' record stores handed to write() (entries with their
  headers, release and checkpoint entries; not the zeros segments are preallocated with),
  summed over the nodes. ``amplification`` = bytes_written / (payload bytes appended x R):
  1.0 means each copy was written once, with no overhead; a STORE written twice to a node
  (a spurious store timeout re-sent it) shows as up to 2.0.
- ``records_written_per_copy``: records the nodes wrote (``store_records``) per record
  appended x R, without the entry headers: 1.0 when no copy was written twice.
- ``store_messages``, ``stores_written``, ``stores_joined``: STOREs the nodes received,
  wrote, and answered with a write of the same copy already under way (not written again).
- CPU seconds of the sequencer and storage processes per MB appended (from /proc/PID/stat).

The phase ends when every append was acknowledged and the nodes' counters stopped moving
(late copies of re-sent waves still count). Prints one JSON document.

Run from the repo root::

    .venv/bin/python -m loadtests.bench_write_amp [--sizes 1024,262144,1048576]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadtests.bench_append import loadavg, process_cpu_s
from seqlog import Client
from services import local_cluster as lc

READY_TIMEOUT_MS = 60_000
SETTLE_S = 0.5
"""The counters must stay still this long for a phase to end."""
SETTLE_TIMEOUT_S = 30.0
COUNTERS = ("bytes_written", "store_messages", "stored_ok", "stores", "store_records",
            "stores_joined", "fsyncs", "commit_batches")
DEFAULT_INFLIGHT = {1024: 256, 262_144: 32, 1_048_576: 16}
"""Full load per size: enough in flight that the nodes' writers are never idle."""


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, help="a running local cluster (default: start one)")
    p.add_argument("--sizes", default="1024,262144,1048576",
                   help="record sizes in bytes, comma-separated")
    p.add_argument("--inflight", type=int, default=0,
                   help="appends outstanding (0: 256 for 1 KiB, 32 for 256 KiB, 16 for 1 MiB)")
    p.add_argument("--batch", type=int, default=1, help="records per append-batch (1: single)")
    p.add_argument("--seconds", type=float, default=10.0, help="appending time per size")
    p.add_argument("--logs", type=int, default=1,
                   help="fresh logs per size, each append to a random one (a sequencer "
                        "meets each log's first appends cold)")
    p.add_argument("--first-log", type=int, default=1000)
    p.add_argument("--replication", type=int, default=3)
    p.add_argument("--label", default="")
    return p.parse_args()


def _scrape(http: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in COUNTERS:
            prefix = f"seqlog_storage_{name} "
            if line.startswith(prefix):
                found[name] = float(line[len(prefix):])
    return found


def _totals(nodes: list[lc.NodeEntry]) -> dict[str, float]:
    totals = dict.fromkeys(COUNTERS, 0.0)
    for node in nodes:
        for name, value in _scrape(node.http).items():
            totals[name] += value
    return totals


def _cpu(pids: list[int]) -> float:
    return sum(process_cpu_s(pid) or 0.0 for pid in pids)


async def _settle(storage: list[lc.NodeEntry]) -> dict[str, float]:
    """The storage counters once they stop moving (late STOREs of re-sent waves land too)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = await asyncio.to_thread(_totals, storage)
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_S)
        now = await asyncio.to_thread(_totals, storage)
        if now == last:
            return now
        last = now
    return last


async def _phase(client: Client, log_id: int, size: int, args: argparse.Namespace,
                 state: lc.ClusterState) -> dict[str, Any]:
    storage = [n for n in state.nodes if "storage" in n.roles]
    sequencers = [n.pid for n in state.nodes if "sequencer" in n.roles]
    inflight = args.inflight or DEFAULT_INFLIGHT.get(size, 16)
    batch = args.batch
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    logs = list(range(log_id, log_id + args.logs))
    rng = random.Random(log_id)
    # Warm up: each log's sequencer activates and the client learns where it is.
    await asyncio.gather(*(client.append(log, b"w") for log in logs))
    before = await _settle(storage)
    cpu_seq, cpu_st = _cpu(sequencers), _cpu([n.pid for n in storage])
    appended = 0
    errors = 0
    first_error: list[str] = []
    deadline = time.monotonic() + args.seconds
    started = time.monotonic()

    async def worker() -> None:
        nonlocal appended, errors
        while time.monotonic() < deadline:
            log = logs[rng.randrange(len(logs))]
            try:
                if batch > 1:
                    await client.append_batch(log, [payload] * batch)
                else:
                    await client.append(log, payload)
            except Exception as exc:  # counted and shown: the phase is then not valid
                errors += 1
                first_error.append(repr(exc))
                return
            appended += batch

    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.monotonic() - started
    after = await _settle(storage)
    cpu_seq, cpu_st = _cpu(sequencers) - cpu_seq, _cpu([n.pid for n in storage]) - cpu_st
    delta = {name: after[name] - before[name] for name in COUNTERS}
    payload_bytes = appended * size
    r = args.replication
    return {
        "size": size, "logs": args.logs, "inflight": inflight, "batch": batch, "records": appended,
        "errors": errors, "first_error": first_error[:1], "seconds": round(elapsed, 2),
        "mb_per_s": round(payload_bytes / elapsed / 1e6, 2),
        "amplification": round(delta["bytes_written"] / max(payload_bytes * r, 1), 4),
        "records_written_per_copy": round(
            delta["store_records"] / max(appended * r, 1), 4),
        "store_messages": int(delta["store_messages"]),
        "stores_written": int(delta["stores"]),
        "stores_joined": int(delta["stores_joined"]),
        "fsyncs": int(delta["fsyncs"]),
        "bytes_written": int(delta["bytes_written"]),
        "sequencer_cpu_s_per_mb": round(cpu_seq / max(payload_bytes / 1e6, 1e-9), 4),
        "storage_cpu_s_per_mb": round(cpu_st / max(payload_bytes / 1e6, 1e-9), 4),
    }


async def _run(args: argparse.Namespace, state: lc.ClusterState) -> dict[str, Any]:
    out: dict[str, Any] = {"label": args.label, "loadavg_start": loadavg(), "phases": []}
    async with Client(state.sequencer_urls, timeout_ms=60_000) as client:
        for index, size in enumerate(int(s) for s in args.sizes.split(",")):
            print(f"size {size}", file=sys.stderr, flush=True)
            phase = await _phase(client, args.first_log + index * args.logs, size, args,
                                 state)
            print(json.dumps(phase), file=sys.stderr, flush=True)
            out["phases"].append(phase)
    out["loadavg_end"] = loadavg()
    return out


def main() -> int:
    args = _args()
    if args.dir is not None:
        state = lc.load_state(args.dir)
        assert state is not None, f"no cluster in {args.dir}"
        result = asyncio.run(_run(args, state))
    else:
        with tempfile.TemporaryDirectory(prefix="seqlog-bench-wamp-") as root:
            spec = lc.LocalClusterSpec(dir=Path(root), storage_nodes=3, sequencers=1,
                                       replication=args.replication,
                                       base_port=lc.free_base_port(4), fsync="always")
            state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
            try:
                result = asyncio.run(_run(args, state))
            finally:
                lc.down(Path(root))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
