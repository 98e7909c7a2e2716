"""The frontends that the tail checker (T1) asks: the shipped ``frontend.service.FrontEnd``,
one per sequencer node incarnation, so that T1 checks the code production runs rather than a
model of it.

A tail request is an asyncio task running ``FrontEnd.tail`` on a loop of this module's own
(``FrontEnd`` gathers its storage requests with asyncio), stepped only when a simulated
answer arrives, so it advances with simulated time. Its ports:

- the peer pool: every request travels as a simulated message with a delay, and back. At
  the destination, GET_LOG_STATE goes to the storage node's real handlers (``on_message``, so
  a damaged node annotates its answer as it would), GET_SEQUENCER_STATE to the real
  ``FrontEnd.sequencer_state`` of that sequencer node, both answering what the node holds at
  that moment. A node that is down or cut off by a partition fails the request with
  CONNFAILED; a stalled node answers once it resumes; a node that crashes meanwhile never
  answers (the request times out, as ``PeerPool.call``'s timer does). The tail's messages
  take their delays from a random stream of their own and do not go through
  ``SimNetwork``'s links, and activation requests are dropped: the checker observes the
  cluster and never changes it, so a seed's schedule is the same with or without it;
- the local sequencer: this node's simulated cores, read as ``SequencerRuntime`` reads its
  own (``is_active``, ``release_lsn``, ``epoch``);
- the epoch store: the simulated one's metadata and last clean epochs (answered at once);
- the owner of a log: the simulation's routing table (what clients use), in place of the
  rendezvous hash over the gossip view.

Rebuilding donors ask through frontends of their own (``storage_frontend``: a storage node's,
with no sequencer, and a failure detector's view in which a sequencer node that is down is
DEAD): ``RebuildRuntime._ask_tails`` runs on this loop (``run``), its messages take their
delays from another stream, and its activation requests are delivered (``activation``).

T1 then holds every OK answer to at least the highest tail any frontend reported before the
request started (requests that overlap may finish in either order); a crashed node's pending
requests are dropped with it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, cast

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

T = TypeVar("T")


class _Pool:
    """``PeerPool`` as ``FrontEnd.tail`` uses it (``call``, ``send``)."""

    cluster_fingerprint = "sim"

    def __init__(self, frontends: SimFrontends, node_id: NodeId,
                 rng: random.Random | None = None) -> None:
        self._frontends = frontends
        self._node_id = node_id
        self._rng = rng

    def send(self, node: NodeId, message: Any) -> bool:
        if self._rng is not None:  # a rebuilding donor's: delivered (``inflight_tails``)
            self._frontends.activation(self._node_id, node, message, self._rng)
        return True  # the tail checker's activation requests: dropped (module docstring)

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any:
        return await self._frontends.request(self._node_id, node, message, timeout_ms,
                                             self._rng)


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

    def inflight_tail(self, log_id: LogId) -> Lsn:
        core = self._node.cores.get(log_id)
        return core.sequencer.inflight_tail() if core is not None else Lsn(0)

    def active_tails(self) -> list[tuple[LogId, Lsn, Lsn]]:
        return [(log_id, core.sequencer.release_lsn, core.sequencer.inflight_tail())
                for log_id, core in self._node.cores.items()
                if core.sequencer.state is SequencerState.ACTIVE]

    def request_activation(self, log_id: LogId) -> None:
        """Dropped (module docstring)."""


class _SequencerView:
    """``frontend.ports.MembershipView`` of a storage node's frontend: a sequencer node that
    is down is DEAD (its appenders died with it), as the failure detector says soon after."""

    def __init__(self, cluster: SimCluster) -> None:
        self._cluster = cluster

    def view(self) -> dict[NodeId, str]:
        return {n: "ALIVE" if node.up else "DEAD" for n, node in self._cluster.sequencers.items()}

    def subscribe(self, listener: Any) -> None:
        """Routing follows the simulation's table (``owner``), not the view."""


class _EpochStore:
    """The reads of ``shared.ports.EpochStore`` that the tail makes."""

    def __init__(self, cluster: SimCluster) -> None:
        self._store = cluster.epoch_store

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        metadata = self._store.metadata.get(log_id)
        return (Status.OK, metadata) if metadata is not None else (Status.NOTFOUND, None)

    async def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return self._store.get_last_clean_epoch(log_id)


TailHook = Callable[[FrontEnd, LogId, tuple[NodeId, ...], Any], Any]


