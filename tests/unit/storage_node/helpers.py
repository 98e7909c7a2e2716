"""Builders for the storage node tests: STOREs, READs, and a node driven through on_message."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from shared.config import StorageConfig
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import Message
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.recovery import Seal, Sealed
from shared.wire.release import Release
from shared.wire.store import Store, Stored, payloads_checksum
from storage_node.rebuild_runtime import RebuildRuntime
from storage_node.runtime import StorageNode
from storage_node.segment_format import scan_segment

LOG = LogId(7)
SEQ_A = NodeId("seq-a")
SEQ_B = NodeId("seq-b")
REPLY_TIMEOUT_S = 10.0


def lsn(epoch: int, esn: int) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def payload_for(value: int, size_bytes: int = 32) -> bytes:
    """A payload that names its LSN, so a misplaced record cannot pass for the right one."""
    unit = f"<{value}>".encode()
    return (unit * (size_bytes // len(unit) + 1))[:size_bytes]


def make_store(first: Lsn, payloads: tuple[bytes, ...] | None = None, *, log_id: LogId = LOG,
               sequencer: NodeId = SEQ_A, wave: int = 1, release_lsn: int = 0,
               key: str | None = None, checksum: int | None = None) -> Store:
    if payloads is None:
        payloads = (payload_for(first),)
    return Store(log_id=log_id, lsn=first, wave=wave, sequencer_node=sequencer,
                 copyset=(NodeId("n1"), NodeId("n2")), timestamp_ms=1_700_000_000_000,
                 last_known_good=Esn(0), release_lsn=Lsn(release_lsn), timeout_ms=1000,
                 key=key, payloads=payloads,
                 checksum=payloads_checksum(payloads) if checksum is None else checksum)


def make_read(from_lsn: int, *, until_lsn: int = 2**64 - 2, release_lsn: int = 0,
              records_max: int = 1000, bytes_max: int = 1 << 30, log_id: LogId = LOG) -> Read:
    return Read(log_id=log_id, from_lsn=Lsn(from_lsn), until_lsn=Lsn(until_lsn),
                release_lsn=Lsn(release_lsn), records_max=records_max, bytes_max=bytes_max)


def storage_config(**overrides: Any) -> StorageConfig:
    settings: dict[str, Any] = {"fsync": "always", "disk_free_bytes_min": 0,
                                "segment_bytes_max": 1024 * 1024}
    settings.update(overrides)
    return StorageConfig(**settings)


async def request(node: StorageNode, message: Message) -> Message:
    """Send ``message`` through on_message and wait (bounded) for its one reply."""
    future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    def reply(answer: Message) -> None:
        assert not future.done(), "replied twice"
        future.set_result(answer)

    node.on_message(NodeId("peer"), message, reply)
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        return await future


async def store(node: StorageNode, message: Store) -> Stored:
    answer = await request(node, message)
    assert isinstance(answer, Stored)
    return answer


async def read(node: StorageNode, message: Read, *, released: bool = True) -> ReadReply:
    """``released``: the READ's release pointer is first given to the node as a sequencer
    would (RELEASE), since a node serves no copy above its own pointer, whatever a READ
    carries."""
    if released and message.release_lsn > node.log_state(message.log_id).release_lsn:
        node.on_message(NodeId("seq"), Release(log_id=message.log_id,
                                               release_lsn=message.release_lsn), lambda _: None)
    answer = await request(node, message)
    assert isinstance(answer, ReadReply)
    return answer


async def log_state(node: StorageNode, log_id: LogId = LOG) -> LogState:
    answer = await request(node, GetLogState(log_id=log_id))
    assert isinstance(answer, LogState)
    return answer


async def seal(node: StorageNode, epoch: int, sealed_by: str, log_id: LogId = LOG) -> Status:
    """Recovery's SEAL through on_message; the SEALED status."""
    answer = await request(node, Seal(log_id=log_id, seal_epoch=Epoch(epoch),
                                      sealed_by=NodeId(sealed_by), from_epoch=Epoch(1)))
    assert isinstance(answer, Sealed)
    return answer.status


async def store_all(node: StorageNode, messages: list[Store]) -> list[Stored]:
    """Issue every STORE before awaiting any, as a busy sequencer would."""
    return list(await asyncio.gather(*(store(node, m) for m in messages)))


@asynccontextmanager
async def running_node(data_dir: str, config: StorageConfig | None = None,
                       node_id: str = "n1") -> AsyncIterator[StorageNode]:
    node = StorageNode(node_id=NodeId(node_id), data_dir=data_dir,
                       config=config or storage_config())
    await node.start()
    try:
        yield node
    finally:
        await node.close()


def segment_paths(data_dir: str) -> list[str]:
    directory = os.path.join(data_dir, "segments")
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory))
            if n.endswith(".seg")]  # not the zero-filled spare of the next segment


def assert_ok(replies: list[Stored]) -> None:
    bad = [r for r in replies if r.status != Status.OK]
    assert not bad, bad[:3]


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.002)


# File surgery for the tests, run through asyncio.to_thread by the async tests.

def file_size(path: str) -> int:
    return os.path.getsize(path)


def data_size(path: str) -> int:
    """Bytes of entries in a segment file: up to its zero-filled tail, which a running store
    keeps ahead of its writes (``segment_files``)."""
    return scan_segment(read_file(path)).valid_bytes


def read_file(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def truncate_file(path: str, size: int) -> None:
    with open(path, "r+b") as file:
        file.truncate(size)


def append_to_file(path: str, data: bytes) -> None:
    with open(path, "ab") as file:
        file.write(data)


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def one_node_rebuild_runtime(node: StorageNode, data_dir: str, state_store: Any
                             ) -> RebuildRuntime:
    """A ``RebuildRuntime`` for ``node`` (disk generation 1) in a two-node cluster ``c`` whose
    cluster state is ``state_store``; it asks no one anything (``request`` answers None)."""
    runtime = RebuildRuntime(node=node, data_dir=data_dir, cluster_name="c",
                             state_store=state_store, storage_nodes=lambda: ("n1", "n2"),
                             request=lambda *_: None)
    runtime.generation = 1
    return runtime
