"""Long-poll READs on a storage node: held until the release pointer passes ``from_lsn`` or
the wait runs out, bounded in number, answered on close, and refused when out of range."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from shared.limits import READ_WAIT_MS_MAX
from shared.status import Status
from shared.types import NodeId
from shared.wire.read import Read, ReadReply
from shared.wire.release import Release
from storage_node import runtime
from storage_node.runtime import StorageNode
from tests.unit.storage_node.helpers import (
    LOG,
    lsn,
    make_read,
    make_store,
    read,
    request,
    running_node,
    storage_config,
    store,
)


def waiting_read(from_lsn: int, wait_ms: int) -> Read:
    plain = make_read(from_lsn)
    return Read(log_id=plain.log_id, from_lsn=plain.from_lsn, until_lsn=plain.until_lsn,
                release_lsn=plain.release_lsn, records_max=plain.records_max,
                bytes_max=plain.bytes_max, wait_ms=wait_ms)


def release(node: StorageNode, upto: int) -> None:
    node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=upto), lambda m: None)


async def test_held_read_answers_when_the_release_passes_it(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        for esn in (1, 2):
            assert (await store(node, make_store(lsn(1, esn)))).status is Status.OK
        release(node, lsn(1, 1))
        pending = asyncio.ensure_future(read(node, waiting_read(lsn(1, 2), 10_000)))
        await asyncio.sleep(0.05)
        assert not pending.done(), "answered before anything at from_lsn was released"
        assert node.stats()["reads_waiting"] == 1
        started = time.monotonic()
        release(node, lsn(1, 2))
        answer = await asyncio.wait_for(pending, 5)
        assert time.monotonic() - started < 1
        assert [r[0] for r in answer.records] == [lsn(1, 2)]
        assert node.stats()["reads_waiting"] == 0


async def test_held_read_answers_empty_when_its_wait_runs_out(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        started = time.monotonic()
        answer = await read(node, waiting_read(lsn(1, 1), 200))
        waited = time.monotonic() - started
        assert answer.status is Status.OK and answer.records == ()
        assert 0.15 <= waited < 3, waited


async def test_read_with_something_released_is_not_held(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert (await store(node, make_store(lsn(1, 1)))).status is Status.OK
        release(node, lsn(1, 1))
        started = time.monotonic()
        answer = await read(node, waiting_read(lsn(1, 1), 30_000))
        assert time.monotonic() - started < 2
        assert [r[0] for r in answer.records] == [lsn(1, 1)]


async def test_release_piggybacked_on_a_store_wakes_readers(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert (await store(node, make_store(lsn(1, 1)))).status is Status.OK
        pending = asyncio.ensure_future(read(node, waiting_read(lsn(1, 1), 10_000)))
        await asyncio.sleep(0.05)
        assert not pending.done()
        await store(node, make_store(lsn(1, 2), release_lsn=lsn(1, 1)))
        answer = await asyncio.wait_for(pending, 5)
        assert [r[0] for r in answer.records] == [lsn(1, 1)]


async def test_waiters_are_bounded_and_answered_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "READ_WAITERS_MAX", 3)
    node = StorageNode(node_id=NodeId("n1"), data_dir=str(tmp_path), config=storage_config())
    await node.start()
    held = [asyncio.ensure_future(read(node, waiting_read(lsn(1, 1), 60_000)))
            for _ in range(3)]
    await asyncio.sleep(0.05)
    assert node.stats()["reads_waiting"] == 3
    # Past the bound a READ is answered at once rather than held.
    started = time.monotonic()
    extra = await read(node, waiting_read(lsn(1, 1), 60_000))
    assert extra.status is Status.OK and time.monotonic() - started < 2
    assert not any(h.done() for h in held)
    await asyncio.wait_for(node.close(), 10)
    answers = await asyncio.wait_for(asyncio.gather(*held), 5)
    assert all(isinstance(a, ReadReply) for a in answers)
    assert node.stats()["reads_waiting"] == 0


async def test_wait_out_of_range_is_badmsg(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        for wait_ms in (-1, READ_WAIT_MS_MAX + 1):
            answer = await request(node, waiting_read(lsn(1, 1), wait_ms))
            assert isinstance(answer, ReadReply) and answer.status is Status.BADMSG
