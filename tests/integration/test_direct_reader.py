"""The client's direct reader (``Client.reader``) on a real cluster of processes: the same log
as HTTP reads, across an epoch change (BRIDGE) and a trim (TRIM); no DATALOSS with a storage
node down; waiting instead of skipping below an f-majority; a tailing reader that keeps up
while a storage node is killed and restarted, and one that a stopped node does not stall."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from seqlog_cluster_support import READY_TIMEOUT_MS

from seqlog import Client, Gap, LogError, Record
from seqlog.reader import LogReader
from services import local_cluster as lc
from shared.config import SequencerConfig
from shared.status import Status
from shared.types import LSN_OLDEST, lsn_to_epoch

pytestmark = pytest.mark.integration


def _start(root: Path, *, storage_nodes: int, replication: int) -> lc.ClusterState:
    return lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=storage_nodes, sequencers=2, replication=replication,
        base_port=lc.free_base_port(storage_nodes + 2), fsync="never"),
        ready_timeout_ms=READY_TIMEOUT_MS)


def _pid(state: lc.ClusterState, node_id: str) -> int:
    return next(n.pid for n in state.nodes if n.node_id == node_id)


async def _released(client: Client, log_id: int, lsn: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (await client.tail(log_id)).release_lsn < lsn:
        assert time.monotonic() < deadline, f"release never reached {lsn}"
        await asyncio.sleep(0.05)


async def _http_entries(client: Client, log_id: int) -> list[Record | Gap]:
    entries: list[Record | Gap] = []
    cursor = LSN_OLDEST
    while True:
        result = await client.read(log_id, cursor, limit=1000)
        entries.extend(result.entries())
        if result.next_lsn == cursor or result.next_lsn > result.release_lsn:
            return entries
        cursor = result.next_lsn


async def _reader_entries(reader: LogReader) -> list[Record | Gap]:
    async with reader:
        return [entry async for entry in reader]


def _covered_once(entries: list[Record | Gap], until: int) -> None:
    cursor = LSN_OLDEST
    for entry in entries:
        lo, hi = (entry.lsn, entry.lsn) if isinstance(entry, Record) else (entry.lo, entry.hi)
        assert lo == cursor, f"coverage broken at {cursor}: {entry}"
        cursor = hi + 1
    assert cursor > until, (cursor, until)


async def test_reader_made_after_an_ack_reads_it_once_storage_nodes_hear_the_release(
        cluster_dir: Path) -> None:
    # The sequencer answers before it sends the RELEASE; here the storage nodes hear it only
    # after 300 ms (no broadcast). The reader starts from the release pointer of the nodesets
    # answer; a storage node serves no copy above its own pointer whatever a READ carries
    # (issue 16 item 7), but holds the READ (READ_RELEASE_WAIT_MS) until the RELEASE comes.
    slow_release = SequencerConfig(release_delay_ms=300, release_broadcast_interval_ms=60_000)
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=3,
        base_port=lc.free_base_port(5), fsync="never", sequencer=slow_release),
        ready_timeout_ms=READY_TIMEOUT_MS)
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        lsn = (await client.append(7, b"acked")).lsn
        async with asyncio.timeout(20):
            entries = await _reader_entries(await client.reader(7, wait_ms=0))
    assert [(e.lsn, e.payload) for e in entries if isinstance(e, Record)] == [(lsn, b"acked")]


async def test_reader_sees_what_http_shows_across_epochs_and_trims(cluster_dir: Path) -> None:
    state = _start(cluster_dir, storage_nodes=3, replication=2)
    log_id = 11
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        first = [await client.append(log_id, b"a%d" % i) for i in range(30)]
        batch = await client.append_batch(log_id, [b"b%d" % i for i in range(20)])
        owner = (await client.tail(log_id)).sequencer
        await asyncio.to_thread(lc.restart, cluster_dir, owner,
                                ready_timeout_ms=READY_TIMEOUT_MS)
        later = [await client.append(log_id, b"c%d" % i) for i in range(10)]
        assert lsn_to_epoch(later[0].lsn) > lsn_to_epoch(first[0].lsn)
        await _released(client, log_id, later[-1].lsn)
        await client.trim(log_id, first[9].lsn)

        over_http = await _http_entries(client, log_id)
        direct = await _reader_entries(await client.reader(log_id))
        assert direct == over_http
        _covered_once(direct, later[-1].lsn)
        records = [e for e in direct if isinstance(e, Record)]
        assert [r.payload for r in records] == (
            [b"a%d" % i for i in range(10, 30)] + [b"b%d" % i for i in range(20)]
            + [b"c%d" % i for i in range(10)])
        kinds = [e.type for e in direct if isinstance(e, Gap)]
        assert kinds[0] == "TRIM" and "BRIDGE" in kinds and "DATALOSS" not in kinds
        assert batch.last_lsn < later[0].lsn

        # Read-ahead stays within its bound while nobody consumes.
        async with await client.reader(log_id, read_ahead_records_max=5) as bounded:
            assert isinstance(await bounded.__anext__(), Gap)  # the TRIM gap
            deadline = time.monotonic() + 10
            while bounded.buffered_count < 5:
                assert time.monotonic() < deadline, bounded.buffered_count
                await asyncio.sleep(0.01)
            fetched = bounded.next_lsn
            await asyncio.sleep(0.2)
            assert bounded.buffered_count == 5 and bounded.next_lsn == fetched
            assert len([e async for e in bounded]) == len(direct) - 1

        # Reading from the middle, and stopping at an LSN.
        middle = await _reader_entries(await client.reader(
            log_id, first[20].lsn, until_lsn=batch.first_lsn + 4))
        assert [e.payload for e in middle if isinstance(e, Record)] == (
            [b"a%d" % i for i in range(20, 30)] + [b"b%d" % i for i in range(5)])


async def test_reader_waits_below_an_f_majority_and_never_reports_dataloss(
    cluster_dir: Path,
) -> None:
    # 4 storage nodes with R=2: an f-majority is 3.
    state = _start(cluster_dir, storage_nodes=4, replication=2)
    log_id = 12
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        written = [await client.append(log_id, b"w%d" % i) for i in range(40)]
        await _released(client, log_id, written[-1].lsn)
        os.kill(_pid(state, "st1"), signal.SIGKILL)
        entries = await _reader_entries(await client.reader(log_id))
        assert [e.payload for e in entries if isinstance(e, Record)] == [
            b"w%d" % i for i in range(40)]
        assert not [e for e in entries if isinstance(e, Gap) and e.type == "DATALOSS"]

        os.kill(_pid(state, "st2"), signal.SIGKILL)
        reader = await client.reader(log_id, stall_timeout_ms=60_000)
        async with reader:
            pending = asyncio.ensure_future(reader.__anext__())
            deadline = time.monotonic() + 30
            while reader.short_rounds_count < 3:
                assert time.monotonic() < deadline, "the reader never tried"
                await asyncio.sleep(0.05)
            assert not pending.done(), "a reader with 2 of 4 nodes delivered something"
            await asyncio.to_thread(lc.restart, cluster_dir, "st2",
                                    ready_timeout_ms=READY_TIMEOUT_MS)
            first = await asyncio.wait_for(pending, 30)
            rest = [entry async for entry in reader]
        got = [first, *rest]
        assert [e.payload for e in got if isinstance(e, Record)] == [
            b"w%d" % i for i in range(40)]

        # A reader that cannot reach an f-majority for its stall timeout says so.
        os.kill(_pid(lc.load_state(cluster_dir) or state, "st2"), signal.SIGKILL)
        with pytest.raises(LogError) as stalled:
            await _reader_entries(await client.reader(log_id, stall_timeout_ms=500))
        assert stalled.value.status is Status.NOTREADY
        assert "needed to read on without skipping" in stalled.value.message


async def test_tailing_reader_keeps_up_through_a_storage_node_kill_and_stop(
    cluster_dir: Path,
) -> None:
    state = _start(cluster_dir, storage_nodes=3, replication=2)
    log_id = 13
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        await client.append(log_id, b"start")
        reader = await client.reader(log_id, follow=True, wait_ms=2_000)
        seen: dict[int, bytes] = {}
        delays_ms: list[float] = []
        sent_at: dict[bytes, float] = {}

        async def consume() -> None:
            async for entry in reader:
                if isinstance(entry, Record):
                    seen[entry.lsn] = entry.payload
                    if entry.payload in sent_at:
                        delays_ms.append((time.monotonic() - sent_at[entry.payload]) * 1000)
                else:
                    assert entry.type != "DATALOSS", entry

        consumer = asyncio.ensure_future(consume())
        acked: dict[int, bytes] = {}

        async def write(count: int, tag: str) -> None:
            for i in range(count):
                payload = f"{tag}-{i}".encode()
                sent_at[payload] = time.monotonic()
                acked[(await client.append(log_id, payload)).lsn] = payload

        async def caught_up(timeout_s: float = 30) -> None:
            deadline = time.monotonic() + timeout_s
            while not set(acked) <= set(seen):
                assert not consumer.done(), consumer
                assert time.monotonic() < deadline, sorted(set(acked) - set(seen))[:5]
                await asyncio.sleep(0.02)

        try:
            await write(30, "before")
            await caught_up()
            os.kill(_pid(state, "st1"), signal.SIGKILL)
            await write(30, "killed")
            await caught_up()
            await asyncio.to_thread(lc.restart, cluster_dir, "st1",
                                    ready_timeout_ms=READY_TIMEOUT_MS)
            await write(30, "restarted")
            await caught_up()
            # A stopped (not dead) node: rounds go on after the speculative delay.
            stopped = _pid(lc.load_state(cluster_dir) or state, "st2")
            os.kill(stopped, signal.SIGSTOP)
            try:
                delays_ms.clear()
                await write(30, "stopped")
                await caught_up()
                assert sorted(delays_ms)[len(delays_ms) // 2] < 1_000, delays_ms
            finally:
                os.kill(stopped, signal.SIGCONT)
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await reader.close()
        assert {lsn: seen[lsn] for lsn in acked} == acked
