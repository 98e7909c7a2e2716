"""Fault tests on real node processes: kill -9 of a storage node under load, kill -9 of every
node, SIGSTOP filling the window. Each starts its own cluster with fsync=always."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from seqlog_cluster_support import metric

from seqlog import Client
from services import local_cluster as lc
from shared.config import SequencerConfig, StorageConfig
from shared.status import LogError, Status
from shared.types import LSN_MAX, LogId, Lsn
from shared.wire.store import RecordFlags
from storage_node.record_store import RecordStore

pytestmark = pytest.mark.integration

READY_TIMEOUT_MS = 60_000


def _start(root: Path, *, replication: int, **spec: object) -> lc.ClusterState:
    return lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=2, replication=replication,
        base_port=lc.free_base_port(5), fsync="always", **spec),  # type: ignore[arg-type]
        ready_timeout_ms=READY_TIMEOUT_MS)


def _node(state: lc.ClusterState, node_id: str) -> lc.NodeEntry:
    return next(n for n in state.nodes if n.node_id == node_id)


_metric = metric


async def _poll(predicate_async: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate_async():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _read_all(client: Client, log_id: int, until_lsn: int) -> dict[int, bytes]:
    """Every record from the start through ``until_lsn``, checking order and coverage."""
    records: dict[int, bytes] = {}
    cursor = 1
    while cursor <= until_lsn:
        result = await client.read(log_id, cursor, limit=1000, wait_ms=2000)
        covered = sorted([(r.lsn, r.lsn) for r in result.records]
                         + [(g.lo, g.hi) for g in result.gaps])
        for lo, hi in covered:
            assert lo == cursor, f"coverage broken at {cursor}: {covered[:3]}"
            cursor = hi + 1
        assert cursor == result.next_lsn
        assert result.next_lsn - 1 <= result.release_lsn
        records.update((r.lsn, r.payload) for r in result.records)
        assert result.records or result.gaps, f"no progress at {cursor}"
    return records


async def _append_load(
    client: Client, log_id: int, stop: asyncio.Event, acked: dict[int, bytes],
    workers: int = 8,
) -> int:
    """Append until ``stop``; record every acknowledged (lsn, payload). Returns errors seen."""
    errors = 0

    async def worker(w: int) -> None:
        nonlocal errors
        i = 0
        while not stop.is_set():
            payload = f"w{w}-{i}-".encode() + os.urandom(8).hex().encode()
            i += 1
            try:
                result = await client.append(log_id, payload)
            except LogError:
                errors += 1
                continue
            acked[result.lsn] = payload

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return errors


async def test_kill9_storage_node_under_load_loses_nothing(cluster_dir: Path) -> None:
    state = _start(cluster_dir, replication=2)
    victim = _node(state, "st2")
    acked: dict[int, bytes] = {}
    stop = asyncio.Event()
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        load = asyncio.create_task(_append_load(client, 1, stop, acked))
        await _poll(lambda: _true_after(len(acked) >= 200), 30, "200 acks before the kill")
        os.kill(victim.pid, signal.SIGKILL)
        at_kill = len(acked)
        # Appends go on through new waves that avoid the dead node.
        await _poll(lambda: _true_after(len(acked) >= at_kill + 300), 60,
                    "300 more acks with st2 dead")
        stores_before = 0.0
        await asyncio.to_thread(lc.restart, cluster_dir, "st2")
        restarted = _node(lc.load_state(cluster_dir) or state, "st2")
        stores_before = _metric(restarted.http, "seqlog_storage_stores")
        # Peers hold a restarted node SUSPECT (unused) for suspect_duration_ms (10 s) first.
        await _poll(lambda: _true_after(
            _metric(restarted.http, "seqlog_storage_stores") > stores_before + 50), 90,
            "the restarted node to take STOREs again")
        stop.set()
        await load
        last = max(acked)
        await _poll(lambda: _released(client, 1, last), 20, "release of the last ack")
        found = await _read_all(client, 1, last)
    missing = [lsn for lsn in acked if found.get(lsn) != acked[lsn]]
    assert not missing, f"{len(missing)} acknowledged records lost or changed"
    assert len(set(found.values())) == len(found), "an LSN names a payload twice"


async def _true_after(value: bool) -> bool:
    return value


async def _released(client: Client, log_id: int, lsn: int) -> bool:
    return (await client.tail(log_id)).release_lsn >= lsn


async def _open_when_free(data_dir: str, timeout_s: float = 10.0) -> RecordStore:
    """The record store of a node killed with -9, opened once the dying process let go of
    its directory lock (its last thread may still be exiting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        store = RecordStore(data_dir=data_dir, config=StorageConfig(fsync="never",
                                                                    disk_free_bytes_min=0))
        try:
            await store.open()
            return store
        except LogError as error:  # (a failed open has stopped its threads itself)
            if error.status is not Status.EXISTS or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def _copies_on_disk(state: lc.ClusterState, log_id: int) -> dict[int, list[bytes]]:
    """Every record copy each storage node's files hold for the log, released or not, read
    with the node's own record store while the node is down (a running node serves no copy
    above its release pointer, whatever a READ carries)."""
    copies: dict[int, list[bytes]] = {}
    for node in state.nodes:
        if "storage" not in node.roles:
            continue
        store = await _open_when_free(node.data_dir)
        try:
            cursor = 1
            while True:
                found = await store.read_copies(LogId(log_id), Lsn(cursor), Lsn(LSN_MAX - 1),
                                                1000, 1 << 24)
                assert found.status is Status.OK, found.status
                for lsn, _, _, payload, flags, _, _ in found.copies:
                    if not flags & RecordFlags.HOLE:
                        copies.setdefault(lsn, []).append(payload)
                if not found.copies:
                    break
                cursor = found.next_lsn
        finally:
            await store.close()
    return copies


async def test_kill9_every_node_keeps_acknowledged_records(cluster_dir: Path) -> None:
    state = _start(cluster_dir, replication=3)
    acked: dict[int, dict[int, bytes]] = {1: {}, 2: {}, 3: {}}
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        for log_id, log_acked in acked.items():
            for i in range(150):
                payload = f"log{log_id}-{i}".encode()
                if i % 10 == 0:
                    batch = await client.append_batch(log_id, [payload + b"-a", payload + b"-b"])
                    log_acked[batch.first_lsn] = payload + b"-a"
                    log_acked[batch.last_lsn] = payload + b"-b"
                else:
                    log_acked[(await client.append(log_id, payload)).lsn] = payload
    for node in state.nodes:
        os.kill(node.pid, signal.SIGKILL)
    for log_id, log_acked in acked.items():
        # Durable: every acknowledged record is on all R=3 nodes with its payload.
        copies = await _copies_on_disk(state, log_id)
        for lsn, payload in log_acked.items():
            assert copies.get(lsn) == [payload] * 3, f"log {log_id} lsn {lsn}"
    for node in state.nodes:
        await asyncio.to_thread(lc.restart, cluster_dir, node.node_id)
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        for log_id, log_acked in acked.items():
            # The restarted sequencer takes a higher epoch, recovers the crashed one and
            # releases again: every acknowledged record reads back, including those whose
            # RELEASE had not reached any storage node before the crash.
            result = await client.append(log_id, b"after restart")
            assert result.lsn >> 32 > max(log_acked) >> 32
            await _poll(lambda: _released(client, log_id, result.lsn),  # noqa: B023
                        30, "release after recovery")
            found = await _read_all(client, log_id, result.lsn)
            assert found == {**log_acked, result.lsn: b"after restart"}
    # Operators see it: every log's recovery ran to its end once.
    sequencers = [n for n in state.nodes if "sequencer" in n.roles]
    done = sum(_metric(n.http, 'seqlog_sequencer_recovery_phases{phase="DONE"}')
               for n in sequencers)
    assert done == len(acked)
    assert sum(_metric(n.http, "seqlog_sequencer_logs_recovering") for n in sequencers) == 0


async def test_full_window_answers_429_and_writes_nothing(cluster_dir: Path) -> None:
    state = _start(cluster_dir, replication=3,
                   sequencer=SequencerConfig(window_appends_max=2, append_timeout_ms=60_000))
    url = state.sequencer_urls[0]
    async with Client(state.sequencer_urls) as client:
        first = await client.append(5, b"warm-up")  # activates the sequencer
        owner = (await client.tail(5)).sequencer
    owner_url = next(f"http://{n.http}" for n in state.nodes if n.node_id == owner)
    stopped = _node(state, "st3")
    os.kill(stopped.pid, signal.SIGSTOP)  # R=3 of 3: nothing can complete now
    try:
        async with aiohttp.ClientSession() as session:
            # One at a time: appends arriving together would share one appender (one slot).
            stuck = []
            for in_flight in (1, 2):
                stuck.append(asyncio.create_task(session.post(
                    f"{owner_url}/v1/logs/5/append", json={"payload": "c3R1Y2s="})))
                await _poll(lambda: _in_flight_at_least(owner_url, in_flight), 10,  # noqa: B023
                            f"{in_flight} appends in flight")
            async with session.post(f"{owner_url}/v1/logs/5/append",
                                    json={"payload": "cmVqZWN0ZWQ="}) as response:
                body = json.loads(await response.read())
                assert response.status == 429, body
                assert body["status"] == "SEQNOBUFS" and body["message"]
                assert int(response.headers["Retry-After"]) >= 1
            os.kill(stopped.pid, signal.SIGCONT)
            responses = await asyncio.gather(*stuck)
            assert [r.status for r in responses] == [200, 200]
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    async with Client([url]) as client:
        await _poll(lambda: _released(client, 5, first.lsn + 2), 20, "release")
        found = await _read_all(client, 5, first.lsn + 2)
    assert b"rejected" not in found.values()
    assert sorted(found.values()) == [b"stuck", b"stuck", b"warm-up"]


async def _in_flight_at_least(owner_url: str, count: int) -> bool:
    host = owner_url.removeprefix("http://")
    return _metric(host, "seqlog_sequencer_appends_in_flight") >= count


async def test_acknowledged_append_is_readable_at_once_through_any_node(
        cluster_dir: Path) -> None:
    # R=2 of 3: one storage node is outside each copyset and hears of releases only from the
    # periodic broadcast, so a node that is not the log's sequencer must ask the sequencer.
    state = _start(cluster_dir, replication=2)
    async with Client(state.sequencer_urls) as client:
        first = await client.append(11, b"first")
        owner = (await client.tail(11)).sequencer
        other_url = next(f"http://{n.http}" for n in state.nodes
                         if "sequencer" in n.roles and n.node_id != owner)
        async with Client([other_url]) as reader:
            for i in range(20):
                appended = await client.append(11, b"r%d" % i)
                result = await reader.read(11, appended.lsn, limit=1, wait_ms=0)
                assert [r.payload for r in result.records] == [b"r%d" % i], (i, result)
        assert first.lsn < appended.lsn


async def test_graceful_restart_marks_epoch_clean_and_next_epoch_releases(
        cluster_dir: Path) -> None:
    state = _start(cluster_dir, replication=3)
    async with Client(state.sequencer_urls) as client:
        before = [await client.append(21, b"before %d" % i) for i in range(5)]
        owner = (await client.tail(21)).sequencer
    await asyncio.to_thread(lc.restart, cluster_dir, owner)  # SIGTERM: drain, mark clean
    async with Client(state.sequencer_urls) as client:
        after = await client.append(21, b"after")
        assert after.lsn >> 32 == (before[-1].lsn >> 32) + 1
        await _poll(lambda: _released(client, 21, after.lsn), 10, "release in the new epoch")
        result = await client.read(21, before[0].lsn, limit=100, wait_ms=1000)
    assert [r.payload for r in result.records] == [b"before %d" % i for i in range(5)] + [
        b"after"]
    assert [(g.type, g.lo, g.hi) for g in result.gaps] == [
        ("BRIDGE", before[-1].lsn + 1, (after.lsn >> 32) << 32)]


async def test_readers_never_skip_with_storage_nodes_down(cluster_dir: Path) -> None:
    # R=2 of 3: an f-majority is 2 nodes. One node down: every record is still read (no
    # DATALOSS); two down: the read waits (503 NOTREADY) instead of skipping; one back: the
    # reader goes on from where it was.
    state = _start(cluster_dir, replication=2)
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        written = {(await client.append(9, b"r%d" % i)).lsn: b"r%d" % i for i in range(60)}
        last = max(written)
        await _poll(lambda: _released(client, 9, last), 20, "release")
        os.kill(_node(state, "st1").pid, signal.SIGKILL)
        assert await _read_all(client, 9, last) == written  # checks coverage: no gap at all
        os.kill(_node(state, "st2").pid, signal.SIGKILL)
        with pytest.raises(LogError) as waited:
            await client.read(9, 1, limit=1000, wait_ms=0)
        assert waited.value.status in (Status.NOTREADY, Status.TIMEDOUT)
        await asyncio.to_thread(lc.restart, cluster_dir, "st2")
        assert await _read_all(client, 9, last) == written
