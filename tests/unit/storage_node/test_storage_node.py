"""StorageNode through on_message: STORE/STORED, group commit, reads of released records,
preemption and every refusal status."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shared.status import LogError, Status
from shared.types import NodeId
from shared.wire.hello import Hello
from shared.wire.read import GetLogState, LogState
from shared.wire.release import Release
from storage_node.runtime import StorageNode
from tests.unit.storage_node.helpers import (
    LOG,
    SEQ_A,
    SEQ_B,
    assert_ok,
    log_state,
    lsn,
    make_read,
    make_store,
    payload_for,
    read,
    read_file,
    request,
    running_node,
    seal,
    segment_paths,
    storage_config,
    store,
    store_all,
    wait_until,
)


async def test_store_is_acknowledged_once_it_is_on_disk(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        reply = await store(node, make_store(lsn(1, 1), (b"hello-durable-world",)))
        assert (reply.status, reply.log_id, reply.lsn, reply.wave) == (Status.OK, LOG,
                                                                       lsn(1, 1), 1)
        stats = node.stats()
        assert stats["stored_ok"] == 1 and stats["fsyncs"] >= 1
        on_disk = b"".join([await asyncio.to_thread(read_file, p)
                            for p in segment_paths(data_dir)])
        assert b"hello-durable-world" in on_disk
        assert (await log_state(node)).last_lsn == lsn(1, 1)


async def test_concurrent_stores_share_fsyncs(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        replies = await store_all(node, [make_store(lsn(1, i)) for i in range(1, 201)])
        assert_ok(replies)
        stats = node.stats()
        assert stats["stores"] == 200
        assert stats["fsyncs"] <= 20, stats
        assert stats["commit_batches"] <= 20, stats


async def test_reads_return_released_records_only(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 11)]))
        nothing = await read(node, make_read(1))
        assert nothing.status == Status.OK and nothing.records == () and nothing.next_lsn == 1

        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 4)), lambda m: None)
        reply = await read(node, make_read(1))
        assert [r[0] for r in reply.records] == [lsn(1, i) for i in range(1, 5)]
        assert reply.records[0][3] == payload_for(lsn(1, 1))
        assert reply.next_lsn == lsn(1, 5) and reply.release_lsn == lsn(1, 4)

        # Once the sequencer's RELEASE arrives (the helper sends it first) the rest follows.
        newer = await read(node, make_read(lsn(1, 5), release_lsn=lsn(1, 7)))
        assert [r[0] for r in newer.records] == [lsn(1, 5), lsn(1, 6), lsn(1, 7)]
        # A release piggybacked on a STORE counts as well.
        assert_ok([await store(node, make_store(lsn(1, 11), release_lsn=lsn(1, 9)))])
        assert (await log_state(node)).release_lsn == lsn(1, 9)
        assert len((await read(node, make_read(1))).records) == 9


async def test_batches_are_split_and_entered_mid_batch(tmp_path: Path) -> None:
    payloads = tuple(payload_for(i, 100) for i in range(10))
    async with running_node(str(tmp_path)) as node:
        assert_ok([await store(node, make_store(lsn(2, 1), payloads, key="k",
                                                release_lsn=lsn(2, 10)))])
        reply = await read(node, make_read(lsn(2, 4), records_max=3))
        assert [(r[0], r[2], r[3]) for r in reply.records] == [
            (lsn(2, 4), "k", payloads[3]), (lsn(2, 5), "k", payloads[4]),
            (lsn(2, 6), "k", payloads[5])]
        assert reply.next_lsn == lsn(2, 7)
        by_bytes = await read(node, make_read(lsn(2, 7), bytes_max=250))
        assert [r[0] for r in by_bytes.records] == [lsn(2, 7), lsn(2, 8)]
        assert by_bytes.next_lsn == lsn(2, 9)
        tail = await read(node, make_read(lsn(2, 9), until_lsn=lsn(2, 9)))
        assert [r[0] for r in tail.records] == [lsn(2, 9)] and tail.next_lsn == lsn(2, 10)
        # At least one record comes back even when it alone exceeds bytes_max.
        assert len((await read(node, make_read(lsn(2, 10), bytes_max=1))).records) == 1


async def test_new_wave_of_same_lsn_replaces_the_copy(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert_ok([await store(node, make_store(lsn(1, 1), wave=1))])
        assert_ok([await store(node, make_store(lsn(1, 1), wave=2, release_lsn=lsn(1, 1)))])
        assert node.stats()["index_entries"] == 1
        assert len((await read(node, make_read(1))).records) == 1


async def test_store_of_newer_epoch_preempts_older_sequencer(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert_ok([await store(node, make_store(lsn(3, 1), sequencer=SEQ_B))])
        reply = await store(node, make_store(lsn(2, 5), sequencer=SEQ_A))
        assert (reply.status, reply.sealed_epoch, reply.sealed_by) == (Status.PREEMPTED, 2,
                                                                       SEQ_B)
        assert (await log_state(node)).sealed_epoch == 2


async def test_durable_seal_preempts_and_survives_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert await seal(node, 4, "recoverer") == Status.OK
        assert await seal(node, 4, "recoverer") == Status.OK
        assert await seal(node, 3, "late") == Status.PREEMPTED
        reply = await store(node, make_store(lsn(4, 1)))
        assert (reply.status, reply.sealed_epoch, reply.sealed_by) == (Status.PREEMPTED, 4,
                                                                       "recoverer")
    async with running_node(data_dir) as node:
        reply = await store(node, make_store(lsn(3, 7)))
        assert (reply.status, reply.sealed_epoch, reply.sealed_by) == (Status.PREEMPTED, 4,
                                                                       "recoverer")
        assert (await store(node, make_store(lsn(5, 1)))).status == Status.OK


async def test_refusals(tmp_path: Path) -> None:
    async with running_node(str(tmp_path / "a"), storage_config(accept_writes=False)) as node:
        assert (await store(node, make_store(lsn(1, 1)))).status == Status.DISABLED
    async with running_node(str(tmp_path / "b"),
                            storage_config(disk_free_bytes_min=2**50)) as node:
        assert (await store(node, make_store(lsn(1, 1)))).status == Status.NOSPC
        assert node.stats()["disk_low"] == 1
    async with running_node(str(tmp_path / "c")) as node:
        bad_sum = await store(node, make_store(lsn(1, 1), checksum=12345))
        assert bad_sum.status == Status.CHECKSUM_MISMATCH
        assert (await store(node, make_store(lsn(1, 1), ()))).status == Status.BADMSG
        assert (await read(node, make_read(1, records_max=0))).status == Status.BADMSG
        assert node.stats()["stores"] == 0


async def test_full_writer_queue_answers_overloaded(tmp_path: Path) -> None:
    async with running_node(str(tmp_path), storage_config(store_queue_records_max=4)) as node:
        replies = await store_all(node, [make_store(lsn(1, i)) for i in range(1, 41)])
        statuses = {r.status for r in replies}
        assert statuses == {Status.OK, Status.OVERLOADED}
        assert node.stats()["overloaded"] >= 1
        # Nothing refused was written: every OK is readable, nothing else is.
        ok = sorted(r.lsn for r in replies if r.status == Status.OK)
        got = await read(node, make_read(1, release_lsn=lsn(1, 40)))
        assert [r[0] for r in got.records] == ok


async def test_messages_before_start_after_close_and_unexpected(tmp_path: Path) -> None:
    node = StorageNode(node_id=NodeId("n1"), data_dir=str(tmp_path), config=storage_config())
    assert (await store(node, make_store(lsn(1, 1)))).status == Status.NOTREADY
    await node.start()
    node.on_message(NodeId("x"), Hello(node_id=NodeId("x"), protocol_version=1,
                                       cluster_fingerprint=""), lambda m: None)
    assert node.stats()["unexpected_messages"] == 1
    state = await request(node, GetLogState(log_id=LOG))
    assert isinstance(state, LogState) and state.status == Status.OK and state.last_lsn == 0
    await node.close()
    assert (await store(node, make_store(lsn(1, 1)))).status == Status.SHUTDOWN
    assert (await read(node, make_read(1))).status == Status.SHUTDOWN


async def test_fsync_interval_and_never(tmp_path: Path) -> None:
    config = storage_config(fsync="interval", fsync_interval_ms=20)
    async with running_node(str(tmp_path / "i"), config) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 51)]))
        await wait_until(lambda: node.stats()["fsyncs"] >= 1)
    async with running_node(str(tmp_path / "n"), storage_config(fsync="never")) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 51)]))
        assert node.stats().get("fsyncs", 0) == 0


async def test_second_process_cannot_open_the_same_directory(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)):
        other = StorageNode(node_id=NodeId("n2"), data_dir=str(tmp_path),
                            config=storage_config())
        try:
            await other.start()
            raise AssertionError("a second opener must be refused")
        except LogError as error:
            assert error.status == Status.EXISTS


async def test_trim_is_durable_and_hides_records_below_it(tmp_path: Path) -> None:
    from shared.wire.trim import Trim, Trimmed

    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        await store_all(node, [make_store(lsn(1, esn)) for esn in range(1, 6)])
        answer = await request(node, Trim(log_id=LOG, trim_lsn=lsn(1, 3)))
        assert isinstance(answer, Trimmed) and (answer.status, answer.trim_lsn) == (
            Status.OK, lsn(1, 3))
        lower = await request(node, Trim(log_id=LOG, trim_lsn=lsn(1, 1)))  # never lowers
        assert isinstance(lower, Trimmed) and lower.trim_lsn == lsn(1, 3)
    async with running_node(data_dir) as node:
        reply = await read(node, make_read(lsn(1, 1), release_lsn=lsn(1, 5)))
        assert [r[0] for r in reply.records] == [lsn(1, 4), lsn(1, 5)]
        assert reply.trim_lsn == lsn(1, 3)
        assert (await log_state(node)).trim_lsn == lsn(1, 3)
