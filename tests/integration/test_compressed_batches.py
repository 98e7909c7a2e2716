"""Compressed append-batches (docs/API-EXTENSIONS.md) on a real cluster of processes: lz4 and
zstd batches sent over HTTP (JSON and msgpack bodies) get one LSN per record, are stored as the
compressed blob (the segment grows by the compressed size, and storage nodes send the blob
whole to readers that cover it), and read back as plain payloads, each LSN once, over HTTP and
through the direct reader: from the middle of a batch, after a trim inside one, after a
storage node restarts (its scan rebuilds the index) and after kill -9 of the sequencer
(recovery). Bad blobs are 400 BADMSG with nothing written."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import zstandard
from seqlog_cluster_support import READY_TIMEOUT_MS, metric

from seqlog import Client, Gap, Record
from services import local_cluster as lc
from shared.compression import Codec, compress_batch
from shared.config import TransportConfig, process_from_dict
from shared.net.pool import PeerPool
from shared.read_merge import expand_blocks
from shared.types import LSN_MAX, LSN_OLDEST, Lsn, lsn_to_epoch
from shared.wire.read import Read, ReadReply
from storage_node.segment_format import scan_segment

pytestmark = pytest.mark.integration


def _lines(tag: str, count: int, size: int = 0) -> list[bytes]:
    """JSON log lines, as a service would write them (compress about 5-10x)."""
    lines = []
    for i in range(count):
        line = json.dumps({"ts": f"2026-11-24T06:{i % 60:02d}:00Z", "level": "info",
                           "service": "checkout", "msg": f"{tag} request {i} served",
                           "status": 200, "latency_ms": i % 37})
        lines.append(line.ljust(size).encode())
    return lines


async def _post(session: aiohttp.ClientSession, url: str, log_id: int, doc: dict[str, Any],
                media: str = "json") -> tuple[int, dict[str, Any]]:
    if media == "json":
        body = json.dumps({k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
                           for k, v in doc.items()}).encode()
        content_type = "application/json"
    else:
        body = msgpack.packb(doc, use_bin_type=True)
        content_type = "application/msgpack"
    async with session.post(f"{url}/v1/logs/{log_id}/append-batch", data=body,
                            headers={"Content-Type": content_type,
                                     "Accept": "application/json"}) as response:
        return response.status, await response.json()


RETRY_503_TIMEOUT_S = 30.0


async def _post_until_served(session: aiohttp.ClientSession, url: str, log_id: int,
                             doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``_post``, again while it answers 503 (nothing written: API.md), as a client does
    right after a sequencer node's restart, until views agree it is back (bounded)."""
    deadline = asyncio.get_running_loop().time() + RETRY_503_TIMEOUT_S
    while True:
        status, answer = await _post(session, url, log_id, doc)
        if status != 503 or asyncio.get_running_loop().time() > deadline:
            return status, answer
        await asyncio.sleep(0.1)


def _compressed(payloads: list[bytes], codec: Codec) -> dict[str, Any]:
    blob = compress_batch(payloads, codec)
    assert blob is not None
    return {"compression": codec.name.lower(), "records": len(payloads),
            "compressed_payloads": blob}


async def _http_entries(client: Client, log_id: int, from_lsn: int = LSN_OLDEST,
                        limit: int = 1000) -> list[Record | Gap]:
    entries: list[Record | Gap] = []
    cursor = from_lsn
    while True:
        result = await client.read(log_id, cursor, limit=limit)
        entries.extend(result.entries())
        if result.next_lsn == cursor or result.next_lsn > result.release_lsn:
            return entries
        cursor = result.next_lsn


async def _direct_entries(client: Client, log_id: int,
                          from_lsn: int = LSN_OLDEST) -> list[Record | Gap]:
    async with await client.reader(log_id, from_lsn) as reader:
        return [entry async for entry in reader]


