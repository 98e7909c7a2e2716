"""The frontends that the tail checker (T1) asks: the shipped ``frontend.service.FrontEnd``,
one per sequencer node incarnation, so that T1 checks the code production runs rather than a
model of it.

Each ``FrontEnd.tail`` call runs to completion at the moment of the check, on an asyncio
loop of its own (``FrontEnd`` gathers its storage requests with asyncio), with ports that
answer at once from the simulated cluster as it is then:

- the peer pool: GET_LOG_STATE goes to the storage node's real handlers (``on_message``, so a
  damaged node annotates its answer as it would), GET_SEQUENCER_STATE to the real
  ``FrontEnd.sequencer_state`` of the other sequencer node; a node that is down or cut off
  by a partition fails with CONNFAILED, a stalled one with TIMEDOUT. Activation requests are
  dropped: the checker observes the cluster, it never changes it (and it never draws from
  the seed's random stream), so a seed's schedule is the same with or without it;
- the local sequencer: this node's simulated cores, read as ``SequencerRuntime`` reads its
  own (``is_active``, ``release_lsn``, ``epoch``);
- the epoch store: the simulated one's metadata and last clean epochs;
- the owner of a log: the simulation's routing table (what clients use), in place of the
  rendezvous hash over the gossip view.

What this does not exercise: messages of one tail request that cross other events (every
answer is taken at one instant).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from frontend.service import FrontEnd
from sequencer.core.sequencer import SequencerState
from shared.config import ClusterConfig, NodeConfig, ProcessConfig
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.net.pool import PeerPool
from shared.ports import EpochStore
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.append import GetSequencerState
from shared.wire.read import GetLogState

if TYPE_CHECKING:
    from tests.simulation.sim_cluster import SimCluster
    from tests.simulation.sim_sequencer import SimSequencerNode


class _Pool:
    """``PeerPool`` as ``FrontEnd.tail`` uses it (``call``, ``send``)."""

    cluster_fingerprint = "sim"

    def __init__(self, cluster: SimCluster, node_id: NodeId) -> None:
        self._cluster = cluster
        self._node_id = node_id

    def send(self, node: NodeId, message: Any) -> bool:
        return True  # activation requests: dropped (module docstring)

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any:
        cluster = self._cluster
        network = cluster.network
        if not network.is_up(node) or network.cut(self._node_id, node):
            return Status.CONNFAILED
        if network.stalled(node, cluster.now_ms):
            return Status.TIMEDOUT
        if type(message) is GetSequencerState:
            return cluster.frontend(node).sequencer_state(message.log_id,
                                                          activate=message.activate)
        assert type(message) is GetLogState, message
        answers: list[Any] = []
        cluster.storage[node].on_message(self._node_id, message, answers.append)
        assert len(answers) == 1, "GET_LOG_STATE is answered at once"
        return answers[0]


class _LocalSequencer:
    """``frontend.ports.LocalSequencer`` as ``FrontEnd.tail`` uses it, over the node's cores
    (the same three reads as ``SequencerRuntime``)."""

    def __init__(self, node: SimSequencerNode) -> None:
        self._node = node

    def is_active(self, log_id: LogId) -> bool:
        core = self._node.cores.get(log_id)
        return core is not None and core.sequencer.state is SequencerState.ACTIVE

    def release_lsn(self, log_id: LogId) -> Lsn:
        core = self._node.cores.get(log_id)
        return core.sequencer.release_lsn if core is not None else Lsn(0)

    def epoch(self, log_id: LogId) -> Epoch:
        core = self._node.cores.get(log_id)
        return core.sequencer.epoch if core is not None else Epoch(0)

    def request_activation(self, log_id: LogId) -> None:
        """Dropped (module docstring)."""


class _EpochStore:
    """The reads of ``shared.ports.EpochStore`` that the tail makes."""

    def __init__(self, cluster: SimCluster) -> None:
        self._store = cluster.epoch_store

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        metadata = self._store.metadata.get(log_id)
        return (Status.OK, metadata) if metadata is not None else (Status.NOTFOUND, None)

    async def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return self._store.get_last_clean_epoch(log_id)


def make_frontend(cluster: SimCluster, node_id: NodeId,
                  owner: Callable[[LogId], NodeId | None]) -> FrontEnd:
    """A fresh ``FrontEnd`` of sequencer node ``node_id`` (a new incarnation remembers no
    tail it reported before, as a restarted process)."""
    nodes = tuple(NodeConfig(node_id=n, roles=("sequencer",)) for n in cluster.sequencers)
    nodes += tuple(NodeConfig(node_id=n, roles=("storage",)) for n in cluster.storage)
    config = ProcessConfig(node_id=node_id, cluster=ClusterConfig(nodes=nodes),
                           data_dir="/nonexistent")
    front = FrontEnd(config=config, pool=cast(PeerPool, _Pool(cluster, node_id)),
                     sequencer=_LocalSequencer(cluster.sequencers[node_id]),
                     epoch_store=cast(EpochStore, _EpochStore(cluster)))
    front.owner = owner  # type: ignore[method-assign]
    return front


_loop: asyncio.AbstractEventLoop | None = None


def run_now(coroutine: Any) -> Any:
    """Run ``coroutine`` to its end now (every port answers at once, so nothing waits on
    simulated time). One loop for the process: creating one per call costs more than the
    tail itself."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coroutine)
