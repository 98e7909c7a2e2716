"""`seqlog local add-node` on a running cluster of processes: a storage node joins and new logs
use it (old ones from their next epoch), a sequencer node joins and takes its share of logs;
nobody else restarts and old logs keep working."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from seqlog_cluster_support import READY_TIMEOUT_MS

from epoch_store import read_log_state
from seqlog import Client, Record
from services import local_cluster as lc
from shared.routing import sequencer_for
from shared.types import LogId, NodeId

pytestmark = pytest.mark.integration


def _add_node(root: Path, role: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "local", "add-node", "--dir", str(root),
         "--role", role], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _cluster(http: str) -> dict[str, str]:
    with urllib.request.urlopen(f"http://{http}/v1/cluster", timeout=5) as resp:
        return {n["node_id"]: n["state"] for n in json.loads(resp.read())["nodes"]}


def _stored_ok(http: str) -> float:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("seqlog_storage_stored_ok "):
                return float(line.split()[1])
    return 0.0


async def _read_payloads(client: Client, log_id: int) -> list[bytes]:
    out: list[bytes] = []
    async with await client.reader(log_id) as reader:
        async for entry in reader:
            if isinstance(entry, Record):
                out.append(entry.payload)
    return out


async def test_nodes_join_a_running_cluster_without_restarts(cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(dir=cluster_dir, storage_nodes=3, sequencers=2,
                                      replication=2, base_port=lc.free_base_port(5),
                                      fsync="never"), ready_timeout_ms=READY_TIMEOUT_MS)
    pids = {n.node_id: n.pid for n in state.nodes}
    old_log, new_log = 21, 22
    async with Client(state.sequencer_urls, timeout_ms=20_000) as client:
        await client.append(old_log, b"old-0")

        assert "added st4 (storage)" in _add_node(cluster_dir, "storage")
        grown = lc.load_state(cluster_dir)
        assert grown is not None
        st4 = next(n for n in grown.nodes if n.node_id == "st4")
        assert {n.node_id: n.pid for n in grown.nodes if n.node_id in pids} == pids
        for node in grown.nodes:
            assert _cluster(node.http).get("st4") == "ALIVE", node.node_id

        # A log provisioned now gets the new node in its nodeset, and it stores copies.
        for i in range(60):
            await client.append(new_log, b"new-%d" % i)
        metadata = (await asyncio.to_thread(read_log_state, grown.epoch_store,
                                            LogId(new_log))).metadata
        assert metadata is not None and "st4" in metadata.nodeset
        assert _stored_ok(st4.http) > 0
        # An existing log takes it at its next epoch (the active sequencer moves as soon as
        # it reaches st4); its first epoch stays on the nodes that hold it.
        deadline = time.monotonic() + 30
        while True:
            old = (await asyncio.to_thread(read_log_state, grown.epoch_store,
                                           LogId(old_log))).metadata
            if old is not None and "st4" in old.nodeset:
                break
            assert time.monotonic() < deadline, f"the old log kept its nodeset: {old}"
            await asyncio.sleep(0.1)
        assert old.nodeset_ranges()[0].nodeset == ("st1", "st2", "st3")
        old_last = (await client.append(old_log, b"old-1")).lsn

        assert "added seq3 (sequencer)" in _add_node(cluster_dir, "sequencer")
        final = lc.load_state(cluster_dir)
        assert final is not None
        assert {n.node_id: n.pid for n in final.nodes if n.node_id in pids} == pids
        weights = [(NodeId(n), 1.0) for n in ("seq1", "seq2", "seq3")]
        seq3_log = next(log for log in range(100, 10_000)
                        if sequencer_for(LogId(log), weights) == "seq3")
        deadline = time.monotonic() + 30
        while True:
            # Any node routes the log to the new sequencer once it reloaded.
            await client.append(seq3_log, b"on-seq3")
            if (await client.tail(seq3_log)).sequencer == "seq3":
                break
            assert time.monotonic() < deadline, "seq3 never took its logs"
            await asyncio.sleep(0.2)

        deadline = time.monotonic() + 30
        while (await client.tail(old_log)).release_lsn < old_last:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert await _read_payloads(client, old_log) == [b"old-0", b"old-1"]
        assert await _read_payloads(client, new_log) == [b"new-%d" % i for i in range(60)]
