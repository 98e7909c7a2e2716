"""Rebuild throughput (issue 17): RECORDS records of PAYLOAD bytes on a local cluster of 3
storage nodes and 2 sequencers (R=2, fsync=always), in append-batches of BATCH records (1:
single appends), then st2 is killed with -9, its data directory wiped and it is restarted;
prints the time until the cluster state says it is AUTHORITATIVE again (restart included),
what the donors sent, the CPU each storage process used meanwhile (also per record and per MB
sent), the nodes' peak RSS during the rebuild, the bytes each data directory held and the load
averages. A progress line every 10 s while it rebuilds; it gives up after DEADLINE_S.

    python loadtests/bench_rebuild.py DIR RECORDS PAYLOAD [RATE_BYTES_PER_S [BATCH [BY_COPYSET]]]

BY_COPYSET 1 sets ``rebuild_by_copyset`` (donors send only the copies whose copyset names
st2); by default both donors send every copy they hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from seqlog import Client
from services import local_cluster as lc
from shared.config import StorageConfig


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


DEADLINE_S = 3600.0
"""Most seconds to wait for the rebuild before reporting it stuck."""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def dir_bytes(path: str) -> int:
    total = 0
    for parent, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):  # a file removed meanwhile
                total += os.path.getsize(os.path.join(parent, name))
    return total


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def shard(http: str, node: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/v1/cluster", timeout=10) as answer:
        shards = json.loads(answer.read())["shards"]
    found: dict[str, Any] = next(s for s in shards if s["node_id"] == node)
    return found


def wipe(data_dir: str) -> None:
    for name in os.listdir(data_dir):
        if name in ("config.json", "node.log"):
            continue
        path = os.path.join(data_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


async def write(urls: list[str], records: int, size: int, batch: int) -> None:
    async with Client(urls, timeout_ms=60_000) as client:
        payload = b"x" * size
        limit = asyncio.Semaphore(8 if batch > 1 else 64)

        async def one(i: int) -> None:
            async with limit:
                if batch > 1:
                    await client.append_batch(1 + i % 4, [payload] * batch)
                else:
                    await client.append(1 + i % 4, payload)

        await asyncio.gather(*(one(i) for i in range(records // batch)))


def main(argv: list[str]) -> None:
    root, records, size = Path(argv[1]), int(argv[2]), int(argv[3])
    rate = int(argv[4]) if len(argv) > 4 else 0
    batch = int(argv[5]) if len(argv) > 5 else 500
    by_copyset = len(argv) > 6 and argv[6] == "1"
    shutil.rmtree(root, ignore_errors=True)
    # SIGTERM stops it like an exception: the cluster is brought down and its dir removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    state = lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=2, replication=2, base_port=lc.free_base_port(5),
        fsync="always", storage=StorageConfig(rebuild_rate_bytes_per_s=rate,
                                                     rebuild_by_copyset=by_copyset)),
        ready_timeout_ms=60_000)
    try:
        load_start = load_average()
        written = time.monotonic()
        asyncio.run(write(state.sequencer_urls, records, size, batch))
        write_s = time.monotonic() - written
        nodes: dict[str, lc.NodeEntry] = {str(n.node_id): n for n in state.nodes}
        held = {n: dir_bytes(nodes[n].data_dir) for n in ("st1", "st2", "st3")}
        print(json.dumps({"written_s": round(write_s, 1),
                          "write_MB_per_s": round(records * size / write_s / 1e6, 1),
                          "data_dir_bytes": held, "load": load_average()}), flush=True)
        os.kill(nodes["st2"].pid, signal.SIGKILL)
        time.sleep(0.5)
        wipe(nodes["st2"].data_dir)
        load_before = load_average()
        before = {n: cpu_s(nodes[n].pid) for n in ("st1", "st3")}
        started = time.monotonic()
        restarted = lc.restart(root, "st2")
        ready_s = time.monotonic() - started
        target_before = cpu_s(restarted.pid)
        pids = {"st1": nodes["st1"].pid, "st2": restarted.pid, "st3": nodes["st3"].pid}
        rss_peak = {n: 0.0 for n in pids}
        next_report = started + 10
        while True:
            found = shard(nodes["st1"].http, "st2")
            if found["status"] == "AUTHORITATIVE" and found["rebuilds_count"]:
                break
            for name, pid in pids.items():
                rss_peak[name] = max(rss_peak[name], rss_mib(pid))
            now = time.monotonic()
            if now >= next_report:
                next_report = now + 10
                print(json.dumps({
                    "at_s": round(now - started, 1), "status": found["status"],
                    "donors": {d["node_id"]: [d["records"], d["bytes"], d["bytes_total"],
                                              d["done"]] for d in found["donors"]},
                    "rss_mib": {n: round(rss_mib(p)) for n, p in pids.items()},
                    "load": load_average()}), flush=True)
            if now - started > DEADLINE_S:
                raise RuntimeError(f"not rebuilt after {DEADLINE_S} s: {found}")
            time.sleep(0.2)
        elapsed_s = time.monotonic() - started
        sent_bytes = sum(d["bytes"] for d in found["donors"])
        sent_records = sum(d["records"] for d in found["donors"])
        cpu = {n: cpu_s(nodes[n].pid) - before[n] for n in ("st1", "st3")}
        cpu["st2"] = cpu_s(restarted.pid) - target_before
        print(json.dumps({
            "records": records, "payload": size, "batch": batch, "rate_limit": rate,
            "by_copyset": by_copyset,
            "seconds": round(elapsed_s, 2), "st2_ready_s": round(ready_s, 2),
            "records_sent": sent_records,
            "bytes_sent": sent_bytes, "MB_per_s": round(sent_bytes / elapsed_s / 1e6, 1),
            "records_per_s": round(sent_records / elapsed_s),
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            "cpu_us_per_record": {k: round(v / max(sent_records, 1) * 1e6, 2)
                                  for k, v in cpu.items()},
            "cpu_ms_per_MB": {k: round(v / max(sent_bytes / 1e6, 1e-9) * 1e3, 2)
                              for k, v in cpu.items()},
            "target_cpu_us_per_record": round(cpu["st2"] / max(sent_records, 1) * 1e6, 1),
            "rss_peak_mib": {k: round(v) for k, v in rss_peak.items()},
            "data_dir_bytes_before": held,
            "st2_data_dir_bytes_after": dir_bytes(nodes["st2"].data_dir),
            "load_start": load_start, "load_before_rebuild": load_before,
            "load_after": load_average()}), flush=True)
    finally:
        lc.down(root)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
