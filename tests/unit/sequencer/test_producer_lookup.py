"""The producer lookup's I/O against three real storage nodes over TCP: candidates come from an
f-majority of answers, and only those that read back as records count (a stray copy that
recovery plugged, or one past its epoch's end, does not)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sequencer.producer_lookup import lookup_producer
from shared.epoch_metadata import LogMetadata
from shared.net.pool import PeerPool
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.release import Release
from shared.wire.store import RECOVERY_HOLE, Store, payloads_checksum, recovery_wave
from storage_node.runtime import StorageNode
from tests.unit.sequencer.storage_stack import storage_stack

LOG = LogId(5)
NODES = (NodeId("st1"), NodeId("st2"), NodeId("st3"))
TIMESTAMP_MS = 1_700_000_000_000


def lsn(epoch: int, esn: int) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def record(at: Lsn, payload: bytes, tag: tuple[str, int, int, int] | None) -> Store:
    return Store(log_id=LOG, lsn=at, wave=1, sequencer_node=NodeId("old"), copyset=NODES,
                 timestamp_ms=TIMESTAMP_MS, last_known_good=Esn(0), release_lsn=Lsn(0),
                 timeout_ms=1000, key=None, payloads=(payload,),
                 checksum=payloads_checksum((payload,)), producers=(tag,) if tag else ())


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[tuple[PeerPool, list[StorageNode]]]:
    async with storage_stack(tmp_path, NODES) as storage:
        yield storage.pool, storage.nodes


async def _store(peers: PeerPool, node: NodeId, message: Store) -> None:
    reply = await peers.call(node, message, 5_000)
    assert getattr(reply, "status", None) is Status.OK, reply


async def _never(_lsn: Lsn) -> None:
    raise AssertionError("no wait expected: every candidate is in a recovered epoch")


@pytest.mark.timeout(30)
async def test_only_candidates_that_read_back_as_records_count(
        pool: tuple[PeerPool, list[StorageNode]]) -> None:
    peers, _ = pool
    written = lsn(1, 1)       # seq 1: a record on R=2 nodes
    plugged = lsn(1, 2)       # seq 2: a stray copy on st3, plugged by recovery on st1, st2
    beyond = lsn(1, 9)        # seq 3: a stray copy past the epoch's end
    for node in NODES[:2]:
        await _store(peers, node, record(written, b"one", ("p", 1, written, written)))
        hole = dataclasses.replace(record(plugged, b"", None), flags=int(RECOVERY_HOLE),
                                   wave=recovery_wave(2, 1))
        await _store(peers, node, hole)
    await _store(peers, NODES[2], record(plugged, b"stray", ("p", 2, plugged, plugged)))
    await _store(peers, NODES[2], record(beyond, b"late", ("p", 3, beyond, beyond)))
    release = plugged  # recovery ended epoch 1 at e1n2 (its bridge is at e1n3)
    for node in NODES:
        peers.send(node, Release(log_id=LOG, release_lsn=release))
    metadata = LogMetadata(log_id=LOG, next_epoch=Epoch(3), nodeset=NODES,
                           replication_factor=2, last_writer=NodeId("seq"), version=1)
    found = await lookup_producer(transport=peers, metadata=metadata, producer_id="p",
                                  epoch=Epoch(2), release_lsn=lambda: release,
                                  wait_release_above=_never)
    assert found == [(1, written, written, TIMESTAMP_MS)]
    assert await lookup_producer(transport=peers, metadata=metadata, producer_id="nobody",
                                 epoch=Epoch(2), release_lsn=lambda: release,
                                 wait_release_above=_never) == []


@pytest.mark.timeout(30)
async def test_too_few_answers_leave_the_producer_unknown(
        pool: tuple[PeerPool, list[StorageNode]]) -> None:
    peers, nodes = pool
    for node in nodes[:2]:
        await node.close()  # answers SHUTDOWN: one answer left, an f-majority is 2
    metadata = LogMetadata(log_id=LOG, next_epoch=Epoch(3), nodeset=NODES,
                           replication_factor=2, last_writer=NodeId("seq"), version=1)
    assert await lookup_producer(transport=peers, metadata=metadata, producer_id="p",
                                 epoch=Epoch(2), release_lsn=lambda: Lsn(0),
                                 wait_release_above=_never) is None


@pytest.mark.timeout(30)
async def test_a_retry_written_again_is_found_beside_the_stray_of_its_first_attempt(
        pool: tuple[PeerPool, list[StorageNode]]) -> None:
    """Issue 16 item 2 (3 nodes, R=2): (p,7) reached only st3 at e1n2 and recovery plugged
    it on st1 and st2; the client's retry was written at e2n1 on {st1, st3} and acknowledged.
    In epoch 3 st1 does not answer: the lookup over {st2, st3} must still find e2n1, or the
    next retry of (p,7) is written a second time."""
    peers, nodes = pool
    stray = lsn(1, 2)
    retry = lsn(2, 1)
    await _store(peers, NODES[2], record(stray, b"first", ("p", 7, stray, stray)))
    for node in NODES[:2]:
        hole = dataclasses.replace(record(stray, b"", None), flags=int(RECOVERY_HOLE),
                                   wave=recovery_wave(1, 1))
        await _store(peers, node, hole)
    for node in (NODES[0], NODES[2]):
        await _store(peers, node, record(retry, b"retry", ("p", 7, retry, retry)))
    release = retry
    for node in NODES:
        peers.send(node, Release(log_id=LOG, release_lsn=release))
    await nodes[0].close()  # st1: down (or slower than the answer grace)
    metadata = LogMetadata(log_id=LOG, next_epoch=Epoch(4), nodeset=NODES,
                           replication_factor=2, last_writer=NodeId("seq"), version=1)
    found = await lookup_producer(transport=peers, metadata=metadata, producer_id="p",
                                  epoch=Epoch(3), release_lsn=lambda: release,
                                  wait_release_above=_never)
    assert found == [(7, retry, retry, TIMESTAMP_MS)]
