"""A storage node serves no copy above the release pointer a sequencer gave it (RELEASE, or
the pointer a STORE carries), whatever pointer a READ carries (issue 16 item 7): any client
connection may send READ, and without the cap one that sends a high ``release_lsn`` read
unreleased copies, including stray ones recovery had not plugged yet. The READ's pointer
still lets the node say it holds nothing up to there, and a READ that would get nothing
because its first copy is not released here yet is held until the RELEASE comes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shared.status import Status
from shared.types import LSN_MAX, LogId, NodeId
from shared.wire.read import ReadReply
from shared.wire.release import Release
from storage_node.runtime import READ_RELEASE_WAIT_MS
from tests.unit.storage_node.helpers import (
    LOG,
    assert_ok,
    lsn,
    make_read,
    make_store,
    read,
    request,
    running_node,
    store_all,
)


async def test_a_reads_pointer_never_serves_unreleased_copies(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 11)]))
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 4)),
                        lambda _: None)
        reply = await read(node, make_read(1, release_lsn=LSN_MAX - 1), released=False)
        assert [r[0] for r in reply.records] == [lsn(1, i) for i in range(1, 5)]
        assert reply.next_lsn == lsn(1, 5) and reply.release_lsn == lsn(1, 4)
        # Nothing is held above the release pointer on another log: the node says so up to
        # the READ's pointer, so a reader need not wait for this node to hear the release.
        empty = await read(node, make_read(1, release_lsn=lsn(3, 9), log_id=LogId(8)),
                           released=False)
        assert (empty.records, empty.next_lsn) == ((), lsn(3, 10))


async def test_a_read_past_the_nodes_pointer_waits_for_the_release(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 4)]))
        # A reader right after the acknowledgement: it knows the sequencer released e1n3,
        # the node does not yet. Held (no wait_ms), then served when the RELEASE comes.
        pending = asyncio.ensure_future(request(node, make_read(
            lsn(1, 1), release_lsn=lsn(1, 3))))
        await asyncio.sleep(0.05)
        assert not pending.done() and node.stats()["reads_waiting"] == 1
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 3)),
                        lambda _: None)
        async with asyncio.timeout(5):
            reply = await pending
        assert isinstance(reply, ReadReply)
        assert [r[0] for r in reply.records] == [lsn(1, 1), lsn(1, 2), lsn(1, 3)]
        # A node that never hears it answers (nothing) after READ_RELEASE_WAIT_MS.
        assert_ok(await store_all(node, [make_store(lsn(1, 4))]))
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with asyncio.timeout(READ_RELEASE_WAIT_MS / 1000 + 5):
            late = await request(node, make_read(lsn(1, 4), release_lsn=lsn(1, 9)))
        assert isinstance(late, ReadReply) and late.status is Status.OK
        assert (late.records, late.next_lsn) == ((), lsn(1, 4))
        assert loop.time() - started >= READ_RELEASE_WAIT_MS / 1000 * 0.9


async def test_a_read_right_after_an_ack_is_not_answered_short(tmp_path: Path) -> None:
    # The node holds released records and one the reader was told is released (acknowledged)
    # whose RELEASE has not come yet: it answers once it has, not with the older part only.
    async with running_node(str(tmp_path)) as node:
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(1, 4)]))
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 2)),
                        lambda _: None)
        pending = asyncio.ensure_future(request(node, make_read(1, release_lsn=lsn(1, 3))))
        await asyncio.sleep(0.05)
        assert not pending.done()
        node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, 3)),
                        lambda _: None)
        async with asyncio.timeout(5):
            reply = await pending
        assert isinstance(reply, ReadReply)
        assert [r[0] for r in reply.records] == [lsn(1, 1), lsn(1, 2), lsn(1, 3)]
        # Copies below the READ's start do not hold it.
        assert_ok(await store_all(node, [make_store(lsn(1, i)) for i in range(4, 6)]))
        async with asyncio.timeout(0.5):
            past = await request(node, make_read(lsn(1, 6), release_lsn=lsn(1, 8)))
        assert isinstance(past, ReadReply) and past.next_lsn == lsn(1, 9)
