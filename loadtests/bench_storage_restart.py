"""Restart time and RSS of one storage node against the entries it holds (issue 17 item 5).

One real storage node process (``--serve``: ``StorageNode`` behind the node protocol's TCP
server, on uvloop and with ``shared.malloc_tuning`` as ``services.node`` runs it) is filled
over the node protocol with STORE_BATCH messages of ``--batch`` single-record STOREs
(``--size``-byte payloads that hold their log and ESN, ``--logs`` logs round-robin, one batch
per log at a time, ``--inflight`` batches outstanding over ``--connections`` connections), so
the segment and index files are exactly what a cluster writes. The driver packs each STORE's
field array itself (checked byte for byte against ``shared.wire.codec.encode_fields`` once per
batch) so that it costs a few microseconds per entry against the node's tens. At each of
``--entries`` (cumulative, e.g. ``1000000,10000000``) the benchmark

1. samples the node's RSS (``/proc/PID/status`` VmRSS) every 0.2 s while it is written;
2. releases everything and reads ``--reads`` random windows of ``--read-records`` records
   spread over every log's whole LSN range over the protocol, sampling RSS; every record
   read is checked (LSN and payload);
3. kills it with SIGKILL and starts it again on the same data; ``restart_s`` is from the
   spawn of the new process to its READY line (Python start-up, imports, ``RecordStore.open``
   and the listening socket: what a supervisor waits for), ``open_s`` the store's open alone;
4. reads again (random windows, cold index cache) and samples RSS.

Prints a progress line every ``--progress-s`` seconds while filling, one JSON line per step
and a summary; SIGTERM stops it cleanly (node stopped, data directory removed). Run from the
repo root: ``.venv/bin/python -m loadtests.bench_storage_restart --entries 1000000,10000000
--dir D`` (``--dir`` is removed at the end unless ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgpack

from shared import malloc_tuning
from shared.config import StorageConfig, TransportConfig
from shared.net.pool import PeerPool
from shared.net.server import start_server
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import encode_fields
from shared.wire.read import Read, ReadReply
from shared.wire.release import Release
from shared.wire.store import Store, payloads_checksum, sequencer_store
from shared.wire.store_batch import StoreBatch, StoredBatch

NODE = NodeId("bench-st")
SEQUENCER = NodeId("bench-seq")
FINGERPRINT = "bench"
T0_MS = 1_700_000_000_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", default="1000000,10000000",
                   help="cumulative entry counts to measure at (comma separated)")
    p.add_argument("--size", type=int, default=100, help="payload bytes per record")
    p.add_argument("--logs", type=int, default=4)
    p.add_argument("--batch", type=int, default=1000, help="STOREs per STORE_BATCH")
    p.add_argument("--inflight", type=int, default=4, help="STORE_BATCHes outstanding")
    p.add_argument("--connections", type=int, default=1,
                   help="connections to the node the batches are spread over")
    p.add_argument("--restarts", type=int, default=3,
                   help="kill -9 and restart this many times at each step (each timed)")
    p.add_argument("--progress-s", type=float, default=30.0,
                   help="seconds between progress lines while filling")
    p.add_argument("--reads", type=int, default=2000, help="random READs per read phase")
    p.add_argument("--read-records", type=int, default=100, help="records_max of a READ")
    p.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    p.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    p.add_argument("--event-loop", choices=["uvloop", "asyncio"], default="uvloop",
                   help="the node's event loop (services.node uses uvloop)")
    p.add_argument("--malloc-tuning", choices=["on", "off"], default="on",
                   help="shared.malloc_tuning in the node (services.node: on)")
    return p


# ---- the node process ----

async def serve(data_dir: str, fsync: str) -> None:
    """The node, as ``services.node`` runs a storage node (its caller installs the loop)."""
    from storage_node.runtime import StorageNode

    started = time.perf_counter()
    node = StorageNode(node_id=NODE, data_dir=data_dir,
                       config=StorageConfig(fsync=fsync))  # type: ignore[arg-type]
    await node.start()
    open_s = time.perf_counter() - started
    server = await start_server("127.0.0.1", 0, node_id=NODE, cluster_fingerprint=FINGERPRINT,
                                handler=node, config=TransportConfig())
    print(json.dumps({"ready": True, "port": server.port, "open_s": round(open_s, 3),
                      "stats": {k: v for k, v in node.stats().items()
                                if k.startswith(("index", "segments", "corrupt"))}}),
          flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.close()
    await node.close()


# ---- the driver ----

class NodeProcess:
    def __init__(self, data_dir: str, args: argparse.Namespace) -> None:
        spawned = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "loadtests.bench_storage_restart", "--serve", data_dir,
             "--fsync", args.fsync, "--event-loop", args.event_loop,
             "--malloc-tuning", args.malloc_tuning], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.ready_s = time.perf_counter() - spawned
        if not line:
            raise RuntimeError("storage node exited before it was ready")
        info = json.loads(line)
        self.port: int = info["port"]
        self.open_s: float = info["open_s"]
        self.stats: dict[str, int] = info["stats"]

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as file:
            for line in file:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """User + system CPU seconds of the node process so far."""
        with open(f"/proc/{self.process.pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


class RssSampler:
    """RSS every 0.2 s; with ``progress``, also the peak per million entries held."""

    def __init__(self, node: NodeProcess, progress: Progress | None = None) -> None:
        self.node = node
        self.progress = progress
        self.peak = 0.0
        self.samples: list[float] = []
        self.by_million: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    def _sample(self) -> None:
        rss = self.node.rss_mib()
        self.samples.append(rss)
        self.peak = max(self.peak, rss)
        if self.progress is not None:
            million = -(-self.progress.entries // 1_000_000)
            self.by_million[million] = max(self.by_million.get(million, 0.0), rss)

    async def _run(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(0.2)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self._sample()


def pool_for(node: NodeProcess) -> PeerPool:
    return PeerPool(node_id=SEQUENCER, cluster_fingerprint=FINGERPRINT,
                    config=TransportConfig(),
                    addresses=lambda n: ("127.0.0.1", node.port) if n == NODE else None)


def lsn(esn: int) -> Lsn:
    return compose_lsn(Epoch(1), Esn(esn))


_HEAD = struct.Struct(">IQ")


def payload_of(log_id: int, esn: int, size: int) -> bytes:
    """The payload of record ``esn`` of ``log_id``: its log and ESN, then filler, so that a
    read checks that each record is the one written at its LSN."""
    return _HEAD.pack(log_id, esn) + b"x" * (size - _HEAD.size)


class StorePacker:
    """The packed field array of a single-record STORE as a sequencer sends it (what
    ``encode_fields(sequencer_store(...))`` gives), built from a list without a ``Store``
    object; ``check`` compares the two for one entry."""

    def __init__(self, size: int) -> None:
        assert size >= _HEAD.size
        self.size = size
        self.filler = b"x" * (size - _HEAD.size)
        self.pack = msgpack.Packer(use_bin_type=True).pack
        self.copyset = (NODE,)

    def store(self, log_id: int, esn: int) -> Store:
        payloads = (payload_of(log_id, esn, self.size),)
        return sequencer_store(
            LogId(log_id), lsn(esn), 1, SEQUENCER, self.copyset, T0_MS + esn, Esn(0), Lsn(0),
            60_000, None, payloads, payloads_checksum(payloads), (), 0, 0)

    def packed(self, log_id: int, first: int, count: int) -> tuple[bytes, ...]:
        pack, head, filler, copyset = self.pack, _HEAD.pack, self.filler, self.copyset
        crc = payloads_checksum
        epoch = compose_lsn(Epoch(1), Esn(0))
        out = []
        for esn in range(first, first + count):
            payloads = (head(log_id, esn) + filler,)
            # The field order of shared.wire.store.Store; trailing defaults left out.
            out.append(pack([log_id, epoch | esn, 1, SEQUENCER, copyset, T0_MS + esn, 0, 0,
                             60_000, None, payloads, crc(payloads), 0, ()]))
        return tuple(out)

    def check(self, log_id: int, esn: int, packed: bytes) -> None:
        want = encode_fields(self.store(log_id, esn))
        if packed != want:
            raise AssertionError(f"packed STORE differs from the codec's: {packed!r} {want!r}")


class Progress:
    """Entries acknowledged so far (all steps), for the samplers and the progress lines."""

    def __init__(self) -> None:
        self.entries = 0


async def fill(node: NodeProcess, next_esn: dict[int, int], count: int,
               args: argparse.Namespace, progress: Progress) -> None:
    """``count`` more single-record entries, spread over the logs a batch at a time."""
    pools = [pool_for(node) for _ in range(args.connections)]
    packer = StorePacker(args.size)
    semaphore = asyncio.Semaphore(args.inflight)
    failures: list[Any] = []
    tasks: set[asyncio.Task[None]] = set()
    ok = int(Status.OK)

    async def send(pool: PeerPool, batch: StoreBatch) -> None:
        try:
            answer = await pool.call(NODE, batch, 60_000)
            if not isinstance(answer, StoredBatch) or answer.statuses.count(ok) != len(
                    batch.packed or ()):
                failures.append(answer if not isinstance(answer, StoredBatch)
                                else sorted(set(answer.statuses)))
            else:
                progress.entries += len(answer.statuses)
        finally:
            semaphore.release()

    sent = 0
    turn = 0
    try:
        while sent < count:
            log_id = 1 + turn % args.logs
            pool = pools[turn % len(pools)]
            turn += 1
            size = min(args.batch, count - sent)
            first = next_esn[log_id]
            packed = packer.packed(log_id, first, size)
            packer.check(log_id, first, packed[0])
            # The pool sends only ``packed`` (encode_store_batch_parts); ``stores`` must only
            # have its length, so one STORE stands for all of them.
            batch = StoreBatch(stores=(packer.store(log_id, first),) * size).with_packed(packed)
            next_esn[log_id] = first + size
            sent += size
            await semaphore.acquire()
            if failures:
                raise RuntimeError(f"STORE_BATCH failed: {failures[:3]}")
            task = asyncio.get_running_loop().create_task(send(pool, batch))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        if failures:
            raise RuntimeError(f"STORE_BATCH failed: {failures[:3]}")
    finally:
        for task in tasks:
            task.cancel()
        for pool in pools:
            await pool.close()


async def read_random(node: NodeProcess, next_esn: dict[int, int],
                      args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Release everything, then random READ windows over every log's whole range; checks
    that each returns ``read_records`` records from where it started."""
    pool = pool_for(node)
    rng = random.Random(seed)
    latencies: list[float] = []
    try:
        for log_id, end in next_esn.items():
            pool.send(NODE, Release(log_id=LogId(log_id), release_lsn=lsn(end - 1)))
        await asyncio.sleep(0.5)
        for _ in range(args.reads):
            log_id = rng.choice(list(next_esn))
            end = next_esn[log_id]
            start = rng.randrange(1, max(end - args.read_records, 2))
            started = time.perf_counter()
            answer = await pool.call(NODE, Read(
                log_id=LogId(log_id), from_lsn=lsn(start), until_lsn=lsn(end - 1),
                release_lsn=lsn(end - 1), records_max=args.read_records,
                bytes_max=1 << 30), 60_000)
            latencies.append(time.perf_counter() - started)
            assert isinstance(answer, ReadReply), answer
            assert answer.status is Status.OK, answer.status
            want = min(args.read_records, end - start)
            got = [r[0] for r in answer.records]
            assert got == [lsn(start + i) for i in range(want)], (log_id, start, got[:3])
            for i, record in enumerate(answer.records):
                assert record[3] == payload_of(log_id, start + i, args.size), (
                    log_id, start + i, record[3][:16])
    finally:
        await pool.close()
    latencies.sort()
    return {"reads": len(latencies),
            "read_p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
            "read_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2)}


def disk_bytes(data_dir: str) -> dict[str, int]:
    segments = os.path.join(data_dir, "segments")
    seg = idx = 0
    for name in os.listdir(segments):
        size = os.path.getsize(os.path.join(segments, name))
        if name.endswith(".seg"):
            seg += size
        elif name.endswith(".idx"):
            idx += size
    return {"segment_bytes": seg, "index_bytes": idx}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def report_progress(node_of: list[NodeProcess], progress: Progress,
                          interval_s: float) -> None:
    """A line every ``interval_s`` while filling: entries, rate, RSS, CPU per entry."""
    last_t, last_n = time.perf_counter(), progress.entries
    last_cpu, last_pid = node_of[0].cpu_s(), node_of[0].process.pid
    while True:
        await asyncio.sleep(interval_s)
        node = node_of[0]
        now, count, cpu = time.perf_counter(), progress.entries, node.cpu_s()
        if node.process.pid != last_pid:  # restarted meanwhile: its CPU counts from 0
            last_pid, last_cpu = node.process.pid, 0.0
        done = count - last_n
        print(json.dumps({
            "progress": count, "entries_per_s": round(done / (now - last_t)),
            "node_cpu_us_per_entry": round((cpu - last_cpu) * 1e6 / done, 1) if done else None,
            "rss_mib": round(node.rss_mib(), 1), "load": load_average(),
            "utc": time.strftime("%H:%M:%S", time.gmtime())}), flush=True)
        last_t, last_n, last_cpu = now, count, cpu


async def run(args: argparse.Namespace, data_dir: str) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    loop.add_signal_handler(signal.SIGTERM, me.cancel)  # finally blocks run: node stopped
    targets = [int(x) for x in args.entries.split(",")]
    next_esn = {log_id: 1 for log_id in range(1, args.logs + 1)}
    held = 0
    results: list[dict[str, Any]] = []
    progress = Progress()
    node_of = [NodeProcess(data_dir, args)]
    reporter = loop.create_task(report_progress(node_of, progress, args.progress_s))
    try:
        for target in targets:
            node = node_of[0]
            started = time.perf_counter()
            load_before = load_average()
            node_cpu, client_cpu = node.cpu_s(), time.process_time()
            with RssSampler(node, progress) as writing:
                await fill(node, next_esn, target - held, args, progress)
            fill_s = time.perf_counter() - started
            node_us = (node.cpu_s() - node_cpu) * 1e6 / (target - held)
            client_us = (time.process_time() - client_cpu) * 1e6 / (target - held)
            rate = (target - held) / fill_s
            load_after = load_average()
            held = target
            with RssSampler(node) as reading:
                before = await read_random(node, next_esn, args, seed=held)
            restarts: list[tuple[float, float]] = []
            for _ in range(args.restarts):
                node.kill()
                node = node_of[0] = NodeProcess(data_dir, args)
                restarts.append((round(node.ready_s, 3), node.open_s))
            ready_rss = node.rss_mib()
            with RssSampler(node) as after:
                cold = await read_random(node, next_esn, args, seed=held + 1)
            step = {
                "entries": held, **disk_bytes(data_dir), "fill_s": round(fill_s, 1),
                "fill_entries_per_s": round(rate),
                "fill_node_cpu_us_per_entry": round(node_us, 1),
                "fill_client_cpu_us_per_entry": round(client_us, 1),
                "load_before_fill": load_before, "load_after_fill": load_after,
                "rss_write_peak_mib": round(writing.peak, 1),
                "rss_write_last_mib": round(writing.samples[-1], 1),
                "rss_write_peak_per_million_mib": {
                    m: round(v) for m, v in sorted(writing.by_million.items())},
                "rss_read_peak_mib": round(reading.peak, 1), **before,
                "restarts_ready_open_s": restarts,
                "restart_s": min(r[0] for r in restarts),
                "open_s": min(r[1] for r in restarts),
                "rss_ready_mib": round(ready_rss, 1),
                "rss_read_after_restart_peak_mib": round(after.peak, 1),
                "after_restart": cold, "node_stats_at_ready": node.stats,
            }
            print(json.dumps(step), flush=True)
            results.append(step)
    finally:
        reporter.cancel()
        node_of[0].stop()
    return results


def main() -> None:
    args = build_parser().parse_args()
    if args.serve is not None:
        # As services.node: batch buffers kept in the heap, uvloop unless told otherwise.
        if args.malloc_tuning == "on":
            malloc_tuning.tune()
        if args.event_loop == "uvloop":
            import uvloop
            uvloop.install()
        asyncio.run(serve(args.serve, args.fsync))
        return
    data_dir = args.dir or tempfile.mkdtemp(prefix="seqlog-restart-")
    os.makedirs(data_dir, exist_ok=True)
    try:
        results = asyncio.run(run(args, data_dir))
    except asyncio.CancelledError:
        print(json.dumps({"stopped": "SIGTERM"}), flush=True)
        return
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps({"summary": [
        {k: r[k] for k in ("entries", "restart_s", "open_s", "rss_write_peak_mib",
                           "rss_read_peak_mib", "rss_ready_mib",
                           "rss_read_after_restart_peak_mib", "segment_bytes", "index_bytes")}
        for r in results]}), flush=True)


if __name__ == "__main__":
    main()
