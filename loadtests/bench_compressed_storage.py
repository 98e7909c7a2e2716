"""Storage cost of compressed batches: disk bytes and storage-node CPU per record, plain vs
lz4 vs zstd, for JSON log lines and for incompressible payloads.

One in-process storage node (fsync as given, default ``never`` so that the disk does not
dominate) takes ``--batches`` STOREs of ``--records`` records of about ``--record-bytes``
bytes each; each STORE is decoded from its wire frame first (what a storage node pays on
receipt). Then every record is read back by READs of ``--read-records`` records, as a reader
would (blocks stay compressed; the reader's expansion is measured apart). Prints one JSON line
per payload kind and codec: disk bytes per record, storage CPU (``time.process_time``) per
record for STOREs and READs, the reader's CPU per record to expand what it read, and the
edge's CPU per record to check a compressed batch (``shared.compression.check_batch``).

Run from the repo root: ``.venv/bin/python -m loadtests.bench_compressed_storage``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from typing import Any

from shared.compression import Codec, check_batch, compress_batch
from shared.config import StorageConfig
from shared.read_merge import expand_blocks
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire import codec as wire
from shared.wire.framing import FrameDecoder
from shared.wire.read import Read, ReadReply
from shared.wire.release import Release
from shared.wire.store import Store, Stored, payloads_checksum
from storage_node.runtime import StorageNode

LOG = LogId(1)
STORES_IN_FLIGHT = 8
SERVICES = ("checkout", "payments", "search", "auth", "inventory")
LEVELS = ("info", "info", "info", "warn", "error", "debug")


def json_line(rng: random.Random, size: int) -> bytes:
    """A realistic structured log line, padded with a stack-trace-like message to ``size``."""
    doc: dict[str, Any] = {
        "ts": f"2026-11-24T06:{rng.randrange(60):02d}:{rng.randrange(60):02d}."
              f"{rng.randrange(1000):03d}Z",
        "level": rng.choice(LEVELS), "service": rng.choice(SERVICES),
        "host": f"ip-10-0-{rng.randrange(8)}-{rng.randrange(256)}",
        "trace_id": f"{rng.getrandbits(64):016x}", "span_id": f"{rng.getrandbits(32):08x}",
        "http": {"method": rng.choice(("GET", "POST")),
                 "path": f"/api/v1/items/{rng.randrange(10**6)}",
                 "status": rng.choice((200, 200, 200, 201, 404, 500)),
                 "latency_ms": round(rng.expovariate(1 / 40), 2)},
        "user_id": rng.randrange(10**7),
        "msg": "",
    }
    line = json.dumps(doc)
    words = ("request", "handled", "upstream", "timeout", "retrying", "cache", "miss", "for",
             "order", "customer", "connection", "pool", "exhausted", "at", "db.query")
    filler: list[str] = []
    while len(line) + sum(len(w) + 1 for w in filler) < size:
        filler.append(rng.choice(words))
    doc["msg"] = " ".join(filler)
    return json.dumps(doc).encode()[:max(size, 1)]


def make_store(first_lsn: int, payloads: list[bytes], compression: Codec) -> Store:
    wire_payloads: tuple[bytes, ...] = tuple(payloads)
    records = 0
    if compression is not Codec.NONE:
        blob = compress_batch(payloads, compression)
        assert blob is not None, "batch does not compress"
        wire_payloads, records = (blob,), len(payloads)
    return Store(log_id=LOG, lsn=Lsn(first_lsn), wave=1, sequencer_node=NodeId("seq"),
                 copyset=(NodeId("n1"), NodeId("n2"), NodeId("n3")), timestamp_ms=1,
                 last_known_good=Esn(0), release_lsn=Lsn(0), timeout_ms=1000, key=None,
                 payloads=wire_payloads, checksum=payloads_checksum(wire_payloads),
                 compression=int(compression), records=records)


async def run(kind: str, compression: Codec, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(7)
    batches = []
    for _ in range(args.batches):
        if kind == "json":
            batches.append([json_line(rng, args.record_bytes) for _ in range(args.records)])
        else:
            batches.append([os.urandom(args.record_bytes) for _ in range(args.records)])
    plain_bytes = sum(len(p) for batch in batches for p in batch)
    frames = []
    esn = 1
    for batch in batches:
        store = make_store(compose_lsn(Epoch(1), Esn(esn)), batch, compression)
        frames.append(FrameDecoder().feed(wire.encode(store, 1))[0])
        esn += len(batch)
    records_total = esn - 1
    edge_cpu = 0.0
    if compression is not Codec.NONE:
        for batch in batches[: max(len(batches) // 4, 1)]:
            blob = compress_batch(batch, compression)
            assert blob is not None
            check_start = time.process_time()
            assert check_batch(blob, compression, len(batch), records_max=100_000,
                               payload_bytes_max=1 << 20, bytes_max=1 << 26).name == "OK"
            edge_cpu += time.process_time() - check_start
        edge_cpu /= max(len(batches) // 4, 1) * args.records
    with tempfile.TemporaryDirectory() as data_dir:
        node = StorageNode(node_id=NodeId("n1"), data_dir=data_dir, config=StorageConfig(
            fsync=args.fsync, disk_free_bytes_min=0))
        await node.start()
        try:
            loop = asyncio.get_running_loop()
            start = time.process_time()
            replies: list[Any] = []
            for chunk in range(0, len(frames), STORES_IN_FLIGHT):
                # As a sequencer would: a bounded number in flight (the store queue's limit).
                waiting: list[asyncio.Future[Any]] = []
                for frame in frames[chunk:chunk + STORES_IN_FLIGHT]:
                    decoded = wire.decode(frame)
                    assert isinstance(decoded, tuple)
                    future: asyncio.Future[Any] = loop.create_future()
                    node.on_message(NodeId("seq"), decoded[1], future.set_result)
                    waiting.append(future)
                replies += await asyncio.gather(*waiting)
            store_cpu = time.process_time() - start
            bad = [r for r in replies if type(r) is not Stored or r.status.name != "OK"]
            assert not bad, bad[:2]
            # A storage node serves reads only up to the release pointer a sequencer gave it.
            released = compose_lsn(Epoch(1), Esn(records_total))
            node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=released),
                            lambda _answer: None)
            disk = node.store.stats()["disk_bytes"]

            start = time.process_time()
            read_cpu_reader = 0.0
            cursor = 1
            got = 0
            while got < records_total:
                future = loop.create_future()
                node.on_message(NodeId("reader"), Read(
                    log_id=LOG, from_lsn=Lsn(cursor), until_lsn=released,
                    release_lsn=released, records_max=args.read_records,
                    bytes_max=1 << 26), future.set_result)
                reply = await future
                assert type(reply) is ReadReply and reply.status.name == "OK", reply
                # What crosses the wire: the storage node encodes it, the reader decodes it.
                body = FrameDecoder().feed(wire.encode(reply, 1))[0]
                reader_start = time.process_time()
                decoded_reply = wire.decode(body)
                assert isinstance(decoded_reply, tuple)
                answer = decoded_reply[1]
                assert type(answer) is ReadReply
                records = expand_blocks(answer.blocks, answer.records)
                assert records is not None
                read_cpu_reader += time.process_time() - reader_start
                got += len(records)
                assert records or reply.next_lsn > cursor, "read made no progress"
                cursor = reply.next_lsn
            read_cpu = time.process_time() - start - read_cpu_reader
        finally:
            await node.close()
    return {
        "payloads": kind, "compression": compression.name.lower(),
        "records": records_total, "record_bytes": plain_bytes // records_total,
        "disk_bytes_per_record": round(disk / records_total, 1),
        "compression_ratio": round(plain_bytes / disk, 2),
        "store_cpu_us_per_record": round(store_cpu / records_total * 1e6, 2),
        "read_cpu_us_per_record": round(read_cpu / records_total * 1e6, 2),
        "reader_expand_cpu_us_per_record": round(read_cpu_reader / records_total * 1e6, 2),
        "edge_check_cpu_us_per_record": round(edge_cpu * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--records", type=int, default=256)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--read-records", type=int, default=1000)
    parser.add_argument("--fsync", default="never", choices=("never", "always", "interval"))
    args = parser.parse_args()
    for kind in ("json", "random"):
        for compression in (Codec.NONE, Codec.LZ4, Codec.ZSTD):
            if kind == "random" and compression is not Codec.NONE:
                continue  # compress_batch keeps incompressible batches plain
            print(json.dumps(asyncio.run(run(kind, compression, args))), flush=True)


if __name__ == "__main__":
    main()
