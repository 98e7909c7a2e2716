"""A storage node whose data is damaged says so (issue 16 item 3): five records on A, B, C
(nodeset A..E, R=3), one flipped byte in A's segment and a restart. A knows it lost data and
answers READ, SEAL, DIGEST and GET_LOG_STATE as non-authoritative; readers and recovery count
only authoritative answers toward an f-majority, so neither a reader whose first f-majority
is {A, D, E} nor a recovery sealed by {A, D, E} takes A's silence for absence.

Real storage nodes behind real TCP servers; the recovery core is driven by their answers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sequencer.core.effects import RecoveryProgress, WriteLastCleanEpoch
from sequencer.core.recovery import LogRecovery, Phase
from shared.config import SequencerConfig, StorageConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch
from shared.net.pool import PeerPool
from shared.net.read_driver import run_round
from shared.net.server import start_server
from shared.read_round import NodesetSpan, ReadRound
from shared.status import Status
from shared.types import EPOCH_MAX, ESN_MAX, LSN_MAX, Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.recovery import GetDigest, Seal, Sealed
from shared.wire.release import Release
from shared.wire.store import Store, payloads_checksum
from storage_node.authority import FILE_NAME
from storage_node.runtime import StorageNode
from tests.unit.sequencer.storage_stack import StorageStack, storage_stack
from tests.unit.storage_node.helpers import (
    make_read,
    make_store,
    read,
    request,
    running_node,
    store,
)

LOG = LogId(9)
A, B, C, D, E = (NodeId(n) for n in ("A", "B", "C", "D", "E"))
NODESET = (A, B, C, D, E)
RECORDS = 5
SEQ = NodeId("seq")


def lsn(esn: int, epoch: int = 1) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def payload(esn: int) -> bytes:
    return b"record-%d-" % esn + b"x" * 40


def record_store(esn: int) -> Store:
    data = (payload(esn),)
    return Store(log_id=LOG, lsn=lsn(esn), wave=1, sequencer_node=SEQ, copyset=(A, B, C),
                 timestamp_ms=1_700_000_000_000 + esn, last_known_good=Esn(0),
                 release_lsn=Lsn(0), timeout_ms=1000, key=None, payloads=data,
                 checksum=payloads_checksum(data))


def _status_file(data_dir: str) -> Any:
    return json.loads(Path(data_dir, FILE_NAME).read_bytes())


def flip_a_byte(data_dir: str, needle: bytes) -> None:
    """Flip one byte of ``needle`` in the node's only segment (an entry mid-segment)."""
    segments = os.path.join(data_dir, "segments")
    names = sorted(n for n in os.listdir(segments) if n.endswith(".seg"))
    path = os.path.join(segments, names[0])
    with open(path, "r+b") as file:
        data = file.read()
        offset = data.index(needle)
        file.seek(offset)
        file.write(bytes([data[offset] ^ 0x01]))


async def restart(stack: StorageStack, node_id: NodeId, root: Path) -> StorageNode:
    """Stop ``node_id``, then start it again on the same data, behind a new server."""
    index = NODESET.index(node_id)
    await stack.servers[node_id].close()
    await stack.nodes[index].close()
    node = StorageNode(node_id=node_id, data_dir=str(root / node_id),
                       config=StorageConfig(fsync="never"))
    await node.start()
    stack.nodes[index] = node
    server = await start_server("127.0.0.1", 0, node_id=node_id, cluster_fingerprint="t",
                                handler=node, config=stack.pool.config)
    stack.servers[node_id] = server
    stack.ports[node_id] = server.port
    return node


@pytest.fixture
async def damaged(tmp_path: Path) -> AsyncIterator[StorageStack]:
    """Five records on A, B, C and released there; then A's first entry damaged, A restarted."""
    async with storage_stack(tmp_path, NODESET) as stack:
        for esn in range(1, RECORDS + 1):
            for node in (A, B, C):
                reply = await stack.pool.call(node, record_store(esn), 5_000)
                assert getattr(reply, "status", None) is Status.OK, reply
        for node in NODESET:
            stack.pool.send(node, Release(log_id=LOG, release_lsn=lsn(RECORDS)))
        index = NODESET.index(A)
        await stack.servers[A].close()
        await stack.nodes[index].close()
        flip_a_byte(str(tmp_path / A), payload(1))
        await restart(stack, A, tmp_path)
        yield stack


async def _read_all(stack: StorageStack, order: tuple[NodeId, ...]) -> Any:
    span = NodesetSpan(first_epoch=Epoch(1), last_epoch=Epoch(EPOCH_MAX), nodeset=NODESET,
                       replication_factor=3)
    read_round = ReadRound(log_id=LOG, span=span, from_lsn=lsn(1), release_lsn=lsn(RECORDS),
                           records_max=100, bytes_max=1 << 20, wait_ms=0,
                           speculative_delay_ms=10_000, order=order,
                           started_ms=int(asyncio.get_running_loop().time() * 1000))
    return await run_round(stack.pool, read_round, 5_000)


