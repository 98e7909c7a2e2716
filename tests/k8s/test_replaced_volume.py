"""A storage pod whose PersistentVolume is replaced, on the dev overlay run as "pods on one
machine" (see pods_on_one_machine.py): under append load through the client Service, the pod
is deleted (SIGTERM, as ``kubectl delete pod``), its claim is replaced by a new, empty one (a
lost or re-provisioned volume), and the StatefulSet starts it again. docs/DEPLOY.md ("Replace
a disk") says this needs nothing from the operator; checked here:

- the node finds a new disk (no identity marker) while the cluster state in ZooKeeper says its
  shard held data: it writes a marker of a new generation and its shard is REBUILDING;
- the other storage pods rebuild its copies and the shard becomes AUTHORITATIVE again;
- every acknowledged record reads back through the Service, with no DATALOSS gap, also after
  another storage pod is then stopped (so the records that pod shared with the replaced one
  are read from the rebuilt copies: R=2 on 3 storage pods).
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from k8s_support import render
from pods_on_one_machine import PodError, PodsOnOneMachine
from test_pods_on_one_machine import (
    READY_TIMEOUT_S,
    AppendLoad,
    _auth_headers,
    _get,
    _read_log,
    _wait_views,
)

WRITERS = 4
ACKS_BEFORE = 300
"""Appends acknowledged before the pod is deleted: records the replaced disk held."""
ACKS_AFTER = 200
REBUILD_TIMEOUT_S = 90.0


@pytest.fixture
def dev_pods(tmp_path: Path) -> Iterator[PodsOnOneMachine]:
    pods = PodsOnOneMachine(copy.deepcopy(render("overlays/dev")), tmp_path)
    try:
        pods.start_all(timeout_s=READY_TIMEOUT_S)
    except PodError as exc:
        pods.close()
        pytest.fail(f"pods did not start:\n{exc}", pytrace=False)
    try:
        yield pods
    finally:
        pods.close()


async def _shard(session: aiohttp.ClientSession, http: str, node: str) -> dict[str, Any]:
    shards = (await _get(session, f"http://{http}/v1/cluster"))["shards"]
    found: dict[str, Any] = next(s for s in shards if s["node_id"] == node)
    return found


async def test_a_replaced_volume_is_detected_and_rebuilt_and_nothing_is_lost(
        dev_pods: PodsOnOneMachine) -> None:
    pods = dev_pods
    sequencers = pods.by_component("sequencer")
    storage = pods.by_component("storage")
    seqlog = sequencers + storage
    replaced = storage[1]
    load = AppendLoad(endpoints=[p.http for p in sequencers])
    started_s = time.monotonic()
    async with aiohttp.ClientSession(headers=_auth_headers()) as session:
        before = await _shard(session, sequencers[0].http, replaced.name)
        writers = [asyncio.create_task(load.run(session, w)) for w in range(WRITERS)]
        try:
            await load.wait_acked(ACKS_BEFORE)
            # kubectl delete pod, with its claim deleted too: a new, empty volume.
            result = await asyncio.to_thread(pods.stop, replaced)
            assert not result.killed and result.exit_code == 0, replaced.log_tail()
            claims = await asyncio.to_thread(pods.replace_claims, replaced)
            await asyncio.to_thread(pods.start, replaced)
            await asyncio.to_thread(pods.wait_ready, [replaced], timeout_s=READY_TIMEOUT_S)
            await _wait_views(session, [p for p in seqlog if p is not replaced],
                              replaced.name, {"ALIVE", "SUSPECT"})
            # The new disk got a marker of a new generation, and the cluster knows the
            # shard lost its data.
            (marker_path,) = [c / "identity.json" for c in claims
                              if (c / "identity.json").exists()]
            marker = json.loads(marker_path.read_text())
            assert marker["node_id"] == replaced.name
            assert marker["generation"] > before["generation"], (marker, before)
            await load.wait_acked(len(load.acked) + ACKS_AFTER)
            deadline_s = time.monotonic() + REBUILD_TIMEOUT_S
            while True:
                shard = await _shard(session, random.choice(sequencers).http, replaced.name)
                if (shard["status"] == "AUTHORITATIVE"
                        and shard["rebuilds_count"] > before["rebuilds_count"]):
                    break
                assert time.monotonic() < deadline_s, f"not rebuilt: {shard}"
                await asyncio.sleep(0.2)
        finally:
            load.stop.set()
            await asyncio.gather(*writers, return_exceptions=True)
        assert shard["generation"] == marker["generation"], shard
        rebuilt_s = time.monotonic() - started_s

        last_lsn: dict[int, int] = {}
        for log, lsn, _ in load.acked:
            last_lsn[log] = max(last_lsn.get(log, 0), lsn)

        async def check(what: str) -> None:
            for log, upto in last_lsn.items():
                records, gaps = await _read_log(session, random.choice(sequencers).http, log,
                                                upto)
                assert not [g for g in gaps if g["type"] == "DATALOSS"], (what, gaps)
                lost = [lsn for lg, lsn, payload in load.acked
                        if lg == log and records.get(lsn) != payload]
                assert not lost, f"{what}: log {log}: {len(lost)} acknowledged records lost"

        await check("after the rebuild")
        # Another storage pod goes away: what it shared with the replaced pod is read from
        # the rebuilt copies.
        other = storage[2]
        result = await asyncio.to_thread(pods.stop, other)
        assert not result.killed, other.log_tail()
        await _wait_views(session, sequencers, other.name, {"DEAD"})
        await check(f"after the rebuild, with {other.name} stopped")
    print(f"replaced volume: {len(load.acked)} appends acknowledged, {load.refused} refused "
          f"(retried), {len(load.unknown)} unknown outcome; rebuilt {rebuilt_s:.1f} s after "
          f"the load began; longest stall between acks {load.longest_stall_s():.2f} s")
