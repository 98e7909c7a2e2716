"""Retention end to end: a real local cluster trims logs by age and frees disk, readers get
a TRIM gap and the later records intact; and a storage node killed in the middle of a reclaim
(failpoints between checkpoint and unlink, and before a compaction's rename) restarts into the
same state as one that finished it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from seqlog import Client, Gap, Record
from services import local_cluster as lc
from shared.config import LogBacklog, StorageConfig
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.codec import Message
from shared.wire.read import Read, ReadReply
from storage_node.runtime import StorageNode

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0
BACKLOG_MS = 3_000
KEPT_LOG = 900_001
"""In a ``log_backlogs`` range with backlog 0: kept forever whatever the default."""
AGED_LOGS = (900_011, 900_012, 900_013)
RECORD_BYTES = 48 * 1024
RECORDS_PER_LOG = 40
RECORDS_PER_BATCH = 4


def segments_bytes(data_dir: str) -> int:
    directory = Path(data_dir) / "segments"
    return sum(p.stat().st_size for p in directory.iterdir() if p.name.endswith(".seg"))


def metrics_text(http: str) -> str:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_cluster_trims_aged_records_and_frees_disk(tmp_path: Path) -> None:
    spec = lc.LocalClusterSpec(
        dir=tmp_path, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never", log_backlog_ms=BACKLOG_MS,
        log_backlogs=(LogBacklog(first_log_id=KEPT_LOG, last_log_id=KEPT_LOG, backlog_ms=0),),
        storage=StorageConfig(segment_bytes_max=1024 * 1024, retention_interval_ms=200))
    state = await asyncio.to_thread(lc.up, spec, ready_timeout_ms=60_000)
    storage = [n for n in state.nodes if "storage" in n.roles]
    try:
        async with Client(state.sequencer_urls) as client:
            kept: list[bytes] = []
            last_old: dict[int, int] = {}
            written_s = time.monotonic()
            for i in range(0, RECORDS_PER_LOG, RECORDS_PER_BATCH):
                for log_id in AGED_LOGS:
                    batch = [((b"%d:%d:" % (log_id, i + j)) * RECORD_BYTES)[:RECORD_BYTES]
                             for j in range(RECORDS_PER_BATCH)]
                    last_old[log_id] = (await client.append_batch(log_id, batch)).last_lsn
                if i < RECORDS_PER_LOG // 2:
                    # The first segments are mixed (compacted), the last ones are not (deleted).
                    kept.append(b"kept %d" % i)
                    await client.append(KEPT_LOG, kept[-1])
            before = {n.node_id: await asyncio.to_thread(segments_bytes, n.data_dir)
                      for n in storage}
            # Measured before anything could age (else the figure would be meaningless).
            assert time.monotonic() - written_s < BACKLOG_MS / 1000, "writing was too slow"
            written_bytes = len(AGED_LOGS) * RECORDS_PER_LOG * RECORD_BYTES
            assert all(size > written_bytes for size in before.values()), before
            # Every aged log is trimmed once its records pass the backlog. Each storage node
            # trims on its own and a read may be answered by any f-majority (one node here),
            # so the TRIM gap a reader sees grows to the last old record node by node; the
            # records after it are the old ones a node has not trimmed yet, then the young.
            deadline = time.monotonic() + DEADLINE_S
            young_log = AGED_LOGS[0]
            young: list[int] = []
            young_s = 0.0
            for log_id in AGED_LOGS:
                while True:
                    assert time.monotonic() < deadline, f"log {log_id} never trimmed"
                    entries = (await client.read(log_id, Lsn(1), limit=100)).entries()
                    gap = entries[0] if entries else None
                    if isinstance(gap, Gap) and gap.type == "TRIM":
                        assert time.monotonic() - written_s >= BACKLOG_MS / 1000 * 0.9
                        if not young and log_id == young_log:
                            young = [(await client.append(log_id, b"young %d" % i)).lsn
                                     for i in range(5)]
                            young_s = time.monotonic()
                            continue
                        records = [e for e in entries if isinstance(e, Record)]
                        if log_id == young_log:
                            assert time.monotonic() - young_s < BACKLOG_MS / 1000, (
                                "the nodes took longer than the backlog to trim")
                            assert [(r.lsn, r.payload) for r in records
                                    if r.lsn > last_old[log_id]] == [
                                (lsn, b"young %d" % i) for i, lsn in enumerate(young)]
                        if gap.hi >= last_old[log_id]:
                            break
                    await asyncio.sleep(0.1)
            kept_read = await client.read(KEPT_LOG, Lsn(1), limit=1000)
            assert [e.payload for e in kept_read.entries() if isinstance(e, Record)] == kept
            # The disk space goes: whole segments deleted, mixed ones (the kept log) compacted.
            while True:
                after = {n.node_id: await asyncio.to_thread(segments_bytes, n.data_dir)
                         for n in storage}
                if all(after[n] < before[n] / 3 for n in after):
                    break
                assert time.monotonic() < deadline, (before, after)
                await asyncio.sleep(0.1)
        text = await asyncio.to_thread(metrics_text, storage[0].http)
        assert metric(text, "seqlog_storage_segments_deleted") >= 1
        assert metric(text, "seqlog_storage_segments_compacted") >= 1
        assert metric(text, "seqlog_storage_retention_trims") >= len(AGED_LOGS)
        assert metric(text, "seqlog_storage_disk_bytes") < before[storage[0].node_id] / 3
    finally:
        await asyncio.to_thread(lc.down, tmp_path)


# ---- a storage node killed in the middle of a reclaim ----

CHILD = """
import asyncio, sys