@pytest.mark.timeout(60)
async def test_damaged_node_answers_as_non_authoritative(damaged: StorageStack) -> None:
    peers = damaged.pool
    reply = await peers.call(A, Read(log_id=LOG, from_lsn=lsn(1), until_lsn=lsn(RECORDS),
                                     release_lsn=lsn(RECORDS), records_max=100,
                                     bytes_max=1 << 20), 5_000)
    assert isinstance(reply, ReadReply) and reply.status is Status.OK
    assert reply.records == ()  # nothing after the bad entry is indexed
    assert reply.non_authoritative == ((lsn(1), lsn(RECORDS)),)
    state = await peers.call(A, GetLogState(log_id=LOG), 5_000)
    assert isinstance(state, LogState) and state.non_authoritative == ((1, LSN_MAX),)
    digest = await peers.call(A, GetDigest(log_id=LOG, epoch=Epoch(1), from_esn=Esn(1),
                                           seal_epoch=Epoch(1), records_max=10,
                                           bytes_max=1 << 20), 5_000)
    assert getattr(digest, "non_authoritative", None) == ((lsn(1), lsn(ESN_MAX)),)
    healthy = await peers.call(B, GetLogState(log_id=LOG), 5_000)
    assert isinstance(healthy, LogState) and healthy.non_authoritative == ()



@pytest.mark.timeout(60)
async def test_reader_whose_first_f_majority_holds_the_damaged_node_reads_everything(
        damaged: StorageStack) -> None:
    result = await _read_all(damaged, order=(A, D, E))
    assert result.end == "MERGED"
    assert result.answered == 4  # A, D, E, then B for A, which vouches for nothing
    merged = result.merged
    assert [gap.kind for gap in merged.gaps] == []
    assert [record[3] for record in merged.records] == [payload(esn)
                                                        for esn in range(1, RECORDS + 1)]


async def _drive_recovery(peers: PeerPool, recovery: LogRecovery, effects: list[Any],
                          held: dict[NodeId, list[Any]], now_ms: int) -> None:
    """Send the effects to the real nodes and feed the answers back until nothing is left
    to do; requests to nodes in ``held`` wait there (slow nodes)."""
    queue = list(effects)
    while queue:
        effect = queue.pop(0)
        if isinstance(effect, RecoveryProgress):
            continue
        if isinstance(effect, WriteLastCleanEpoch):
            queue.extend(recovery.on_lce_written(Status.OK, Epoch(0), now_ms))
            continue
        assert isinstance(effect, Send)
        if effect.node in held:
            held[effect.node].append(effect.message)
            continue
        reply = await peers.call(effect.node, effect.message, 5_000)
        queue.extend(recovery.on_reply(effect.node, effect.message, reply, now_ms))


@pytest.mark.timeout(60)
async def test_recovery_does_not_count_the_damaged_node_toward_its_f_majority(
        damaged: StorageStack) -> None:
    peers = damaged.pool
    config = SequencerConfig()
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(1),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0),
                                              version=0),
                           nodeset=NODESET, replication=3, config=config)
    held: dict[NodeId, list[Any]] = {B: [], C: []}  # slower than the grace period
    await _drive_recovery(peers, recovery, recovery.start(0), held, 0)
    now_ms = config.recovery_grace_ms + 1
    await _drive_recovery(peers, recovery, recovery.on_timer(now_ms), held, now_ms)
    # {A, D, E} sealed, but only D and E can vouch for epoch 1: not an f-majority (3).
    assert recovery.phase is Phase.SEALING
    for message in held.pop(B):
        reply = await peers.call(B, message, 5_000)
        await _drive_recovery(peers, recovery, recovery.on_reply(B, message, reply, now_ms),
                              held, now_ms)
    now_ms += config.recovery_grace_ms + 1
    await _drive_recovery(peers, recovery, recovery.on_timer(now_ms), held, now_ms)
    assert recovery.phase is Phase.DONE
    outcome = recovery.outcomes[Epoch(1)]
    assert outcome.holes == [] and outcome.bridge_esn == RECORDS + 1
    result = await _read_all(damaged, order=(D, E, B))
    assert [record[3] for record in result.merged.records] == [
        payload(esn) for esn in range(1, RECORDS + 1)]


async def test_the_status_survives_a_restart_without_the_damaged_segment(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        for esn in range(1, 4):
            assert (await store(node, make_store(lsn(esn)))).status is Status.OK
    flip_a_byte(data_dir, make_store(lsn(1)).payloads[0])
    async with running_node(data_dir) as node:
        assert node.stats()["non_authoritative"] == 1
        assert _status_file(data_dir)["all_logs"] == [[1, LSN_MAX]]
    for name in os.listdir(os.path.join(data_dir, "segments")):
        os.unlink(os.path.join(data_dir, "segments", name))  # e.g. an operator "cleaned up"
    async with running_node(data_dir) as node:
        state = await request(node, GetLogState(log_id=make_store(lsn(1)).log_id))
        assert isinstance(state, LogState) and state.non_authoritative == ((1, LSN_MAX),)


async def test_a_damaged_entry_found_by_a_read_makes_only_its_range_non_authoritative(
        tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        for esn in range(1, 4):
            assert (await store(node, make_store(lsn(esn)))).status is Status.OK
        flip_a_byte(data_dir, make_store(lsn(2)).payloads[0])
        first = await read(node, make_read(lsn(1), release_lsn=lsn(3)))
        assert [r[0] for r in first.records] == [lsn(1)]  # nothing damaged is served
        again = await read(node, make_read(lsn(1), release_lsn=lsn(3)))
        assert again.non_authoritative == ((lsn(2), lsn(2)),)
        sealed = await request(node, Seal(log_id=make_store(lsn(1)).log_id,
                                          seal_epoch=Epoch(1), sealed_by=SEQ,
                                          from_epoch=Epoch(1)))
        assert isinstance(sealed, Sealed) and sealed.non_authoritative == ((lsn(2), lsn(2)),)
    status = _status_file(data_dir)  # durable by the time it closed
    assert status["logs"] == {str(make_store(lsn(1)).log_id): [[lsn(2), lsn(2)]]}
    assert status["all_logs"] == []
