"""StorageNode and STORE_BATCH / RELEASE_BATCH: the STOREs of many logs in one frame are each
handled as if alone, written in one group commit, and answered in one STORED_BATCH."""

from __future__ import annotations

from pathlib import Path

from shared.status import Status
from shared.types import LogId, NodeId
from shared.wire import codec
from shared.wire.framing import FrameDecoder
from shared.wire.store import Store
from shared.wire.store_batch import ReleaseBatch, StoreBatch, StoredBatch, stored_batch_results
from storage_node.runtime import StorageNode
from tests.unit.storage_node.helpers import (
    SEQ_A,
    SEQ_B,
    log_state,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    request,
    running_node,
    seal,
    storage_config,
)

LOGS = [LogId(100 + i) for i in range(50)]


def over_the_wire(message: StoreBatch | ReleaseBatch) -> StoreBatch | ReleaseBatch:
    """``message`` as a storage node receives it: encoded, then decoded (each STORE of a
    batch then holds its received bytes, which the record store writes as they are)."""
    [body] = FrameDecoder().feed(codec.encode(message, 1))
    decoded = codec.decode(body)
    assert isinstance(decoded, tuple)
    assert type(decoded[1]) is type(message)
    return decoded[1]


async def store_batch(node: StorageNode, stores: list[Store]) -> StoredBatch:
    answer = await request(node, over_the_wire(StoreBatch(stores=tuple(stores))))
    assert isinstance(answer, StoredBatch)
    return answer


async def test_stores_of_many_logs_share_one_write_and_one_answer(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        stores = [make_store(lsn(1, 1), (payload_for(log_id, 100),), log_id=log_id)
                  for log_id in LOGS]
        answer = await store_batch(node, stores)
        assert answer == StoredBatch(statuses=(int(Status.OK),) * len(LOGS))
        stats = node.stats()
        assert stats["store_batches"] == 1 and stats["store_messages"] == len(LOGS)
        assert stats["stores"] == len(LOGS) and stats["stored_ok"] == len(LOGS)
        assert stats["commit_batches"] == 1 and stats["fsyncs"] == 1, stats
        for log_id in LOGS:
            assert (await log_state(node, log_id)).last_lsn == lsn(1, 1)
            reply = await read(node, make_read(lsn(1, 1), release_lsn=lsn(1, 1), log_id=log_id))
            assert reply.status is Status.OK
            assert [r[-1] for r in reply.records] == [payload_for(log_id, 100)]


async def test_each_store_of_a_batch_gets_its_own_answer(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        sealed_log, good_log, corrupt_log = LOGS[0], LOGS[1], LOGS[2]
        assert await seal(node, 5, SEQ_B, log_id=sealed_log) is Status.OK
        stores = [
            make_store(lsn(6, 1), log_id=good_log),
            make_store(lsn(3, 1), log_id=sealed_log),                 # sealed: PREEMPTED
            make_store(lsn(6, 1), log_id=corrupt_log, checksum=1),    # CHECKSUM_MISMATCH
            make_store(lsn(6, 2), log_id=good_log),
        ]
        answer = await store_batch(node, stores)
        assert answer.statuses == (int(Status.OK), int(Status.PREEMPTED),
                                   int(Status.CHECKSUM_MISMATCH), int(Status.OK))
        assert stored_batch_results(answer, 4) == [
            (Status.OK, 0, None), (Status.PREEMPTED, 5, SEQ_B),
            (Status.CHECKSUM_MISMATCH, 0, None), (Status.OK, 0, None)]
        assert (await log_state(node, good_log)).last_lsn == lsn(6, 2)
        assert (await log_state(node, sealed_log)).last_lsn == 0
        assert (await log_state(node, corrupt_log)).last_lsn == 0


async def test_a_batch_before_start_is_refused_store_by_store(tmp_path: Path) -> None:
    node = StorageNode(node_id=NodeId("n1"), data_dir=str(tmp_path), config=storage_config())
    answer = await store_batch(node, [make_store(lsn(1, 1), log_id=log_id)
                                      for log_id in LOGS[:3]])
    assert answer.statuses == (int(Status.NOTREADY),) * 3


async def test_a_release_batch_moves_each_logs_pointer(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        pairs = tuple((log_id, lsn(1, index + 1)) for index, log_id in enumerate(LOGS))
        batch = over_the_wire(ReleaseBatch(releases=pairs))
        node.on_message(SEQ_A, batch, lambda message: None)
        # The node's pointers (GET_LOG_STATE reports them only once fsynced).
        for log_id, release_lsn in pairs:
            assert node.log_state(log_id).release_lsn == release_lsn
        assert node.stats()["release_messages"] == len(LOGS)
