"""Disk faults at the lowest I/O layer (ENOSPC from write, EIO from fsync), and RELEASE
coalescing."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.status import Status
from shared.types import NodeId
from shared.wire.release import Release
from storage_node import segment_files
from tests.unit.storage_node.helpers import (
    LOG,
    assert_ok,
    data_size,
    lsn,
    make_read,
    make_store,
    read,
    running_node,
    segment_paths,
    storage_config,
    store,
    store_all,
    wait_until,
)


def failing_write(error_number: int) -> Callable[[int, list[bytes]], None]:
    def write_all(fd: int, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        os.write(fd, data[: len(data) // 2])  # a partial write, then the failure
        raise OSError(error_number, os.strerror(error_number))

    return write_all


async def test_enospc_from_write_answers_nospc_and_leaves_no_partial_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_node(str(tmp_path)) as node:
        assert_ok([await store(node, make_store(lsn(1, 1)))])
        (path,) = segment_paths(str(tmp_path))
        size = await asyncio.to_thread(data_size, path)
        with monkeypatch.context() as patch:
            patch.setattr(segment_files, "_writev_all", failing_write(errno.ENOSPC))
            assert (await store(node, make_store(lsn(1, 2)))).status == Status.NOSPC
            assert node.stats()["disk_low"] == 1
            assert (await store(node, make_store(lsn(1, 3)))).status == Status.NOSPC
        assert await asyncio.to_thread(data_size, path) == size
        # Space is back: the periodic disk check notices and writes are accepted again.
        await wait_until(lambda: node.stats()["disk_low"] == 0)
        assert (await store(node, make_store(lsn(1, 4)))).status == Status.OK
        reply = await read(node, make_read(1, release_lsn=lsn(1, 9)))
        assert [r[0] for r in reply.records] == [lsn(1, 1), lsn(1, 4)]


async def test_failed_fsync_disables_the_store(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_node(str(tmp_path)) as node:
        real_fsync, real_fdatasync = os.fsync, os.fdatasync

        def broken_fsync(fd: int) -> None:
            raise OSError(errno.EIO, "injected")

        # fdatasync too: a commit into the zero-filled space ahead of the writes uses it.
        monkeypatch.setattr(os, "fsync", broken_fsync)
        monkeypatch.setattr(os, "fdatasync", broken_fsync)
        assert (await store(node, make_store(lsn(1, 1)))).status == Status.DISABLED
        assert node.stats()["broken"] == 1
        # Never retried: once an fsync failed the kernel may have dropped the data.
        assert (await store(node, make_store(lsn(1, 2)))).status == Status.DISABLED
        monkeypatch.setattr(os, "fsync", real_fsync)
        monkeypatch.setattr(os, "fdatasync", real_fdatasync)
        assert (await read(node, make_read(1, release_lsn=lsn(1, 9)))).records == ()


async def test_releases_are_coalesced_per_batch(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        stores = [make_store(lsn(1, i)) for i in range(1, 101)]
        pending = asyncio.gather(*(store(node, m) for m in stores))
        for i in range(1, 101):
            node.on_message(NodeId("seq"), Release(log_id=LOG, release_lsn=lsn(1, i)),
                            lambda m: None)
        assert_ok(list(await pending))
        stats = node.stats()
        assert stats["release_messages"] == 100
        assert stats["release_entries"] <= stats["commit_batches"] <= 10
    async with running_node(str(tmp_path)) as node:
        reply = await read(node, make_read(1))
        assert len(reply.records) == 100 and reply.release_lsn == lsn(1, 100)
        assert_ok(await store_all(node, [make_store(lsn(1, 101))]))
        assert node.stats()["stored_ok"] == 1


async def test_small_segment_limit_still_takes_a_big_batch(tmp_path: Path) -> None:
    payloads = tuple(os.urandom(300 * 1024) for _ in range(5))  # 1.5 MiB in one STORE
    async with running_node(str(tmp_path), storage_config()) as node:
        assert_ok([await store(node, make_store(lsn(1, 1), (b"small",)))])
        assert_ok([await store(node, make_store(lsn(1, 2), payloads))])
        assert_ok([await store(node, make_store(lsn(1, 7), (b"after",)))])
        reply = await read(node, make_read(1, release_lsn=lsn(1, 7)))
        assert [r[3] for r in reply.records] == [b"small", *payloads, b"after"]
        assert len(segment_paths(str(tmp_path))) == 3
