"""Micro-benchmark of one storage node: closed-loop STOREs through ``StorageNode.on_message``
(no network), same semantics as the peer benchmarks (shared/peers/common.py).

Each STORE reaches the node as the transport hands it over: its frame is encoded before the
measurement starts (that is the sequencer's cost) and decoded by ``shared.wire.codec.decode``
inside it (``--no-codec`` hands over the ``Store`` objects instead). ``cpu_us_per_record`` is
this process's CPU time (all threads: loop, writer) per measured record.

``--tail``: every STORE carries the release pointer as a sequencer under load sends it (the
highest LSN below which every record is acknowledged), so the node learns releases only from
STOREs, and one tailing reader keeps a long-poll READ (``wait_ms``) open on the log.
``tail_p50_ms``/``tail_p99_ms``: from the moment a record became releasable (its STORED OK,
after which the next STORE carries it) to its delivery to the reader. Frames are encoded when
issued in this mode (the release is only known then), so the CPU includes that encoding.

At most ``--inflight`` STOREs of ``--batch`` records (default 1) of ``--size`` bytes are
outstanding; ``--records`` counts STOREs (``records_per_s`` and ``cpu_us_per_record`` count
records); latency is
from just before ``on_message`` to the STORED(OK) reply, i.e. queueing + group commit + fsync
(per ``--fsync``). ``--warmup`` records go first, unmeasured. Prints one JSON line with the
commit statistics (records per fsync shows the group commit at work).

Preallocation (``storage_node/segment_files.py``): ``fdatasyncs`` counts the commits made
inside zero-filled space, ``zero_fill_bytes`` the zeros written meanwhile, and
``file_bytes_per_byte_written`` is (entry bytes + zeros) / entry bytes (2.0 in the long run:
every segment byte is written as a zero first). ``--preallocate-bytes 0`` turns it off for an
A/B in the same code. What reaches the disk is best counted at the block device (writes in
``/sys/block/DEV/stat``, on a file system no one else uses):
``proc_io_write_bytes_per_byte_written`` (``/proc/self/io``) counts page-cache dirtying, not
disk writes.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_storage [--records N] ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import tempfile
import time
from typing import Any

from shared.config import StorageConfig
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import Message, decode, encode
from shared.wire.read import Read, ReadReply
from shared.wire.store import Store, Stored, payloads_checksum
from storage_node import segment_files
from storage_node.runtime import StorageNode

NODE = NodeId("bench-storage")
READER = NodeId("client.bench-tail")
SEQUENCER = NodeId("bench-seq")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20_000, help="measured records")
    p.add_argument("--size", type=int, default=1024, help="payload bytes per record")
    p.add_argument("--inflight", type=int, default=64, help="max outstanding STOREs")
    p.add_argument("--batch", type=int, default=1,
                   help="records per STORE (a batch append: consecutive LSNs)")
    p.add_argument("--warmup", type=int, default=500, help="unmeasured records sent first")
    p.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    p.add_argument("--dir", default=None, help="data directory (default: a fresh temp dir)")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--tail", action="store_true",
                   help="STOREs carry the release pointer; measure delivery to a tailing reader")
    p.add_argument("--preallocate-bytes", type=int, default=None,
                   help="zero-filled space kept ahead of the writes (segment_files; 0: off)")
    p.add_argument("--no-codec", dest="codec", action="store_false",
                   help="hand Store objects to the node instead of decoding frames")
    return p


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Driver:
    """Keeps ``inflight`` STOREs outstanding until ``total`` have been acknowledged."""

    def __init__(self, node: StorageNode, payload: bytes, inflight: int, codec: bool,
                 batch: int = 1, tail: bool = False) -> None:
        self._node = node
        self._payload = payload
        self._batch = batch
        self._tail = tail
        self._acked: set[int] = set()
        self._acked_through = 0
        """Highest ESN up to which every record is acknowledged (what gets released)."""
        self.released_ns: dict[int, int] = {}
        """ESN -> when it became releasable (tail mode, measured run)."""
        self._inflight = inflight
        self._codec = codec
        self._next_esn = 1
        self._frames: dict[int, bytes] = {}
        self.latencies_ms: list[float] = []

    def prepare(self, total: int) -> None:
        """Encode the frame bodies of the next ``total`` STOREs (outside the measurement)."""
        if self._codec and not self._tail:
            self._frames = {esn: encode(self._store(esn), esn)[4:] for esn in range(
                self._next_esn, self._next_esn + total * self._batch, self._batch)}

    def _message(self, esn: int) -> Message:
        if self._tail:
            release = compose_lsn(Epoch(1), Esn(self._acked_through))
            if not self._codec:
                return self._store(esn, release)
            decoded = decode(encode(self._store(esn, release), esn)[4:])
            assert not isinstance(decoded, Status)
            return decoded[1]
        if not self._codec:
            return self._store(esn)
        decoded = decode(self._frames.pop(esn))
        assert not isinstance(decoded, Status)
        return decoded[1]

    async def run(self, total: int, *, measure: bool) -> None:
        done = asyncio.get_running_loop().create_future()
        remaining = total
        issued = 0

        def issue() -> None:
            nonlocal issued
            issued += 1
            esn = self._next_esn
            self._next_esn += self._batch
            started_ns = time.perf_counter_ns()

            def reply(message: Message) -> None:
                nonlocal remaining
                assert isinstance(message, Stored) and message.status == Status.OK, message
                now_ns = time.perf_counter_ns()
                if measure:
                    self.latencies_ms.append((now_ns - started_ns) / 1e6)
                if self._tail:
                    self._note_acked(esn, now_ns, measure)
                remaining -= 1
                if remaining == 0:
                    done.set_result(None)
                elif issued < total:
                    issue()

            self._node.on_message(SEQUENCER, self._message(esn), reply)

        for _ in range(min(self._inflight, total)):
            issue()
        await done

    def _note_acked(self, esn: int, now_ns: int, measure: bool) -> None:
        self._acked.update(range(esn, esn + self._batch))
        while self._acked_through + 1 in self._acked:
            self._acked_through += 1
            self._acked.discard(self._acked_through)
            if measure:
                self.released_ns[self._acked_through] = now_ns

    def _store(self, esn: int, release_lsn: int = 0) -> Store:
        payloads = (self._payload,) * self._batch
        lsn = compose_lsn(Epoch(1), Esn(esn))
        return Store(log_id=LogId(1), lsn=lsn, wave=1, sequencer_node=SEQUENCER,
                     copyset=(NODE,), timestamp_ms=0, last_known_good=Esn(0),
                     release_lsn=Lsn(release_lsn), timeout_ms=10_000, key=None,
                     payloads=payloads, checksum=payloads_checksum(payloads))


class Tailer:
    """One tailing reader: a long-poll READ from the next LSN, again after every answer."""

    WAIT_MS = 1_000

    def __init__(self, node: StorageNode, driver: Driver) -> None:
        self._node = node
        self._driver = driver
        self._next_esn = 1
        self._stopped = False
        self.latencies_ms: list[float] = []

    def start(self) -> None:
        self._issue()

    def stop(self) -> None:
        self._stopped = True

    def _issue(self) -> None:
        read = Read(log_id=LogId(1), from_lsn=compose_lsn(Epoch(1), Esn(self._next_esn)),
                    until_lsn=Lsn(2**64 - 2), release_lsn=Lsn(0), records_max=1000,
                    bytes_max=1 << 24, wait_ms=self.WAIT_MS)
        self._node.on_message(READER, read, self._answered)

    def _answered(self, message: Message) -> None:
        assert isinstance(message, ReadReply) and message.status == Status.OK, message
        now_ns = time.perf_counter_ns()
        released = self._driver.released_ns
        for lsn, *_ in message.records:
            started_ns = released.pop(lsn & 0xFFFFFFFF, None)
            if started_ns is not None:
                self.latencies_ms.append((now_ns - started_ns) / 1e6)
        self._next_esn = max(self._next_esn, message.next_lsn & 0xFFFFFFFF)
        if not self._stopped:
            self._issue()


def io_write_bytes() -> int:
    """``/proc/self/io`` write_bytes (0 where there is no such file). It counts what the
    process dirtied in the page cache, which overstates the disk traffic: the kernel accounts
    every page (and every large folio: 2 MiB for a zero-filled region on Linux 6.x) each time
    a write dirties it again after an fsync cleaned it."""
    try:
        with open("/proc/self/io") as file:
            for line in file:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def bench(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    if args.preallocate_bytes is not None:
        segment_files.PREALLOCATE_BYTES = args.preallocate_bytes
    config = StorageConfig(fsync=args.fsync, disk_free_bytes_min=0)
    node = StorageNode(node_id=NODE, data_dir=data_dir, config=config)
    await node.start()
    try:
        driver = Driver(node, os.urandom(args.size), args.inflight, args.codec, args.batch,
                        args.tail)
        tailer = Tailer(node, driver)
        if args.tail:
            tailer.start()
        driver.prepare(args.warmup)
        await driver.run(args.warmup, measure=False)
        driver.prepare(args.records)
        before = node.stats()
        io_start = io_write_bytes()
        cpu_start, wall_start = cpu_s(), time.perf_counter()
        await driver.run(args.records, measure=True)
        wall_s = time.perf_counter() - wall_start
        cpu_used_s = cpu_s() - cpu_start
        io_bytes = io_write_bytes() - io_start
        after = node.stats()
        tailer.stop()
    finally:
        await node.close()
    tail = sorted(tailer.latencies_ms)
    latencies = sorted(driver.latencies_ms)
    fsyncs = after["fsyncs"] - before["fsyncs"]
    batches = after["commit_batches"] - before["commit_batches"]
    return {
        "bench": "storage_node.on_message", "fsync": args.fsync, "size": args.size,
        "inflight": args.inflight, "records": args.records * args.batch, "loop": args.loop,
        "batch": args.batch,
        "records_per_s": round(args.records * args.batch / wall_s, 1),
        "MB_per_s": round(args.records * args.batch * args.size / wall_s / 1e6, 2),
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        "p999_ms": round(percentile(latencies, 99.9), 3),
        "max_ms": round(latencies[-1], 3),
        "fsyncs": fsyncs, "commit_batches": batches,
        "records_per_fsync": round(args.records * args.batch / fsyncs, 1) if fsyncs else None,
        "records_per_batch": (round(args.records * args.batch / batches, 1) if batches
                              else None),
        "cpu_util": round(cpu_used_s / wall_s, 2),
        "cpu_us_per_record": round(cpu_used_s / (args.records * args.batch) * 1e6, 2),
        "inline_commits": after.get("inline_commits", 0) - before.get("inline_commits", 0),
        "fdatasyncs": after.get("fdatasyncs", 0) - before.get("fdatasyncs", 0),
        "zero_fill_bytes": after.get("zero_fill_bytes", 0) - before.get("zero_fill_bytes", 0),
        "bytes_written": after["bytes_written"] - before["bytes_written"],
        "file_bytes_per_byte_written": (
            round(1 + (after.get("zero_fill_bytes", 0) - before.get("zero_fill_bytes", 0))
                  / (after["bytes_written"] - before["bytes_written"]), 2)
            if after["bytes_written"] > before["bytes_written"] else None),
        "proc_io_write_bytes_per_byte_written": (
            round(io_bytes / (after["bytes_written"] - before["bytes_written"]), 2)
            if after["bytes_written"] > before["bytes_written"] else None),
        "codec": args.codec,
        **({"tail_delivered": len(tail), "tail_p50_ms": round(percentile(tail, 50), 3),
            "tail_p99_ms": round(percentile(tail, 99), 3),
            "inline_reads": after.get("inline_reads", 0) - before.get("inline_reads", 0)}
           if args.tail else {}),
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    args = build_parser().parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    if args.dir:
        result = asyncio.run(bench(args, args.dir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-storage-") as data_dir:
            result = asyncio.run(bench(args, data_dir))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