class SimFrontends:
    """The sequencer nodes' frontends and their tail requests in flight."""

    def __init__(self, cluster: SimCluster, seed: int, stats: Counter[str]) -> None:
        self._cluster = cluster
        self._rng = random.Random(seed ^ 0x7A11)
        self._stats = stats
        self._frontends: dict[tuple[NodeId, int], FrontEnd] = {}
        self._tasks: dict[tuple[NodeId, int, LogId], asyncio.Task[None]] = {}
        """Tail requests in flight, one per frontend and log at a time."""
        self.broken_tail: TailHook | None = None
        """Replaces the answer of a NOTREADY tail (``test_broken_cores``)."""
        self._plan_rng = random.Random(seed ^ 0x9E7A)
        """Delays of rebuilding donors' questions (their own stream: the tail checker's
        questions do not change the schedule)."""
        self._plans: set[asyncio.Task[None]] = set()

    # ---- the frontends -------------------------------------------------------------------

    def frontend(self, node_id: NodeId) -> FrontEnd:
        """Sequencer node ``node_id``'s frontend, new with each incarnation of the node (a
        restarted process remembers no tail it reported before)."""
        cluster = self._cluster
        key = (node_id, cluster.sequencers[node_id].incarnation)
        front = self._frontends.get(key)
        if front is None:
            nodes = tuple(NodeConfig(node_id=n, roles=("sequencer",)) for n in cluster.sequencers)
            nodes += tuple(NodeConfig(node_id=n, roles=("storage",)) for n in cluster.storage)
            config = ProcessConfig(node_id=node_id, cluster=ClusterConfig(nodes=nodes),
                                   data_dir="/nonexistent")
            front = FrontEnd(config=config, pool=cast(PeerPool, _Pool(self, node_id)),
                             sequencer=_LocalSequencer(cluster.sequencers[node_id]),
                             epoch_store=cast(EpochStore, _EpochStore(cluster)))
            front.owner = cluster.route.get  # type: ignore[method-assign]
            self._frontends[key] = front
        return front

    def storage_frontend(self, node_id: NodeId) -> FrontEnd:
        """A storage node's frontend (no sequencer here), new with each incarnation: what a
        rebuilding donor asks the logs' sequencers through (``FrontEnd.inflight_tail``)."""
        cluster = self._cluster
        key = (node_id, -1 - cluster.storage[node_id].incarnation)
        front = self._frontends.get(key)
        if front is None:
            nodes = tuple(NodeConfig(node_id=n, roles=("sequencer",)) for n in cluster.sequencers)
            nodes += tuple(NodeConfig(node_id=n, roles=("storage",)) for n in cluster.storage)
            config = ProcessConfig(node_id=node_id, cluster=ClusterConfig(nodes=nodes),
                                   data_dir="/nonexistent")
            front = FrontEnd(config=config,
                             pool=cast(PeerPool, _Pool(self, node_id, self._plan_rng)),
                             sequencer=None, epoch_store=cast(EpochStore, _EpochStore(cluster)),
                             gossip=_SequencerView(cluster))
            front.owner = cluster.route.get  # type: ignore[method-assign]
            self._frontends[key] = front
        return front

    def run(self, coroutine: Coroutine[Any, Any, T], done: Callable[[T], None]) -> None:
        """``coroutine`` on this module's loop (a rebuilding donor's questions to the
        sequencers, ``RebuildRuntime._ask_tails``); ``done`` gets its result in a later
        event of the simulation."""
        queue = self._cluster.queue

        async def ask() -> None:
            result = await coroutine
            queue.after(0, lambda: done(result))  # outside this loop: the donor steps on

        task = _loop().create_task(ask())
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        self._plans.add(task)
        if not _loop().is_running():  # else the pump under way steps it
            self._pump()

    def activation(self, src: NodeId, dst: NodeId, message: Any,
                   rng: random.Random) -> None:
        """A donor's GET_SEQUENCER_STATE(activate): the sequencer node ``dst`` activates the
        log if it is not active (``Sequencer.on_activate_request``), as
        ``FrontEnd.sequencer_state`` has ``SequencerRuntime`` do."""
        cluster = self._cluster
        network, queue = cluster.network, cluster.queue
        if (type(message) is not GetSequencerState or not message.activate
                or dst not in cluster.sequencers):
            return

        def deliver() -> None:
            node = cluster.sequencers[dst]
            if not node.up or network.cut(src, dst):
                return
            core = node.core(message.log_id)
            node._apply(core, core.sequencer.on_activate_request(cluster.now_ms))

        queue.after(self._delay_ms(rng), deliver)

    def ask_tails(self, log_id: LogId, nodeset: tuple[NodeId, ...]) -> None:
        """Every up sequencer node's frontend starts a tail request for ``log_id`` (unless
        one is still in flight there)."""
        cluster = self._cluster
        self._drop_dead()
        for node_id, node in cluster.sequencers.items():
            key = (node_id, node.incarnation, log_id)
            if not node.up or key in self._tasks:
                continue
            floor = cluster.checker.tail_high(log_id)
            task = _loop().create_task(
                self._tail(node_id, self.frontend(node_id), log_id, nodeset, floor))
            # A scenario may stop with requests in flight: they go with the cluster, as a
            # dead process's do, without asyncio's "destroyed but pending" warning.
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            self._tasks[key] = task
        self._pump()

    async def _tail(self, node_id: NodeId, front: FrontEnd, log_id: LogId,
                    nodeset: tuple[NodeId, ...], floor: tuple[Lsn, str]) -> None:
        outcome = await front.tail(log_id)
        self._stats[f"tail_{outcome.status.name.lower()}"] += 1
        if outcome.status is Status.OK:
            tail = outcome.release_lsn
        elif outcome.status is Status.NOTREADY and self.broken_tail is not None:
            tail = await self.broken_tail(front, log_id, nodeset, outcome)
        else:
            return
        self._cluster.checker.on_tail(f"frontend {node_id}", log_id, tail, floor)

    # ---- the transport -------------------------------------------------------------------

    def request(self, src: NodeId, dst: NodeId, message: Any,
                timeout_ms: int, rng: random.Random | None = None) -> asyncio.Future[Any]:
        """``message`` from ``src``'s frontend to ``dst``; the future gets the answer or the
        failure ``Status`` (module docstring)."""
        cluster = self._cluster
        network, queue = cluster.network, cluster.queue
        answer: asyncio.Future[Any] = _loop().create_future()

        def settle(value: Any) -> None:
            if not answer.done():
                answer.set_result(value)
                self._pump()

        queue.after(timeout_ms, lambda: settle(Status.TIMEDOUT))
        if not network.is_up(dst) or network.cut(src, dst):
            queue.after(network.connfail_delay_ms, lambda: settle(Status.CONNFAILED))
            return answer
        dst_incarnation = network.incarnation(dst)

        def deliver() -> None:
            stalled_until_ms = network.stalled_until_ms.get(dst, 0)
            if stalled_until_ms > queue.clock.now_ms():
                queue.at(stalled_until_ms + 1, deliver)  # it reads once it resumes
                return
            if (not network.is_up(dst) or network.incarnation(dst) != dst_incarnation
                    or network.cut(src, dst)):
                return  # never answered: the timeout ends it
            reply = self._handle(src, dst, message)
            queue.after(self._delay_ms(rng), lambda: None if network.cut(src, dst) else settle(
                reply))

        queue.after(self._delay_ms(rng), deliver)
        return answer

    def _handle(self, src: NodeId, dst: NodeId, message: Any) -> Any:
        cluster = self._cluster
        if type(message) is GetSequencerState:
            return self.frontend(dst).sequencer_state(message.log_id, activate=False,
                                                      all_logs=message.all_logs)
        assert type(message) is GetLogState, message
        answers: list[Any] = []
        cluster.storage[dst].on_message(src, message, answers.append)
        assert len(answers) == 1, "GET_LOG_STATE is answered at once"
        return answers[0]

    def _delay_ms(self, rng: random.Random | None = None) -> int:
        network = self._cluster.network
        return (rng or self._rng).randint(network.delay_ms_min, network.delay_ms_max)

    # ---- the loop ------------------------------------------------------------------------

    def _pump(self) -> None:
        """Step the tail tasks until each waits for a simulated answer or is done; a checker
        failure inside one is raised here, in the simulation's event."""
        loop = _loop()
        while True:
            loop.call_soon(loop.stop)
            loop.run_forever()
            if not loop._ready:  # type: ignore[attr-defined]
                break
        for key, task in list(self._tasks.items()):
            if task.done():
                del self._tasks[key]
                task.result()
        for task in [t for t in self._plans if t.done()]:
            self._plans.discard(task)
            task.result()

    def _drop_dead(self) -> None:
        """Tail requests of crashed frontends end with their process."""
        sequencers = self._cluster.sequencers
        for key, task in list(self._tasks.items()):
            node = sequencers[key[0]]
            if not node.up or node.incarnation != key[1]:
                task.cancel()
                del self._tasks[key]
        self._pump()

    def close(self) -> None:
        """Cancel every request in flight (the run is over)."""
        for task in [*self._tasks.values(), *self._plans]:
            task.cancel()
        self._tasks.clear()
        self._plans.clear()
        self._pump()


_the_loop: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    """One loop for the process (never run on its own: ``SimFrontends._pump`` steps it)."""
    global _the_loop
    if _the_loop is None or _the_loop.is_closed():
        _the_loop = asyncio.new_event_loop()
    return _the_loop


async def tail_from_storage(front: FrontEnd, log_id: LogId, nodeset: tuple[NodeId, ...],
                            outcome: Any) -> Lsn:
    """A NOTREADY tail answered from the storage nodes' release pointers instead, as
    ``FrontEnd.tail`` did when issue 16 item 4 was filed (``test_broken_cores``)."""
    states = await front._log_states(log_id, nodeset)
    return front._note_release(log_id, Lsn(max(
        [Lsn(0), *(state.release_lsn for state in states.values())])))
