"""Trims (issue 16 item 9): ``FrontEnd.trim`` answers OK only once R storage nodes (at least an
f-majority) wrote the trim point, so that every f-majority a reader may merge holds one of
them (with an f-majority alone, two f-majorities are disjoint when ``|nodeset| < 2R - 1`` and
a reader could read below an acknowledged trim point), and the nodes that missed it are sent
it again until they have it."""

from __future__ import annotations

import asyncio
import itertools
from typing import cast

import pytest

from frontend import trim_spread
from frontend.service import FrontEnd
from shared.config import ClusterConfig, NodeConfig, ProcessConfig
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.net.pool import PeerPool
from shared.net.types import RequestCallback
from shared.ports import EpochStore
from shared.read_merge import NodeAnswer, f_majority, merge
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.append import GetSequencerState, SequencerState
from shared.wire.codec import Message
from shared.wire.read import GetLogState, LogState
from shared.wire.trim import Trim, Trimmed

STORAGE = tuple(NodeId(f"st{i}") for i in range(1, 5))
ME = NodeId("seq1")
RELEASE = compose_lsn(Epoch(1), Esn(50))
TRIM = compose_lsn(Epoch(1), Esn(20))


def _node(node_id: str, role: str, port: int) -> NodeConfig:
    return NodeConfig(node_id=NodeId(node_id), roles=(role,),  # type: ignore[arg-type]
                      http_port=port, data_port=port + 1)


CLUSTER = ClusterConfig(cluster_name="c", replication_factor=3, nodes=(
    _node("seq1", "sequencer", 9000), _node("seq2", "sequencer", 9002),
    *(_node(n, "storage", 9004 + 2 * i) for i, n in enumerate(STORAGE))))


class _Store:
    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        return Status.OK, LogMetadata(log_id=log_id, next_epoch=Epoch(2), nodeset=STORAGE,
                                      replication_factor=3, last_writer=None, version=1)

    async def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return Status.OK, LastCleanEpoch(log_id=log_id, epoch=Epoch(0), tail_lsn=Lsn(0),
                                         version=1)


class _Nodes:
    """Storage nodes that take trims unless ``down``; the owner sequencer (seq2) answers at
    once."""

    cluster_fingerprint = "fp"

    def __init__(self) -> None:
        self.down: set[NodeId] = set()
        self.trims: dict[NodeId, Lsn] = {}
        self.changed = asyncio.Event()

    def _trim(self, node: NodeId, message: Trim) -> Message | Status:
        if node in self.down:
            return Status.TIMEDOUT
        self.trims[node] = Lsn(max(self.trims.get(node, 0), message.trim_lsn))
        self.changed.set()
        return Trimmed(status=Status.OK, log_id=message.log_id, trim_lsn=self.trims[node])

    async def call(self, node: NodeId, message: Message, timeout_ms: int) -> Message | Status:
        if type(message) is Trim:
            return self._trim(node, message)
        if type(message) is GetLogState:
            return LogState(status=Status.OK, log_id=message.log_id, release_lsn=RELEASE,
                            sealed_epoch=Epoch(0), last_lsn=RELEASE,
                            trim_lsn=self.trims.get(node, Lsn(0)))
        assert type(message) is GetSequencerState
        return SequencerState(status=Status.OK, log_id=message.log_id, release_lsn=RELEASE,
                              epoch=Epoch(1))

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None:
        assert type(message) is Trim
        asyncio.get_running_loop().call_soon(callback, self._trim(node, message))


def _front_end(nodes: _Nodes) -> tuple[FrontEnd, LogId]:
    config = ProcessConfig(node_id=ME, cluster=CLUSTER, data_dir="/nonexistent")
    front = FrontEnd(config=config, pool=cast(PeerPool, nodes), sequencer=None,
                     epoch_store=cast(EpochStore, _Store()))
    log_id = next(LogId(i) for i in range(1, 1000) if front.owner(LogId(i)) == "seq2")
    return front, log_id


@pytest.mark.parametrize("nodeset_size", range(1, 9))
def test_r_copies_of_a_trim_meet_every_f_majority(nodeset_size: int) -> None:
    for replication in range(1, nodeset_size + 1):
        nodes = range(nodeset_size)
        needed = max(f_majority(nodeset_size, replication), replication)
        majority = f_majority(nodeset_size, replication)
        for trimmed in itertools.combinations(nodes, needed):
            for readers in itertools.combinations(nodes, majority):
                assert set(trimmed) & set(readers), (nodeset_size, replication)
    # The old rule (an f-majority) does not: 4 nodes, R=3.
    assert not {0, 1} & {2, 3} and f_majority(4, 3) == 2


def test_a_reader_whose_f_majority_missed_the_trim_reads_below_it() -> None:
    # What the old rule allowed (4 nodes, R=3): the trim acknowledged by st1 and st2, a
    # reader merging st3 and st4 (an f-majority) is served records below it.
    below = tuple((lsn, 1, None, b"x") for lsn in range(TRIM - 2, TRIM + 1))
    missed = [NodeAnswer(records=below, next_lsn=Lsn(TRIM + 1), release_lsn=RELEASE)] * 2
    assert merge(missed, Lsn(TRIM - 2), RELEASE, 100, 1 << 20).records
    # One answer that has it (any R-set meets the f-majority) turns them into a TRIM gap.
    merged = merge([missed[0], NodeAnswer(records=(), next_lsn=Lsn(TRIM + 1),
                                          release_lsn=RELEASE, trim_lsn=TRIM)],
                   Lsn(TRIM - 2), RELEASE, 100, 1 << 20)
    assert merged.records == [] and [(g.kind, g.hi) for g in merged.gaps] == [("TRIM", TRIM)]


async def test_trim_needs_r_nodes_and_reaches_the_rest_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trim_spread, "TRIM_RETRY_FIRST_MS", 10)
    nodes = _Nodes()
    front, log_id = _front_end(nodes)
    # Two of four nodes (an f-majority, not R): refused, to be retried by the caller.
    nodes.down = {STORAGE[2], STORAGE[3]}
    outcome = await front.trim(log_id, TRIM)
    assert outcome.status is Status.NOTREADY
    # Three (R): done; the fourth is owed it and gets it once it is back.
    nodes.down = {STORAGE[3]}
    outcome = await front.trim(log_id, TRIM)
    assert (outcome.status, outcome.lsn) == (Status.OK, TRIM)
    assert STORAGE[3] not in nodes.trims
    await asyncio.sleep(0.05)
    nodes.down = set()
    async with asyncio.timeout(5):
        while nodes.trims.get(STORAGE[3]) != TRIM:
            nodes.changed.clear()
            await nodes.changed.wait()
    await front.close()


async def test_a_tail_call_catches_up_a_node_that_missed_a_trim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The trim's own retries gave up (or the front end that owed them stopped): the trim
    # point is durable on the nodes that have it, and the next tail of the log sees st4
    # behind and sends it the trim.
    monkeypatch.setattr(trim_spread, "TRIM_RETRY_FIRST_MS", 10)
    nodes = _Nodes()
    front, log_id = _front_end(nodes)
    nodes.trims = {STORAGE[0]: TRIM, STORAGE[1]: TRIM, STORAGE[2]: TRIM}
    outcome = await front.tail(log_id)
    assert (outcome.status, outcome.trim_lsn) == (Status.OK, TRIM)
    async with asyncio.timeout(5):
        while nodes.trims.get(STORAGE[3]) != TRIM:
            nodes.changed.clear()
            await nodes.changed.wait()
    await front.close()
