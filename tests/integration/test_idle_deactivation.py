"""Idle sequencers are deactivated and come back without recovery (issue 15): real node
processes, the real file epoch store, `seqlog.Client` appends and reads."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from seqlog_cluster_support import metric

from epoch_store import open_epoch_store
from seqlog import Client
from services import local_cluster as lc
from shared.config import SequencerConfig
from shared.status import Status
from shared.types import LogId

pytestmark = pytest.mark.integration

LOGS = list(range(1, 51))
IDLE_DEACTIVATE_MS = 500


def _metric(http: str, name: str) -> float:
    return metric(http, name, 0.0)


async def _until(predicate_name: str, http: str, want: float, timeout_s: float) -> float:
    deadline_s = time.monotonic() + timeout_s
    while True:
        value = await asyncio.to_thread(_metric, http, predicate_name)
        if value == want or time.monotonic() > deadline_s:
            return value
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_idle_logs_are_deactivated_clean_and_come_back_without_recovery(
        cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never",
        sequencer=SequencerConfig(idle_deactivate_ms=IDLE_DEACTIVATE_MS)),
        ready_timeout_ms=60_000)
    sequencer = next(n for n in state.nodes if "sequencer" in n.roles)
    async with Client(state.sequencer_urls, timeout_ms=30_000) as client:
        first = {log: await client.append(log, b"first") for log in LOGS}
        assert await _until("seqlog_sequencer_logs", sequencer.http, 0, 30) == 0
        assert _metric(sequencer.http, "seqlog_sequencer_idle_deactivations") == len(LOGS)
        store = open_epoch_store(state.epoch_store)
        try:
            for log in LOGS:
                status, lce = await store.get_last_clean_epoch(LogId(log))
                assert status is Status.OK and lce is not None
                assert (lce.epoch, lce.tail_lsn) == (first[log].lsn >> 32, first[log].lsn)
        finally:
            await store.close()
        for log in LOGS:
            again = await client.append(log, b"again")
            assert again.lsn >> 32 == (first[log].lsn >> 32) + 1, (log, again)
            result = await client.read(log, limit=10)
            assert [(r.lsn, r.payload) for r in result.records] == [
                (first[log].lsn, b"first"), (again.lsn, b"again")]
    recoveries = _metric(sequencer.http, 'seqlog_sequencer_recovery_phases{phase="SEALING"}')
    assert recoveries == 0