from shared.config import StorageConfig
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.recovery import Seal
from shared.wire.release import Release
from shared.wire.store import Store, payloads_checksum
from shared.wire.trim import Trim
from storage_node.runtime import StorageNode

LOGS = (LogId(21), LogId(22))


def payload(log_id, esn):
    return (f"<{log_id}:{esn}>".encode() * 10_000)[:100 * 1024]


async def ask(node, message):
    future = asyncio.get_running_loop().create_future()
    node.on_message(NodeId("seq"), message, future.set_result)
    return await future


async def main(data_dir):
    config = StorageConfig(fsync="always", disk_free_bytes_min=0, segment_bytes_max=1024 * 1024,
                           retention_interval_ms=3_600_000, compaction_live_fraction_max=0.6)
    node = StorageNode(node_id=NodeId("crashy"), data_dir=data_dir, config=config)
    await node.start()
    # State only the first segment carries: a seal and a release pointer of logs without
    # records, and the STOREs of an epoch that is all trimmed.
    sealed = await ask(node, Seal(log_id=LogId(23), seal_epoch=Epoch(3),
                                  sealed_by=NodeId("recoverer"), from_epoch=Epoch(1)))
    assert sealed.status.name == "OK", sealed
    node.on_message(NodeId("seq"), Release(log_id=LogId(24), release_lsn=Lsn(77)),
                    lambda _: None)
    for esn in range(1, 31):
        for log_id in LOGS:
            payloads = (payload(log_id, esn),)
            reply = await ask(node, Store(
                log_id=log_id, lsn=compose_lsn(Epoch(1), Esn(esn)), wave=1,
                sequencer_node=NodeId("seq"), copyset=(NodeId("crashy"),),
                timestamp_ms=1_000 + esn, last_known_good=Esn(0), release_lsn=Lsn(0),
                timeout_ms=1000, key=None, payloads=payloads,
                checksum=payloads_checksum(payloads)))
            assert reply.status.name == "OK", reply
    for log_id in LOGS:
        node.on_message(NodeId("seq"), Release(log_id=log_id,
                                               release_lsn=compose_lsn(Epoch(1), Esn(30))),
                        lambda _: None)
    # Log 21 goes entirely, log 22 up to esn 6: the first segment dies, the others are mixed.
    await ask(node, Trim(log_id=LOGS[0], trim_lsn=compose_lsn(Epoch(1), Esn(30))))
    await ask(node, Trim(log_id=LOGS[1], trim_lsn=compose_lsn(Epoch(1), Esn(6))))
    report = await node.retention_pass()
    print("reclaimed", report.reclaim, flush=True)
    await node.close()


