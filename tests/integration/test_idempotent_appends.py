"""Idempotent appends on real node processes (API.md: ``producer_id``/``producer_seq``): a
retry of a pair gets the original LSNs through any node, after kill -9 of the log's sequencer
(the new one looks the producer up on the storage nodes), and after kill -9 of every node (the
storage nodes rebuild their producer index from the segment files). The log holds each payload
once."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from seqlog import Client
from services import local_cluster as lc
from shared.limits import PRODUCER_SEQS_KEPT
from shared.status import LogError, Status
from tests.integration.seqlog_cluster_support import metric, poll

pytestmark = pytest.mark.integration

LOG = 31
READY_TIMEOUT_MS = 60_000


async def _payloads(client: Client, until_lsn: int) -> list[bytes]:
    """Every record of LOG through ``until_lsn``, in order (waits for the release)."""
    await poll(lambda: _released(client, until_lsn), 30, "release")
    out: list[bytes] = []
    cursor = 1
    while cursor <= until_lsn:
        result = await client.read(LOG, cursor, limit=1000, wait_ms=1000)
        out.extend(r.payload for r in result.records if r.lsn <= until_lsn)
        cursor = result.next_lsn
    return out


_metric = metric


async def _released(client: Client, lsn: int) -> bool:
    return (await client.tail(LOG)).release_lsn >= lsn


async def _post_json(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v1/logs/{LOG}/append", json=body,
            timeout=aiohttp.ClientTimeout(total=30)) as response:
        return response.status, await response.json()


async def test_retries_get_the_original_lsns_across_failover_and_restart(
        cluster_dir: Path) -> None:
    state = lc.up(lc.LocalClusterSpec(
        dir=cluster_dir, storage_nodes=3, sequencers=2, replication=2,
        base_port=lc.free_base_port(5), fsync="always"), ready_timeout_ms=READY_TIMEOUT_MS)
    urls = state.sequencer_urls
    async with Client(urls, timeout_ms=20_000) as client:
        first = await client.append(LOG, b"one", producer_id="pA", producer_seq=1)
        batch = await client.append_batch(LOG, [b"two", b"three"], producer_id="pA",
                                          producer_seq=2)
        plain = await client.append(LOG, b"plain")
        # A retry through every node (JSON over curl-like HTTP too) gets the same answer.
        for url in urls:
            status, body = await _post_json(url, {"payload": base64.b64encode(b"one").decode(),
                                                  "producer_id": "pA", "producer_seq": 1})
            assert (status, body["lsn"]) == (200, first.lsn), body
        again = await client.append_batch(LOG, [b"two", b"three"], producer_id="pA",
                                          producer_seq=2)
        assert (again.first_lsn, again.last_lsn) == (batch.first_lsn, batch.last_lsn)
        # Concurrent retries of a new pair share one write.
        racing = await asyncio.gather(*(client.append(LOG, b"four", producer_id="pA",
                                                      producer_seq=3) for _ in range(5)))
        assert len({r.lsn for r in racing}) == 1
        owner = (await client.tail(LOG)).sequencer
    assert owner is not None

    # kill -9 the log's sequencer: the other node takes the log in a new epoch, recovers the
    # old one and must look producer pA up on the storage nodes.
    victim = next(n for n in state.nodes if n.node_id == owner)
    os.kill(victim.pid, signal.SIGKILL)
    survivor = next(f"http://{n.http}" for n in state.nodes
                    if "sequencer" in n.roles and n.node_id != owner)
    async with Client([survivor], timeout_ms=20_000) as client:
        retried = await client.append(LOG, b"one", producer_id="pA", producer_seq=1)
        assert retried.lsn == first.lsn
        retried_batch = await client.append_batch(LOG, [b"two", b"three"], producer_id="pA",
                                                  producer_seq=2)
        assert retried_batch.first_lsn == batch.first_lsn
        assert (await client.append(LOG, b"four", producer_id="pA",
                                    producer_seq=3)).lsn == racing[0].lsn
        fifth = await client.append(LOG, b"five", producer_id="pA", producer_seq=4)
        assert fifth.lsn >> 32 > first.lsn >> 32  # written by the new epoch
        assert await _payloads(client, fifth.lsn) == [
            b"one", b"two", b"three", b"plain", b"four", b"five"]
        assert _metric(survivor, 'seqlog_sequencer_producer_lookups{result="ok"}') == 1
    await asyncio.to_thread(lc.restart, cluster_dir, owner, ready_timeout_ms=READY_TIMEOUT_MS)

    # kill -9 every node and restart: the producer index comes back from the segments.
    state = lc.load_state(cluster_dir)
    assert state is not None
    for node in state.nodes:
        os.kill(node.pid, signal.SIGKILL)
    for node in state.nodes:
        await asyncio.to_thread(lc.restart, cluster_dir, node.node_id,
                                ready_timeout_ms=READY_TIMEOUT_MS)
    async with Client(urls, timeout_ms=20_000) as client:
        assert (await client.append(LOG, b"five", producer_id="pA",
                                    producer_seq=4)).lsn == fifth.lsn
        assert (await client.append(LOG, b"one", producer_id="pA",
                                    producer_seq=1)).lsn == first.lsn
        # Past the remembered window a pair cannot be told apart: STALE, nothing written.
        for seq in range(5, 5 + PRODUCER_SEQS_KEPT):
            last = await client.append(LOG, b"n%d" % seq, producer_id="pA", producer_seq=seq)
        with pytest.raises(LogError) as stale:
            await client.append(LOG, b"one", producer_id="pA", producer_seq=1)
        assert stale.value.status is Status.STALE
        payloads = await _payloads(client, last.lsn)
    assert payloads == [b"one", b"two", b"three", b"plain", b"four", b"five",
                        *(b"n%d" % seq for seq in range(5, 5 + PRODUCER_SEQS_KEPT))]
    assert plain.lsn < fifth.lsn
