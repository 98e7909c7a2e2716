"""Draining a storage node moves logs to a new nodeset (issue 17 item 4, done-when 1e), on
real processes: 4 storage nodes, 2 sequencers, R=2, appends running throughout.

``seqlog node drain st4``: the sequencers finish their epochs and take new ones on a nodeset
without st4 (recorded in the epoch store with the epoch range each nodeset served); new
appends never reach st4; its copies of the earlier epochs are re-replicated to the others.
Then it is removed and killed, and everything reads back identically through both HTTP
front ends and the direct reader, with R copies on the remaining nodes. Finally a second
storage node is killed: the epochs st4 held are now read from the three remaining nodes
(f-majority 2 of 3), so reads still complete; with st4 still counted in their nodeset they
would need 3 answers of the 2 nodes alive and never finish."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from epoch_store.factory import read_log_state
from seqlog import Client, Record
from services import local_cluster as lc
from services.cli import main as cli_main
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
    _shard,
    _under_load,
)

pytestmark = pytest.mark.integration


def _start(root: Path, *, with_zookeeper: bool = False) -> lc.ClusterState:
    return lc.up(lc.LocalClusterSpec(
        dir=root, storage_nodes=4, sequencers=2, replication=REPLICATION,
        base_port=lc.free_base_port(6), fsync="always", with_zookeeper=with_zookeeper),
        ready_timeout_ms=READY_TIMEOUT_MS)


def _ranges(state: lc.ClusterState, log_id: int) -> list[tuple[int, tuple[str, ...]]]:
    """(first epoch, nodeset) of each epoch range the epoch store records for the log."""
    meta = read_log_state(state.epoch_store, LogId(log_id)).metadata
    assert meta is not None
    return [(r.first_epoch, tuple(r.nodeset)) for r in meta.nodeset_ranges()]


@pytest.mark.parametrize("store", ["file", "zookeeper"])
async def test_drained_node_leaves_the_nodesets_and_everything_reads_back(
        cluster_dir: Path, store: str) -> None:
    # The epoch metadata (with its nodeset ranges) and the cluster state live in the file
    # store or in a real ZooKeeper server.
    state = _start(cluster_dir, with_zookeeper=store == "zookeeper")
    acked: dict[int, dict[int, bytes]] = {log_id: {} for log_id in LOGS}
    exits = contextlib.AsyncExitStack()
    early = await exits.enter_async_context(Client(state.sequencer_urls, timeout_ms=20_000))
    await early.append(LOGS[0], b"before the drain")
    # A direct reader made before the drain: its spans still count st4. Its read-ahead stops
    # it early; it is read to the end only after st4 and st1 are gone, when it must fetch the
    # nodesets again to get on (``LogReader._refresh_spans``).
    old_reader = await exits.enter_async_context(await early.reader(
        LOGS[0], 1, follow=True, read_ahead_records_max=50, stall_timeout_ms=30_000))
    st1 = _node(cluster_dir, "st1").http
    everyone = ("st1", "st2", "st3", "st4")

    def cli(*argv: str) -> int:
        return cli_main([*argv, "--dir", str(cluster_dir)])

    async def drain() -> None:
        assert await asyncio.to_thread(cli, "node", "drain", "st4") == 0

        async def moved() -> bool:
            ranges = [await asyncio.to_thread(_ranges, state, log_id) for log_id in LOGS]
            return all(r[-1][1] == ("st1", "st2", "st3") for r in ranges)

        # The active sequencers move at once (not at some later activation).
        await _poll(moved, 30, "both logs on a nodeset without st4")

    await _under_load(state, acked, drain)
    new_since = {}
    for log_id in LOGS:
        ranges = await asyncio.to_thread(_ranges, state, log_id)
        assert ranges[0] == (1, everyone) and len(ranges) == 2, ranges
        new_since[log_id] = ranges[-1][0]
        newer = [lsn for lsn in acked[log_id] if lsn_to_epoch(lsn) >= new_since[log_id]]
        assert len(newer) > 50, f"log {log_id}: few appends in the new nodeset's epochs"

    async def drained() -> bool:
        shard = await asyncio.to_thread(_shard, st1, "st4")
        return bool(shard["status"] == "DRAINED")

    await _poll(drained, 120, "st4 drained")
    # st4 holds nothing of the epochs that took the new nodeset.
    for log_id in LOGS:
        on_st4 = await _copies_over_protocol(st1, log_id, max(acked[log_id]),
                                             skip=("st1", "st2", "st3"))
        assert on_st4, "st4 should still hold copies of the earlier epochs"
        assert not [lsn for lsn in on_st4 if lsn_to_epoch(lsn) >= new_since[log_id]]
    assert await asyncio.to_thread(cli, "node", "remove", "st4") == 0
    os.kill(_node(cluster_dir, "st4").pid, signal.SIGKILL)
    await _under_load(state, acked, lambda: asyncio.sleep(0))
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        await _check_everything(cluster_dir, state, client, acked, skip=("st4",))

    # One more storage node down: the earlier epochs (once on st1-st4) read from st1-st3.
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
    last = max(acked[LOGS[0]])
    seen: dict[int, bytes] = {}

    async def read_old() -> None:
        async for entry in old_reader:
            if isinstance(entry, Record):
                seen[entry.lsn] = entry.payload
            if (entry.lsn if isinstance(entry, Record) else entry.hi) >= last:
                return

    await asyncio.wait_for(read_old(), 60)
    assert all(seen.get(lsn) == payload for lsn, payload in acked[LOGS[0]].items())
    await exits.aclose()
