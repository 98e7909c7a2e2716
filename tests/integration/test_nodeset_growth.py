"""A storage node added to a running cluster joins existing logs' nodesets (issue 17 item 4,
nodeset changes), on real processes: 3 storage nodes, 2 sequencers, R=2, ``nodeset_size`` 4,
appends running throughout.

``seqlog local add-node`` starts st4 and sends every other node SIGHUP with the new config:
the active sequencers finish their epochs and take new ones on a nodeset with st4 (recorded in
the epoch store beside the earlier epochs' nodeset); the new epochs' copies land on st4; and
every acknowledged record reads back identically through both HTTP front ends (which cached
the log's metadata before the growth) and two direct readers, one made before the growth
(its spans end at the epochs handed out then, so it fetches the nodesets again to read on).
Finally st1 is killed: the new epochs are read from an f-majority of st1-st4 (3 of 4) that
must include st4, and still read back. Without the growth, st4 holds nothing and the
nodesets never change."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from epoch_store.factory import read_log_state
from seqlog import Client, Record
from services import local_cluster as lc
from services.local_membership import add_node
from shared.types import LogId, lsn_to_epoch
from tests.integration.test_disk_replacement import (
    LOGS,
    READY_TIMEOUT_MS,
    REPLICATION,
    _check_everything,
    _copies_over_protocol,
    _http_view,
    _node,
    _poll,
    _reader_view,
    _under_load,
)

pytestmark = pytest.mark.integration

OLD = ("st1", "st2", "st3")
COPIES_ON_ST4 = 200
"""Record copies st4 must have stored (over both logs) before the load stops."""
GROWN = ("st1", "st2", "st3", "st4")


def _stored_ok(http: str) -> float:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("seqlog_storage_stored_ok "):
                return float(line.split()[1])
    return 0.0


def _ranges(state: lc.ClusterState, log_id: int) -> list[tuple[int, tuple[str, ...]]]:
    """(first epoch, nodeset) of each epoch range the epoch store records for the log."""
    meta = read_log_state(state.epoch_store, LogId(log_id)).metadata
    assert meta is not None
    return [(r.first_epoch, tuple(r.nodeset)) for r in meta.nodeset_ranges()]


@pytest.mark.parametrize("store", ["file", "zookeeper"])
async def test_an_added_storage_node_joins_the_nodesets_and_everything_reads_back(
        cluster_dir: Path, store: str) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=REPLICATION,
        nodeset_size=4, base_port=lc.free_base_port(5), fsync="always",
        with_zookeeper=store == "zookeeper"), ready_timeout_ms=READY_TIMEOUT_MS)
    acked: dict[int, dict[int, bytes]] = {log_id: {} for log_id in LOGS}
    exits = contextlib.AsyncExitStack()
    early = await exits.enter_async_context(Client(state.sequencer_urls, timeout_ms=20_000))
    for log_id in LOGS:
        acked[log_id][(await early.append(log_id, b"before the growth")).lsn] = (
            b"before the growth")
        # Both front ends cache the log's metadata now, before the nodeset grows.
        for url in state.sequencer_urls:
            await _http_view(url, log_id, max(acked[log_id]))
    # A direct reader made before the growth: its read-ahead stops it early; it reads the
    # rest only after the growth, past the epochs its spans cover.
    old_reader = await exits.enter_async_context(await early.reader(
        LOGS[0], 1, follow=True, read_ahead_records_max=50, stall_timeout_ms=30_000))
    for log_id in LOGS:
        assert await asyncio.to_thread(_ranges, state, log_id) == [(1, OLD)]

    async def grow() -> None:
        entry = await asyncio.to_thread(add_node, cluster_dir, "storage",
                                        ready_timeout_ms=READY_TIMEOUT_MS)
        assert entry.node_id == "st4"

        async def grown() -> bool:
            ranges = [await asyncio.to_thread(_ranges, state, log_id) for log_id in LOGS]
            return all(r[-1][1] == GROWN for r in ranges)

        # The active sequencers move at once (not at some later activation).
        await _poll(grown, 30, "both logs on a nodeset with st4")
        st4 = _node(cluster_dir, "st4").http

        async def stored_on_st4() -> bool:
            return await asyncio.to_thread(_stored_ok, st4) >= COPIES_ON_ST4

        # The load goes on until the new epochs' copysets have put copies on st4 (a new
        # node's first STOREs may be slow, and a slow node is graylisted for a while).
        await _poll(stored_on_st4, 60, f"{COPIES_ON_ST4} copies stored on st4")

    await _under_load(state, acked, grow)
    state = lc.load_state(cluster_dir) or state
    new_since = {}
    for log_id in LOGS:
        ranges = await asyncio.to_thread(_ranges, state, log_id)
        assert ranges[0] == (1, OLD) and ranges[-1][1] == GROWN and len(ranges) == 2, ranges
        new_since[log_id] = ranges[-1][0]
        newer = [lsn for lsn in acked[log_id] if lsn_to_epoch(lsn) >= new_since[log_id]]
        assert len(newer) > 50, f"log {log_id}: few appends in the grown nodeset's epochs"

    st1 = _node(cluster_dir, "st1").http
    for log_id in LOGS:
        last = max(acked[log_id])
        on_st4 = await _copies_over_protocol(st1, log_id, last, skip=OLD)
        # Copies of the new epochs' records, and nothing of the epochs before it joined.
        assert len(on_st4) >= COPIES_ON_ST4 // 4, len(on_st4)
        newer = [lsn for lsn in acked[log_id] if lsn_to_epoch(lsn) >= new_since[log_id]]
        print(f"log {log_id}: {len(on_st4)} of {len(newer)} records of the grown epochs "
              "have a copy on st4")
        assert all(lsn_to_epoch(lsn) >= new_since[log_id] for lsn in on_st4)

    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        # Both HTTP paths (metadata cached before the growth), a new direct reader, and R
        # copies of every record over the node protocol.
        await _check_everything(cluster_dir, state, client, acked)

    last0 = max(acked[LOGS[0]])
    seen: dict[int, bytes] = {}

    async def read_old() -> None:
        async for entry in old_reader:
            if isinstance(entry, Record):
                seen[entry.lsn] = entry.payload
            if (entry.lsn if isinstance(entry, Record) else entry.hi) >= last0:
                return

    await asyncio.wait_for(read_old(), 60)
    assert all(seen.get(lsn) == payload for lsn, payload in acked[LOGS[0]].items())

    # One of the first nodes down: an f-majority of the grown nodeset includes st4, which
    # alone holds one of the two copies of many records.
    os.kill(_node(cluster_dir, "st1").pid, signal.SIGKILL)
    for log_id in LOGS:
        last = max(acked[log_id])
        views = [await asyncio.wait_for(_http_view(url, log_id, last), 60)
                 for url in state.sequencer_urls]
        views.append(await asyncio.wait_for(_reader_view(state.sequencer_urls, log_id, last),
                                            60))
        for other in views[1:]:
            assert other == views[0], f"log {log_id}: two paths answered differently"
        records = {lo: payload for kind, lo, _, payload in views[0] if kind == "R"}
        lost = [lsn for lsn, payload in acked[log_id].items() if records.get(lsn) != payload]
        assert not lost, f"log {log_id}: {len(lost)} acknowledged records lost or changed"
    await exits.aclose()
