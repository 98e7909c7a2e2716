"""Helpers of the Spark tests: fresh log ids, appends, reading the truth through the client,
and the files Spark's file sink committed."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path

from seqlog import Client, Record

_next_log = [int.from_bytes(os.urandom(3), "big") + 2_000_000]


@dataclass(frozen=True)
class SparkCluster:
    dir: Path
    urls: list[str]

    @property
    def urls_option(self) -> str:
        return ",".join(self.urls)


def fresh_log() -> int:
    """A log id that no other test has written to."""
    _next_log[0] += 1
    return _next_log[0]


def payload(log: int, seq: int, size: int = 200) -> bytes:
    head = json.dumps({"log": log, "seq": seq}).encode()
    return head + b" " * max(size - len(head), 0)


async def append_many(client: Client, log: int, count: int, *, first_seq: int = 0,
                      batch: int = 500, size: int = 200) -> int:
    """Appends ``count`` records in batches; the LSN of the last one. Each batch names a
    producer pair (the batch's first record seq), so the client retries a batch whose outcome
    is unknown (a sequencer preempted under load, a failover) without writing it twice, as a
    user's producer would."""
    last = 0
    for start in range(0, count, batch):
        seqs = range(first_seq + start, first_seq + min(start + batch, count))
        last = (await client.append_batch(log, [payload(log, s, size) for s in seqs],
                                          producer_id=f"spark-test-{log}",
                                          producer_seq=seqs[0])).last_lsn
    return last


async def wait_released(client: Client, log: int, through_lsn: int,
                        timeout_s: float = 60) -> int:
    """The release pointer once it reaches ``through_lsn``: an acknowledged append is stored
    but a sequencer that just took over releases it only after recovering the old epoch."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (release := (await client.tail(log)).release_lsn) < through_lsn:
        assert loop.time() < deadline, f"log {log}: release never reached {through_lsn}"
        await asyncio.sleep(0.05)
    return release


async def client_records(client: Client, log: int, start: int, end: int) -> list[Record]:
    """Every record with ``start <= lsn < end``, read page by page through the client."""
    records: list[Record] = []
    cursor = start
    while cursor < end:
        result = await client.read(log, cursor, limit=1000)
        records += [r for r in result.records if r.lsn < end]
        if result.next_lsn <= cursor:
            break  # nothing released beyond: end was past the release pointer
        cursor = result.next_lsn
    return records


def committed_files(out: Path) -> set[Path]:
    """Data files that the file sink's log (``_spark_metadata``) lists as committed."""
    files: set[Path] = set()
    meta = out / "_spark_metadata"
    if not meta.is_dir():
        return files
    for entry in meta.iterdir():
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        for line in entry.read_text().splitlines()[1:]:  # first line: version
            item = json.loads(line)
            if item.get("action", "add") == "add":
                files.add(Path(item["path"].removeprefix("file:")))
    return files


def data_files(out: Path) -> set[Path]:
    return {p for p in out.rglob("*.parquet") if not p.name.startswith(".")}
