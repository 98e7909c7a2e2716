"""Appends to many logs on real node processes (issue 15): ``seqlog.Client`` sends the single
appends of one loop iteration to many logs as APPEND_MULTI frames (protocol version 3), the
sequencer's appenders of those logs share their first waves, and every record reads back in
order in its own log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from seqlog_cluster_support import metric

from seqlog import Client
from services import local_cluster as lc

pytestmark = pytest.mark.integration

LOGS = list(range(1, 301))
ROUNDS = 3


@pytest.mark.timeout(180)
async def test_appends_to_many_logs_share_frames_and_waves_and_read_back(
        cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never"), ready_timeout_ms=60_000)
    sequencer = next(n for n in state.nodes if "sequencer" in n.roles)
    async with Client(state.sequencer_urls, timeout_ms=30_000) as client:
        await client.append(LOGS[0], b"warm")  # learns the cluster, opens the connection
        binary = client._binary
        assert binary is not None
        frames_before = binary.connections.counters.frames_sent
        written: dict[int, list[tuple[int, bytes]]] = {log: [] for log in LOGS}
        for round_index in range(ROUNDS):
            payloads = {log: b"%d:%d" % (log, round_index) for log in LOGS}
            results = await asyncio.gather(*(client.append(log, payloads[log])
                                             for log in LOGS))
            for log, result in zip(LOGS, results, strict=True):
                written[log].append((result.lsn, payloads[log]))
        # Appends of one loop iteration to many logs: a few frames, not one per append.
        frames = binary.connections.counters.frames_sent - frames_before
        assert frames <= 3 * ROUNDS, frames
        for log in LOGS:
            result = await client.read(log, limit=10)
            records = [(r.lsn, r.payload) for r in result.records]
            assert records[-ROUNDS:] == written[log], log
    completed = await asyncio.to_thread(
        metric, sequencer.http, 'seqlog_sequencer_shared_waves{result="completed"}')
    assert completed >= ROUNDS - 1  # the first round's logs were not active yet
