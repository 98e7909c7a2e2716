"""The HTTP records long poll on a node that does not sequence the log rides the storage
nodes' own long poll: the storage nodes hold the READ (no polling loop on the serving node,
no sequencer round trip per round), and a record appended meanwhile arrives promptly."""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import aiohttp
import orjson
import pytest
from seqlog_cluster_support import RunningCluster

pytestmark = pytest.mark.integration

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=30)
HOLD_DEADLINE_S = 10.0
DELIVERY_DEADLINE_S = 2.0
"""From the acknowledgement of the append to the long poll's answer: milliseconds normally;
the long poll waits up to 20 s, so only delivery can end it within this bound."""


async def _storage_counts(session: aiohttp.ClientSession, cluster: RunningCluster,
                          ) -> dict[str, int]:
    """``reads_waiting`` and ``read_messages`` summed over the storage nodes."""
    totals = {"reads_waiting": 0, "read_messages": 0}
    for node in cluster.state.nodes:
        if "storage" not in node.roles:
            continue
        async with session.get(f"http://{node.http}/metrics") as resp:
            text = await resp.text()
        for line in text.splitlines():
            for name in totals:
                if line.startswith(f"seqlog_storage_{name} "):
                    totals[name] += int(float(line.split()[1]))
    return totals


async def test_follower_on_a_non_sequencer_node_rides_the_storage_long_poll(
    local_cluster: RunningCluster,
) -> None:
    log_id = int.from_bytes(os.urandom(4), "big") + 3_000_000_000
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        seq_urls = local_cluster.sequencer_urls

        async def append(payload: bytes) -> tuple[int, str]:
            body = orjson.dumps({"payload": base64.b64encode(payload).decode()})
            async with session.post(f"{seq_urls[0]}/v1/logs/{log_id}/append", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200, await resp.text()
                doc: dict[str, Any] = await resp.json()
                return doc["lsn"], resp.headers["X-Seqlog-Sequencer"]

        first_lsn, owner = await append(b"first")
        reader = next(n for n in local_cluster.state.nodes
                      if "sequencer" in n.roles and n.node_id != owner)
        url = f"http://{reader.http}/v1/logs/{log_id}/records"
        # Caught up: the record is there at once.
        async with session.get(url, params={"from": str(first_lsn), "wait_ms": "5000"}) as resp:
            assert [r["lsn"] for r in (await resp.json())["records"]] == [first_lsn]

        before = await _storage_counts(session, local_cluster)
        follow = loop.create_task(session.get(
            url, params={"from": str(first_lsn + 1), "wait_ms": "20000"}))
        # The storage nodes hold the READ: the serving node is not polling them.
        deadline_s = loop.time() + HOLD_DEADLINE_S
        while (held := await _storage_counts(session, local_cluster))["reads_waiting"] < 3:
            assert loop.time() < deadline_s, f"the storage nodes never held the READ: {held}"
            await asyncio.sleep(0.02)
        assert not follow.done()

        second_lsn, _ = await append(b"second")
        acked_s = loop.time()
        async with asyncio.timeout(DELIVERY_DEADLINE_S):
            resp = await follow
            doc = await resp.json()
        delivered_s = loop.time() - acked_s
        resp.release()
        after = await _storage_counts(session, local_cluster)
    assert resp.status == 200, doc
    assert [r["lsn"] for r in doc["records"]] == [second_lsn]
    assert doc["release_lsn"] >= second_lsn
    assert delivered_s < DELIVERY_DEADLINE_S
    # One long-poll round (a READ per storage node), maybe one more after the release moved;
    # a 20 ms poll loop would have sent a READ round every 20 ms while the append waited.
    reads = after["read_messages"] - before["read_messages"]
    assert reads <= 12, f"{reads} READs for one long poll"