def _records(entries: list[Record | Gap]) -> dict[int, bytes]:
    records: dict[int, bytes] = {}
    cursor = entries[0].lsn if isinstance(entries[0], Record) else entries[0].lo
    for entry in entries:
        lo, hi = (entry.lsn, entry.lsn) if isinstance(entry, Record) else (entry.lo, entry.hi)
        assert lo == cursor, f"coverage broken at {cursor}: {entry}"  # each LSN once, in order
        cursor = hi + 1
        if isinstance(entry, Record):
            records[entry.lsn] = entry.payload
    return records


async def _released(client: Client, log_id: int, lsn: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (await client.tail(log_id)).release_lsn < lsn:
        assert time.monotonic() < deadline, f"release never reached {lsn}"
        await asyncio.sleep(0.05)


async def _node_reads(root: Path, node: str, log_id: int) -> tuple[dict[int, bytes], int]:
    """Every copy one storage node holds of the log (a peer's READ), and how many of its
    records came as compressed blocks."""
    config = process_from_dict(json.loads((root / "seq1" / "config.json").read_text()))
    nodes = {n.node_id: (n.host, n.data_port) for n in config.cluster.nodes}
    pool = PeerPool(node_id=config.node_id, cluster_fingerprint=config.cluster.fingerprint(),
                    config=TransportConfig(), addresses=nodes.get)
    copies: dict[int, bytes] = {}
    in_blocks = 0
    try:
        cursor = 1
        while True:
            reply = await pool.call(node, Read(
                log_id=log_id, from_lsn=Lsn(cursor), until_lsn=Lsn(LSN_MAX - 1),
                release_lsn=Lsn(LSN_MAX - 1), records_max=1000, bytes_max=1 << 24), 5000)
            assert type(reply) is ReadReply, reply
            records = expand_blocks(reply.blocks, reply.records)
            assert records is not None
            in_blocks += sum(block[4] for block in reply.blocks)
            for lsn, _, _, payload in records:
                assert lsn not in copies
                copies[lsn] = payload
            if not records:
                return copies, in_blocks
            cursor = reply.next_lsn
    finally:
        await pool.close()


def _segment_bytes(root: Path, node: str) -> int:
    """Data bytes of a node's segments (not the zero-filled space kept ahead of the writes)."""
    return sum(scan_segment(path.read_bytes()).valid_bytes
               for path in (root / node).rglob("*.seg"))


def _pid(state: lc.ClusterState, node_id: str) -> int:
    return next(n.pid for n in state.nodes if n.node_id == node_id)


async def test_compressed_batches_end_to_end(cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=3,
        base_port=lc.free_base_port(5), fsync="always"), ready_timeout_ms=READY_TIMEOUT_MS)
    log_id = 21
    url = state.sequencer_urls[0]
    expected: dict[int, bytes] = {}
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client, \
            aiohttp.ClientSession() as session:
        # On disk: a highly compressible batch takes its compressed size, not its plain one.
        first = await client.append(log_id, b"first")
        expected[first.lsn] = first_payload = b"first"
        await _released(client, log_id, first.lsn)
        before = {node: _segment_bytes(cluster_dir, node) for node in ("st1", "st2", "st3")}
        big = _lines("big", 1000, size=1024)
        status, answer = await _post(session, url, log_id, _compressed(big, Codec.ZSTD))
        assert status == 200, answer
        grown = {node: _segment_bytes(cluster_dir, node) - before[node] for node in before}
        assert all(0 < g < sum(map(len, big)) / 20 for g in grown.values()), grown
        expected.update(zip(range(answer["first_lsn"], answer["last_lsn"] + 1), big,
                            strict=True))

        # lz4 and zstd, JSON and msgpack bodies, between plain appends: one LSN per record.
        batches: list[tuple[int, int]] = [(answer["first_lsn"], answer["last_lsn"])]
        for index, (codec, media) in enumerate([(Codec.LZ4, "json"), (Codec.ZSTD, "msgpack"),
                                                (Codec.LZ4, "msgpack")]):
            payloads = _lines(f"b{index}", 200)
            # Through both sequencer nodes: one of them forwards the batch to the other.
            via = state.sequencer_urls[index % 2]
            status, answer = await _post(session, via, log_id, _compressed(payloads, codec),
                                         media)
            assert status == 200, answer
            assert answer["count"] == 200
            assert answer["last_lsn"] - answer["first_lsn"] == 199
            batches.append((answer["first_lsn"], answer["last_lsn"]))
            expected.update(zip(range(answer["first_lsn"], answer["last_lsn"] + 1), payloads,
                                strict=True))
            plain = await client.append(log_id, b"plain%d" % index)
            assert plain.lsn == answer["last_lsn"] + 1
            expected[plain.lsn] = b"plain%d" % index

        # Bad blobs: 400 BADMSG, nothing written.
        good = _lines("bad", 50)
        lz4_doc = _compressed(good, Codec.LZ4)
        bomb = zstandard.ZstdCompressor().compress(msgpack.packb([b"\0" * (48 << 20)]))
        bad_docs = [
            {**lz4_doc, "records": 49},  # wrong count
            {**lz4_doc, "records": 51},
            {**lz4_doc, "compression": "zstd"},  # wrong codec for the blob
            {**lz4_doc, "compression": "gzip"},  # unknown codec
            {**lz4_doc, "compressed_payloads": os.urandom(300)},  # garbage
            {**lz4_doc, "compressed_payloads": lz4_doc["compressed_payloads"][:-8]},  # cut
            {"compression": "zstd", "records": 1, "compressed_payloads": bomb},  # bomb
            {**lz4_doc, "compression": 1},  # a codec id instead of its name
        ]
        for doc in bad_docs:
            for media in ("json", "msgpack"):
                status, answer = await _post(session, url, log_id, doc, media)
                assert (status, answer["status"]) == (400, "BADMSG"), (doc["records"], answer)
        after_bad = await client.append(log_id, b"after bad blobs")
        assert after_bad.lsn == max(expected) + 1  # nothing was written in between
        expected[after_bad.lsn] = b"after bad blobs"
        await _released(client, log_id, after_bad.lsn)

        # Read back as plain payloads, each LSN once, over HTTP and directly.
        over_http = _records(await _http_entries(client, log_id))
        assert over_http == expected
        direct = await _direct_entries(client, log_id)
        assert _records(direct) == expected
        # Storage nodes sent the batches as blocks (the readers expanded them).
        copies, in_blocks = await _node_reads(cluster_dir, "st2", log_id)
        assert copies == expected
        assert in_blocks == sum(last - first + 1 for first, last in batches)

        # A read that starts in the middle of a batch, and small pages that end inside one.
        lz4_first = batches[1][0]
        middle = lz4_first + 77
        want = {lsn: p for lsn, p in expected.items() if lsn >= middle}
        assert _records(await _http_entries(client, log_id, middle)) == want
        assert _records(await _http_entries(client, log_id, middle, limit=30)) == want
        assert _records(await _direct_entries(client, log_id, middle)) == want
        page = await client.read(log_id, middle, limit=5)
        assert [r.lsn for r in page.records] == list(range(middle, middle + 5))

        # Trim inside a compressed batch: the rest of the batch stays readable.
        trim_at = lz4_first + 99
        await client.trim(log_id, trim_at)
        want = {lsn: p for lsn, p in expected.items() if lsn > trim_at}
        entries = await _http_entries(client, log_id)
        assert isinstance(entries[0], Gap) and entries[0].type == "TRIM"
        assert entries[0].hi == trim_at
        assert _records(entries) == want
        assert _records(await _direct_entries(client, log_id)) == want
        expected = want

        # A storage node restarts: its scan rebuilds the index of the compressed entries.
        await asyncio.to_thread(lc.restart, cluster_dir, "st2",
                                ready_timeout_ms=READY_TIMEOUT_MS)
        copies, in_blocks = await _node_reads(cluster_dir, "st2", log_id)
        assert copies == expected
        assert in_blocks == sum(last - first + 1 for first, last in batches[2:])

        # find-time lands on a batch's first LSN, never inside it (one timestamp per batch).
        zstd_first, zstd_last = batches[2]
        (zstd_ts,) = {r.timestamp_ms for r in (await client.read(log_id, zstd_first,
                                                                  limit=200)).records}
        found_at = await client.find_time(log_id, zstd_ts)
        assert found_at <= zstd_first and not zstd_first < found_at <= zstd_last

        # An idempotent compressed batch: a retry gets the original LSNs, before and after
        # a failover (the new sequencer's lookup reads the compressed copies back).
        idem_payloads = _lines("idempotent", 40)
        idem = {**_compressed(idem_payloads, Codec.ZSTD), "producer_id": "writer-1",
                "producer_seq": 0}
        status, idem_answer = await _post(session, url, log_id, idem)
        assert status == 200, idem_answer
        status, again = await _post(session, state.sequencer_urls[1], log_id, idem)
        assert status == 200 and (again["first_lsn"], again["last_lsn"]) == (
            idem_answer["first_lsn"], idem_answer["last_lsn"])
        expected.update(zip(range(idem_answer["first_lsn"], idem_answer["last_lsn"] + 1),
                            idem_payloads, strict=True))

        # kill -9 of the sequencer: acknowledged compressed batches all read back after
        # recovery (none of them released on the storage nodes yet when it died, maybe).
        acked: list[tuple[int, int, list[bytes]]] = []
        for index in range(6):
            payloads = _lines(f"k{index}", 100)
            doc = _compressed(payloads, Codec.LZ4 if index % 2 else Codec.ZSTD)
            status, answer = await _post(session, state.sequencer_urls[index % 2], log_id, doc)
            assert status == 200, answer
            acked.append((answer["first_lsn"], answer["last_lsn"], payloads))
        owner = (await client.tail(log_id)).sequencer
        assert owner is not None
        os.kill(_pid(state, owner), signal.SIGKILL)
        await asyncio.to_thread(lc.restart, cluster_dir, owner,
                                ready_timeout_ms=READY_TIMEOUT_MS)
        for first_lsn, last_lsn, payloads in acked:
            expected.update(zip(range(first_lsn, last_lsn + 1), payloads, strict=True))
        status, again = await _post_until_served(session, url, log_id, idem)
        assert status == 200 and (again["first_lsn"], again["last_lsn"]) == (
            idem_answer["first_lsn"], idem_answer["last_lsn"]), again
        later_payloads = _lines("later", 100)
        status, answer = await _post_until_served(session, url, log_id,
                                                  _compressed(later_payloads, Codec.LZ4))
        assert status == 200, answer
        assert lsn_to_epoch(answer["first_lsn"]) > lsn_to_epoch(acked[-1][1])
        expected.update(zip(range(answer["first_lsn"], answer["last_lsn"] + 1),
                            later_payloads, strict=True))
        await _released(client, log_id, answer["last_lsn"])
        found = await _http_entries(client, log_id)
        assert _records(found) == expected
        assert not [e for e in found if isinstance(e, Gap) and e.type == "DATALOSS"]
        assert _records(await _direct_entries(client, log_id)) == expected
        # The new epoch's sequencer recovered the killed one's epoch (digests of compressed
        # entries included) before it released anything.
        sequencers = [n for n in (lc.load_state(cluster_dir) or state).nodes
                      if "sequencer" in n.roles]
        done = sum([await asyncio.to_thread(
            _metric, n.http, 'seqlog_sequencer_recovery_phases{phase="DONE"}')
            for n in sequencers])
        assert done >= 1
    assert first_payload not in expected.values()  # trimmed away above


def _metric(http: str, name: str) -> float:
    return metric(http, name, 0.0)