asyncio.run(main(sys.argv[1]))
"""


async def run_child(script: Path, data_dir: Path, failpoint: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SEQLOG_FAILPOINTS", None)
    if failpoint is not None:
        env["SEQLOG_FAILPOINTS"] = f"{failpoint}=crash"
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(data_dir), cwd=str(ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(DEADLINE_S):
        out, err = await child.communicate()
    if failpoint is None:
        assert child.returncode == 0 and b"reclaimed" in out, err.decode()[-2000:]
    else:
        assert child.returncode == -9, (out + err).decode()[-2000:]
        assert b"reclaimed" not in out
    assert child.returncode is not None
    return child.returncode


async def served(node: StorageNode, log_id: int) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    from_lsn = 1
    while True:
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        node.on_message(NodeId("reader"), Read(
            log_id=LogId(log_id), from_lsn=Lsn(from_lsn), until_lsn=Lsn(2**64 - 2),
            release_lsn=Lsn(2**64 - 2), records_max=10, bytes_max=1 << 26), answer.set_result)
        async with asyncio.timeout(DEADLINE_S):
            reply = await answer
        assert isinstance(reply, ReadReply) and reply.status is Status.OK, reply
        if not reply.records:
            return found
        found.update((r[0], r[3]) for r in reply.records)
        from_lsn = reply.next_lsn


def node_at(data_dir: Path) -> StorageNode:
    return StorageNode(node_id=NodeId("crashy"), data_dir=str(data_dir), config=StorageConfig(
        fsync="always", disk_free_bytes_min=0, segment_bytes_max=1024 * 1024,
        retention_interval_ms=3_600_000, compaction_live_fraction_max=0.6))


async def observe(data_dir: Path) -> dict[str, Any]:
    """State, served records and index (LSN ranges per entry, without file positions)."""
    node = node_at(data_dir)
    await node.start()
    try:
        return {
            "states": {log_id: node.log_state(log_id) for log_id in sorted(node.log_ids())},
            "records": {log_id: await served(node, log_id) for log_id in (21, 22)},
            "index": {log_id: [entry[3:] for entry in entries]
                      for log_id, entries in node.store.index_snapshot().items()},
        }
    finally:
        await node.close()


def closed_segments(data_dir: Path) -> dict[str, int]:
    """Every segment but the newest (where the checkpoints of each pass go), with its size."""
    paths = sorted(p for p in (data_dir / "segments").iterdir() if p.name.endswith(".seg"))
    return {p.name: p.stat().st_size for p in paths[:-1]}


@pytest.mark.parametrize("failpoint", ["storage.reclaim_after_checkpoint",
                                       "storage.compact_before_rename"])
async def test_a_kill_9_in_the_middle_of_a_reclaim_loses_nothing(
        tmp_path: Path, failpoint: str) -> None:
    script = tmp_path / "child.py"
    await asyncio.to_thread(script.write_text, CHILD)
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    await run_child(script, clean, None)
    await run_child(script, crashed, failpoint)
    leftovers = [p.name for p in (crashed / "segments").iterdir() if p.name.endswith(".compact")]
    assert bool(leftovers) == (failpoint == "storage.compact_before_rename")
    # The killed node restarts into the state of the one that finished its reclaim.
    want = await observe(clean)
    assert want["records"][22] and not want["records"][21]
    assert want["states"][23].sealed_epoch == 3 and want["states"][24].release_lsn == 77
    assert await observe(crashed) == want
    assert not [p for p in (crashed / "segments").iterdir() if p.name.endswith(".compact")]
    # Its next pass finishes the job: the same files, the same index to the byte.
    node = node_at(crashed)
    await node.start()
    try:
        report = await node.retention_pass()
        assert report.reclaim.segments_deleted + report.reclaim.segments_compacted >= 1
    finally:
        await node.close()
    assert await asyncio.to_thread(closed_segments, crashed) == await asyncio.to_thread(
        closed_segments, clean)
    for directory in (clean, crashed):
        node = node_at(directory)
        await node.start()
        try:
            if directory == clean:
                index = node.store.index_snapshot()
            else:
                assert node.store.index_snapshot() == index
        finally:
            await node.close()
    assert json.dumps(sorted(want["records"][22])) == json.dumps(
        sorted((await observe(crashed))["records"][22]))
