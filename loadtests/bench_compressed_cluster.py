"""Compressed append-batches on a real local cluster: CPU per record of the sequencer node
(HTTP edge, which expands each compressed batch once to check it, plus sequencing) and of
each storage node, for the same JSON log lines sent plain, lz4 and zstd through HTTP
append-batch (msgpack bodies, 4 in flight, 256 records of ~1 KiB per batch, R=3,
fsync=always). CPU is read from /proc per process before and after each run.

Run from the repo root: ``.venv/bin/python -m loadtests.bench_compressed_cluster``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

from loadtests.bench_compressed_storage import json_line
from services import local_cluster as lc
from shared.compression import Codec, compress_batch


def cpu(pid: int) -> float:
    """User plus system CPU seconds of a process."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

async def _send(post: Any, docs: list[dict[str, Any]]) -> None:
    """Every batch, 4 in flight."""
    in_flight = asyncio.Semaphore(4)

    async def one(doc: dict[str, Any]) -> None:
        async with in_flight:
            await post(doc)

    await asyncio.gather(*(one(doc) for doc in docs))


async def main() -> None:
    root = Path(tempfile.mkdtemp())
    state = lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="always"), ready_timeout_ms=60000)
    try:
        rng = random.Random(3)
        batches = [[json_line(rng, 1024) for _ in range(256)] for _ in range(120)]
        url = state.sequencer_urls[0]
        async with aiohttp.ClientSession() as s:
            async def post(doc: dict[str, Any]) -> None:
                async with s.post(f"{url}/v1/logs/{doc.pop('log')}/append-batch",
                                  data=msgpack.packb(doc, use_bin_type=True),
                                  headers={"Content-Type": "application/msgpack"}) as r:
                    assert r.status == 200, await r.text()
            await post({"log": 99, "payloads": [b"warm"]})
            runs = (("plain", None), ("lz4", Codec.LZ4), ("zstd", Codec.ZSTD), ("plain", None))
            for name, codec in runs:
                docs: list[dict[str, Any]] = []
                for b in batches:
                    if codec is None:
                        docs.append({"log": 5, "payloads": b})
                    else:
                        docs.append({"log": 5, "compression": codec.name.lower(),
                                     "records": len(b),
                                     "compressed_payloads": compress_batch(b, codec)})
                before = {n.node_id: cpu(n.pid) for n in state.nodes}
                await _send(post, docs)
                after = {n.node_id: cpu(n.pid) for n in state.nodes}
                records = sum(len(b) for b in batches)
                seq = sum(after[k]-before[k] for k in after if k.startswith("seq"))
                st = sum(after[k]-before[k] for k in after if k.startswith("st")) / 3
                print(json.dumps({"run": name, "records": records,
                                  "sequencer_us_per_record": round(seq/records*1e6, 2),
                                  "storage_node_us_per_record": round(st/records*1e6, 2)}))
    finally:
        lc.down(root)

if __name__ == "__main__":
    asyncio.run(main())
