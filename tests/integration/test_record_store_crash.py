"""Crash safety of the record store: a child process stores records as fast as it can with
fsync=always and prints every acknowledged LSN; the test kill -9's it mid-stream, reopens the
store and checks that every acknowledged record is there with the right payload."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

import pytest

from shared.config import StorageConfig
from shared.status import Status
from shared.types import Esn, LogId, Lsn, NodeId
from shared.wire.codec import Message
from shared.wire.read import Read, ReadReply
from shared.wire.release import Release
from shared.wire.store import Store, Stored, payloads_checksum
from storage_node.runtime import StorageNode
from storage_node.segment_format import scan_segment

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ACKS_BEFORE_KILL = 400
DEADLINE_S = 60.0
LOG_ID = 3

CHILD = """
import asyncio, hashlib, sys

from shared.config import StorageConfig
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.store import Store, payloads_checksum
from storage_node.runtime import StorageNode

INFLIGHT_MAX = 32
STORES_MAX = 200_000  # the child ends by itself should the test fail to kill it


def payload(lsn):
    digest = hashlib.sha256(str(lsn).encode()).digest()
    return digest * (64 + lsn % 97)


async def main(data_dir):
    config = StorageConfig(fsync="always", disk_free_bytes_min=0,
                           segment_bytes_max=1024 * 1024)
    node = StorageNode(node_id=NodeId("crashy"), data_dir=data_dir, config=config)
    await node.start()
    slots = asyncio.Semaphore(INFLIGHT_MAX)

    def reply(message):
        if message.status == Status.OK:
            sys.stdout.write(f"{message.lsn}\\n")
            sys.stdout.flush()
        slots.release()

    for esn in range(1, STORES_MAX + 1):
        await slots.acquire()
        lsn = compose_lsn(Epoch(1), Esn(esn))
        payloads = (payload(lsn),)
        store = Store(log_id=LogId(int(sys.argv[2])), lsn=lsn, wave=1, sequencer_node=NodeId("seq"),
                      copyset=(NodeId("crashy"),), timestamp_ms=esn, last_known_good=Esn(0),
                      release_lsn=Lsn(0), timeout_ms=1000, key=None, payloads=payloads,
                      checksum=payloads_checksum(payloads))
        node.on_message(NodeId("seq"), store, reply)
    await node.close()


asyncio.run(main(sys.argv[1]))
"""


def expected_payload(lsn: int) -> bytes:
    digest = hashlib.sha256(str(lsn).encode()).digest()
    return digest * (64 + lsn % 97)


def write_script(path: Path) -> None:
    path.write_text(CHILD)


async def run_and_kill(script: Path, data_dir: Path) -> list[int]:
    """Acknowledged LSNs of a child killed with SIGKILL after ``ACKS_BEFORE_KILL`` acks."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(data_dir), str(LOG_ID), cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    acked: list[int] = []
    try:
        async with asyncio.timeout(DEADLINE_S):
            while len(acked) < ACKS_BEFORE_KILL:
                line = await child.stdout.readline()
                if not line:
                    errors = (await child.stderr.read()).decode(errors="replace")
                    raise AssertionError(f"child ended early: {errors[-2000:]}")
                acked.append(int(line))
    finally:
        child.kill()
        await child.wait()
    # Lines the child printed before it died were acknowledged too; a cut-off last line was
    # not printed completely, so it does not count.
    rest = await child.stdout.read()
    acked += [int(line) for line in rest.split(b"\n")[:-1]]
    assert child.returncode == -9
    return acked


async def read_everything(node: StorageNode) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    from_lsn = 1
    # Released, as a sequencer would: a node serves no copy above its own release pointer.
    node.on_message(NodeId("seq"), Release(log_id=LogId(LOG_ID), release_lsn=Lsn(2**64 - 2)),
                    lambda _: None)
    async with asyncio.timeout(DEADLINE_S):
        while True:
            answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            node.on_message(NodeId("reader"), Read(
                log_id=LogId(LOG_ID), from_lsn=Lsn(from_lsn), until_lsn=Lsn(2**64 - 2),
                release_lsn=Lsn(2**64 - 2), records_max=1000, bytes_max=1 << 26),
                answer.set_result)
            reply = await answer
            assert isinstance(reply, ReadReply) and reply.status == Status.OK, reply
            if not reply.records:
                return found
            found.update((r[0], r[3]) for r in reply.records)
            from_lsn = reply.next_lsn


async def test_every_acknowledged_record_survives_kill_9(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    data_dir = tmp_path / "data"
    await asyncio.to_thread(write_script, script)
    acked = await run_and_kill(script, data_dir)
    assert len(acked) >= ACKS_BEFORE_KILL
    # The newest segment was being written into zero-filled space (segment_files'
    # preallocation): the restart must take its zero tail for the end of the data.
    newest = sorted((data_dir / "segments").glob("*.seg"))[-1]
    assert scan_segment(await asyncio.to_thread(newest.read_bytes)).zero_tail_bytes > 0

    node = StorageNode(node_id=NodeId("crashy"), data_dir=str(data_dir),
                       config=StorageConfig(fsync="always", disk_free_bytes_min=0,
                                            segment_bytes_max=1024 * 1024))
    await node.start()
    try:
        stored = await read_everything(node)
        missing = [lsn for lsn in acked if lsn not in stored]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        wrong = [lsn for lsn in acked if stored[lsn] != expected_payload(lsn)]
        assert not wrong, f"payload mismatch for {wrong[:5]}"
        assert node.stats()["segment_id"] >= 2, "the run should have rolled a segment"
        # The reopened store keeps accepting writes after whatever the kill left behind.
        assert node.stats()["corrupt_segments"] == 0
        # New writes go right after the last good entry: a second restart finds them all.
        after = await store_more(node, max(acked) + 1, 50)
        assert node.stats()["fdatasyncs"] > 0
    finally:
        await node.close()
    node = StorageNode(node_id=NodeId("crashy"), data_dir=str(data_dir),
                       config=StorageConfig(fsync="always", disk_free_bytes_min=0,
                                            segment_bytes_max=1024 * 1024))
    await node.start()
    try:
        assert node.stats()["torn_tail_bytes"] == 0 and node.stats()["corrupt_segments"] == 0
        stored = await read_everything(node)
        assert all(stored.get(lsn) == expected_payload(lsn) for lsn in acked + after)
    finally:
        await node.close()


async def store_more(node: StorageNode, first: int, count: int) -> list[int]:
    """STORE ``count`` records from LSN ``first`` (each after the previous one is durable)."""
    done: list[int] = []
    for lsn in range(first, first + count):
        payloads = (expected_payload(lsn),)
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        node.on_message(NodeId("seq"), Store(
            log_id=LogId(LOG_ID), lsn=Lsn(lsn), wave=1, sequencer_node=NodeId("seq"),
            copyset=(NodeId("crashy"),), timestamp_ms=lsn, last_known_good=Esn(0),
            release_lsn=Lsn(0), timeout_ms=1000, key=None, payloads=payloads,
            checksum=payloads_checksum(payloads)), answer.set_result)
        async with asyncio.timeout(DEADLINE_S):
            reply = await answer
        assert isinstance(reply, Stored) and reply.status == Status.OK, reply
        done.append(lsn)
    return done
