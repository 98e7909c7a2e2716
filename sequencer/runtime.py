"""The asyncio driver of the sequencer role: feeds the pure per-log ``Sequencer`` cores with
appends, STORED replies, epoch-store answers and timer ticks, and carries out their effects.

It makes no decisions of its own. One timer is armed for the earliest deadline over all logs;
a periodic task broadcasts release pointers so that every storage node learns them.

Idle logs cost nothing: the periodic broadcast visits only the logs in a dirty set (release
moved lately), in chunks, and a log's sequencer idle for ``idle_deactivate_ms``
is deactivated (epoch marked clean, dropped from memory; the next append activates a new
epoch with no recovery). With 10,000 idle logs, walking them all twice a second stalled the
loop for 70-90 ms each time.

Appends to one log that arrive in the same event-loop iteration are handed to the core
together (``Sequencer.on_append_group``), so that they share one appender: under load this
turns many small STOREs into a few large ones, which is what Python needs to keep up. The
appenders of different logs started in one iteration share their first wave (one copyset,
timer and count of answers: ``sequencer.core.shared_wave``, ``shared_waves`` setting).

``append_nowait`` is the hot entry: it stages the append and calls ``done`` with the answer
later, with no Task and no future per append; the coroutine ``append`` wraps it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sequencer.core.effects import (
    AppendReply,
    FetchProducer,
    RecoveryProgress,
    ReleaseAdvanced,
    WriteLastCleanEpoch,
)
from sequencer.core.nodeset_target import may_grow, nodeset_target
from sequencer.core.sequencer import PendingAppend, Sequencer, SequencerState
from sequencer.core.store_timeout import StoreLatency
from sequencer.handlers import Callback, EffectDriver
from sequencer.producer_lookup import lookup_producer
from shared import failpoints
from shared.clock import Clock
from shared.config import ClusterConfig, SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import NodesetTarget, ProvisionSpec, next_nodeset
from shared.ports import EpochStore, Rng
from shared.read_round import metadata_spans
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.read import GetLogState
from shared.wire.store import Store
from shared.wire.store_batch import StoreBatch

log = logging.getLogger(__name__)

DRAIN_MARK_CLEAN_TIMEOUT_S = 2.0
"""Time allowed for marking drained epochs clean even when the drain used up its own."""
LOGS_PER_LOOP_TURN_MAX = 128
"""Logs the broadcast or the idle check handles before yielding to the event loop, so that
neither stalls it for more than a few ms whatever the number of logs."""
IDLE_MARKS_IN_FLIGHT_MAX = 64
"""Clean-marks of deactivated epochs written to the epoch store at once."""


NODESET_GROW_CONNECT_MS = 5_000
"""How long a membership change waits for added storage nodes to be reachable before logs
move to nodesets with them (they move anyway after it)."""


class Transport(Protocol):
    """What the driver needs from ``shared.net.PeerPool``."""

    def request(self, node: NodeId, message: Any, callback: Callable[[Any], None], *,
                timeout_ms: int | None = None) -> None: ...

    def send(self, node: NodeId, message: Any) -> bool: ...

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any: ...


@dataclass(frozen=True, slots=True)
class AppendResult:
    status: Status
    first_lsn: Lsn
    last_lsn: Lsn
    timestamp_ms: int
    message: str


AppendDone = Callable[[AppendResult | AppendReply], None]
"""Receives the answer of one ``append_nowait``, exactly once: the core's ``AppendReply``
itself (same fields; no copy per append), or an ``AppendResult`` made here."""


def _deliver(done: AppendDone, result: AppendResult | AppendReply) -> None:
    # One caller's bug must not stop the effects of the appender that answered many.
    try:
        done(result)
    except Exception:
        log.exception("append callback %r failed", done)


_NOTHING_STAGED = (0, 0)
_SHUTTING_DOWN = AppendResult(Status.SHUTDOWN, Lsn(0), Lsn(0), 0, "node is shutting down")


class _RuntimePorts:
    """``SequencerPorts`` over the asyncio runtime: messages through the transport, epoch
    store work in tasks, answers to the append callbacks."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: SequencerRuntime) -> None:
        self._runtime = runtime

    def now_ms(self) -> int:
        return self._runtime.clock.now_ms()

    def send(self, node: NodeId, message: Any) -> None:
        self._runtime.transport.send(node, message)

    def send_store(self, node: NodeId, store: Store, callback: Callback) -> None:
        self._runtime.transport.request(node, store, callback)

    def send_store_batch(self, node: NodeId, batch: StoreBatch, callback: Callback) -> None:
        self._runtime.transport.request(node, batch, callback)

    def schedule_flush(self) -> None:
        runtime = self._runtime
        runtime._loop.call_soon(runtime._driver.flush)

    def request(self, node: NodeId, message: Any, callback: Callback, *,
                timeout_ms: int | None = None) -> None:
        self._runtime.transport.request(node, message, callback, timeout_ms=timeout_ms)

    def answer(self, sequencer: Sequencer, reply: AppendReply) -> None:
        done = self._runtime._waiters.pop(reply.request_id, None)
        if done is not None:
            _deliver(done, reply)

    def release_advanced(self, sequencer: Sequencer, effect: ReleaseAdvanced) -> None:
        runtime = self._runtime
        runtime._broadcast_dirty.add(effect.log_id)
        event = runtime._release_events.pop(effect.log_id, None)
        if event is not None:
            event.set()

    def activate(self, sequencer: Sequencer) -> None:
        self._runtime._spawn(self._runtime._activate(sequencer))

    def fetch_producer(self, sequencer: Sequencer, effect: FetchProducer) -> None:
        self._runtime._spawn(self._runtime._fetch_producer(sequencer, effect))

    def write_lce(self, sequencer: Sequencer, effect: WriteLastCleanEpoch) -> None:
        self._runtime._spawn(self._runtime._write_lce(sequencer, effect))

    def recovery_progress(self, sequencer: Sequencer, effect: RecoveryProgress) -> None:
        runtime = self._runtime
        log.info("log %d: recovery attempt %d: %s", effect.log_id, effect.attempt,
                 effect.phase)
        runtime.recovery_phases_count[effect.phase] += 1
        runtime._broadcast_dirty.add(effect.log_id)  # CLEANs may be owed now
        if effect.phase == "DIGESTING":
            failpoints.hit("recovery.after_seal")

    def applied(self, sequencer: Sequencer) -> None:
        self._runtime._after_apply(sequencer)


class SequencerRuntime:
    def __init__(
        self,
        *,
        node_id: NodeId,
        config: SequencerConfig,
        cluster: ClusterConfig,
        transport: Transport,
        epoch_store: EpochStore,
        clock: Clock,
        rng: Rng,
        provision_on_append: bool = True,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.cluster = cluster
        self.transport = transport
        self.epoch_store = epoch_store
        self.clock = clock
        self.rng = rng
        self.provision_on_append = provision_on_append
        self.sequencers: dict[LogId, Sequencer] = {}
        self._waiters: dict[int, AppendDone] = {}
        """The callback of every unanswered append, by request id."""
        self._next_request_id = 1
        self._timers: list[tuple[int, LogId]] = []
        self._timer_handle: asyncio.TimerHandle | None = None
        self._armed_ms: int | None = None
        self._release_events: dict[LogId, asyncio.Event] = {}
        self._releasable_events: dict[LogId, asyncio.Event] = {}
        """Producer lookups waiting for a log's earlier epochs to be recovered."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._broadcast_task: asyncio.Task[None] | None = None
        self._closing = False
        self._stopped = False
        """Set by ``close`` (``_closing`` is set by ``drain`` already, while appends finish)."""
        self._staged: dict[tuple[LogId, str | None], list[PendingAppend]] = {}
        self._staged_size: dict[tuple[LogId, str | None], tuple[int, int]] = {}
        """(records, payload bytes) of each staged group, kept so staging stays O(1)."""
        self._flush_scheduled = False
        self._timer_due: dict[LogId, int] = {}
        """Each log's earliest deadline in ``_timers`` (not pushed again while it is the
        earliest: most effects leave a log's deadline where it was)."""
        self._expiries: deque[tuple[float, list[int]]] = deque()
        """(deadline, request ids): the appends of one loop iteration share one entry."""
        self._expiry_batch: list[int] | None = None
        """The request ids of this loop iteration's appends (the last ``_expiries`` entry)."""
        self._batch_wall_ms = 0
        self._append_timeout_s = config.append_timeout_ms / 1000
        self._expiry_task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        """Set once closing and no appender is in flight any more."""
        self._weights = {n.node_id: n.storage_capacity for n in cluster.nodes}
        self.store_latency = StoreLatency()
        """STORE round trips per storage node, shared by every log's sequencer here."""
        self.producer_lookups_count: collections.Counter[bool] = collections.Counter()
        """Producer lookups that succeeded (True) and failed (False), for /metrics."""
        self.recovery_phases_count: collections.Counter[str] = collections.Counter()
        """How often log recoveries entered each phase (SEALING counts attempts, DONE and
        PREEMPTED the ends), for /metrics."""
        self._unavailable: frozenset[NodeId] = frozenset()
        self._retired: frozenset[NodeId] = frozenset()
        self._moved: frozenset[NodeId] = frozenset()
        self._storage_nodes: tuple[NodeId, ...] = ()
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._broadcast_dirty: set[LogId] = set()
        """Logs the next periodic broadcast visits (``Sequencer.release_broadcast_due``)."""
        self._idle_checks: list[tuple[int, LogId, Epoch]] = []
        """Heap of (when, log, epoch): when an active sequencer may next be idle long enough
        to deactivate. One entry per activation, pushed back while the log is busy."""
        self._idle_task: asyncio.Task[None] | None = None
        self._deactivating: dict[LogId, asyncio.Task[None]] = {}
        """Clean-marks of deactivated epochs still being written: the log's next activation
        waits for its mark, so that it finds the epoch clean."""
        self._idle_marks = asyncio.Semaphore(IDLE_MARKS_IN_FLIGHT_MAX)
        self.deactivations_count = 0
        """Sequencers deactivated for idleness, for /metrics and tests."""
        self._driver = EffectDriver(
            _RuntimePorts(self), now_ms=clock.now_ms, applied=self._after_apply,
            send_store=transport.request, waiters=self._waiters, deliver=_deliver,
            recovery_request_timeout_ms=config.recovery_request_timeout_ms,
            store_batch_stores_max=config.store_batch_stores_max,
            arm_timer=self._arm_timer if config.shared_waves else None, track_released=True)
        """Carries out the cores' effects (``sequencer.handlers``, shared with the
        deterministic simulation)."""

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, looked up once: ``asyncio.get_running_loop()`` makes a getpid()
        system call each time on Python 3.11, which was a tenth of the sequencer's CPU per
        append."""
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    def update_cluster(self, cluster: ClusterConfig) -> None:
        """Nodes were added or reweighted (services.membership): new logs get the new default
        nodeset, copysets the new capacities."""
        added = [n for n in cluster.storage_node_ids if n not in self.cluster.storage_node_ids]
        self.cluster = cluster
        self._weights = {n.node_id: n.storage_capacity for n in cluster.nodes}
        if added and not self._closing:
            self._spawn(self._grow_when_reachable(added))

    async def _grow_when_reachable(self, added: list[NodeId]) -> None:
        """Connect to the added storage nodes first (one small request each, for at most
        ``NODESET_GROW_CONNECT_MS``), then grow the nodesets: the first STOREs to a node
        that is still being connected to time out, and a timed-out node is graylisted for
        ``graylist_duration_ms``, so the logs would avoid it just after taking it."""
        deadline_s = self._loop.time() + NODESET_GROW_CONNECT_MS / 1000
        for node in added:
            while self._loop.time() < deadline_s:
                reply = await self.transport.call(node, GetLogState(log_id=LogId(1)),
                                                  NODESET_GROW_CONNECT_MS)
                if not isinstance(reply, Status):
                    break
                await asyncio.sleep(0.1)
        self._grow_nodesets()

    def _nodeset_target(self, log_id: LogId) -> NodesetTarget:
        return nodeset_target(log_id, self.cluster, retired=self._retired,
                              unavailable=self._unavailable)

    def _grow_nodesets(self) -> None:
        """Storage nodes were added: every active log whose nodeset is smaller than the one
        wanted (``sequencer.core.nodeset_target``) finishes its epoch and takes a new one on
        the grown nodeset, as a drain moves logs off a node."""
        now_ms = self.clock.now_ms()
        storage = len(self.cluster.storage_node_ids)
        for sequencer in list(self.sequencers.values()):
            metadata = sequencer.metadata
            if metadata is None or not may_grow(self.cluster.nodeset_size,
                                                metadata.replication_factor,
                                                len(metadata.nodeset), storage):
                continue
            target = self._nodeset_target(sequencer.log_id)
            if next_nodeset(metadata, self._retired, target) == metadata.nodeset:
                continue
            log.info("log %d: storage nodes were added: moving to a new epoch on a larger "
                     "nodeset", sequencer.log_id)
            self._apply(sequencer, sequencer.on_nodes_retired(self._retired, now_ms, target))

    async def start(self) -> None:
        self._broadcast_task = asyncio.create_task(self._broadcast_loop())
        self._expiry_task = asyncio.create_task(self._expiry_loop())
        self._idle_task = asyncio.create_task(self._idle_loop())

    # ---- public API ----------------------------------------------------------------------

    def append_nowait(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
        producer: tuple[str, int] | None, done: AppendDone, *, compression: int = 0,
        records: int = 0,
    ) -> None:
        """Stage one append (a record, or an atomic batch); ``done`` gets its answer exactly
        once: from a later loop iteration, or at once when the node is shutting down.

        Statuses: OK, SEQNOBUFS, NOSEQUENCER, NOTFOUND, TOOBIG, TIMEDOUT (not confirmed within
        ``append_timeout_ms``: outcome unknown; its appender keeps trying), SHUTDOWN; with
        ``producer`` (``(producer_id, producer_seq)``) also STALE and NOTREADY.
        ``compression``/``records``: ``payloads`` is one validated compressed batch
        (``shared.compression``) of ``records`` records."""
        if self._closing:
            _deliver(done, _SHUTTING_DOWN)
            return
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        self._waiters[request_id] = done
        batch = self._expiry_batch
        if batch is None:
            # Appends of one loop iteration share a deadline (the first one's: the others'
            # come at most one iteration early), so expiry costs one entry per iteration; and
            # a timestamp, as the appends of one appender do anyway (its first one's).
            batch = self._expiry_batch = []
            self._expiries.append((self._loop.time() + self._append_timeout_s, batch))
            self._batch_wall_ms = self.clock.wall_ms()
        batch.append(request_id)
        self._stage(log_id, PendingAppend(request_id, payloads, key, self._batch_wall_ms,
                                          producer, compression, records))

    async def append(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
        producer: tuple[str, int] | None = None, *, compression: int = 0, records: int = 0,
    ) -> AppendResult | AppendReply:
        """``append_nowait`` as a coroutine."""
        future: asyncio.Future[AppendResult | AppendReply] = self._loop.create_future()

        def done(result: AppendResult | AppendReply) -> None:
            if not future.done():
                future.set_result(result)

        self.append_nowait(log_id, payloads, key, producer, done, compression=compression,
                           records=records)
        return await future

    def _stage(self, log_id: LogId, pending: PendingAppend) -> None:
        group_key = (log_id, pending.key)
        # A compressed batch counts its records, and its blob's bytes (what a STORE carries).
        payloads = pending.payloads
        if len(payloads) == 1:
            size = len(payloads[0])
            records = pending.records if pending.compression else 1
        else:
            size = sum(map(len, payloads))
            records = pending.records if pending.compression else len(payloads)
        staged_records, staged_size = self._staged_size.get(group_key, _NOTHING_STAGED)
        if staged_records and (
            staged_records + records > self.config.append_group_records_max
            or staged_size + size > self.config.append_group_bytes_max
        ):
            # Never grow a group past the limits: one append alone may reach them, never more.
            self._flush_group(group_key)
            # (Its answers' callbacks may have staged more already.)
            staged_records, staged_size = self._staged_size.get(group_key, _NOTHING_STAGED)
        group = self._staged.get(group_key)
        if group is None:
            self._staged[group_key] = [pending]
        else:
            group.append(pending)
        self._staged_size[group_key] = (staged_records + records, staged_size + size)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_staged)

    @property
    def shared_wave_counts(self) -> tuple[int, int, int]:
        """Shared first waves (``sequencer.core.shared_wave``) sent, completed, and handed
        back to their logs, since the start."""
        sent, completed, dissolved = self._driver.wave_counts
        return sent, completed, dissolved

    def _arm_timer(self, due_ms: int, callback: Callable[[], None]) -> None:
        """A shared first wave's store timeout (``sequencer.core.shared_wave``); nothing
        once the runtime is closed (its per-log timers are cancelled then too)."""
        def fire() -> None:
            if not self._stopped:
                callback()

        self._loop.call_later(max(0.0, (due_ms - self.clock.now_ms()) / 1000), fire)

    def _flush_staged(self) -> None:
        self._flush_scheduled = False
        self._expiry_batch = None
        driver = self._driver
        driver.flushing = True
        staged, self._staged = self._staged, {}
        self._staged_size.clear()
        try:
            # The appends of different logs of this iteration may share their first wave.
            driver.append_groups([(self._sequencer(log_id), group)
                                  for (log_id, _), group in staged.items()],
                                 self.clock.now_ms())
        finally:
            driver.flushing = False
        # The STOREs of every log's appends of this iteration leave together, now (issue 15:
        # with many logs, a frame and a reply callback per record was the sequencer's cost).
        driver.flush()

    def _flush_group(self, group_key: tuple[LogId, str | None]) -> None:
        group = self._staged.pop(group_key, None)
        self._staged_size.pop(group_key, None)
        if group:
            sequencer = self._sequencer(group_key[0])
            self._apply(sequencer, sequencer.on_append_group(group, self.clock.now_ms()))

    async def _expiry_loop(self) -> None:
        """Answer TIMEDOUT (outcome unknown) to appends unconfirmed after append_timeout_ms;
        their appenders keep trying. Every append has the same timeout, so the queue is in
        deadline order."""
        interval_s = min(self.config.append_timeout_ms / 1000, 0.05)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            now_s = loop.time()
            expiries = self._expiries
            while expiries and expiries[0][0] <= now_s:
                if expiries[0][1] is self._expiry_batch:
                    self._expiry_batch = None  # a timeout shorter than one loop iteration
                for request_id in expiries.popleft()[1]:
                    done = self._waiters.pop(request_id, None)
                    if done is not None:
                        _deliver(done, AppendResult(
                            Status.TIMEDOUT, Lsn(0), Lsn(0), 0,
                            "append not confirmed in time; outcome unknown"))

    def request_activation(self, log_id: LogId) -> None:
        """Activate the log's sequencer if it is not active, with no append (see
        ``Sequencer.on_activate_request``)."""
        if self._closing:
            return
        sequencer = self._sequencer(log_id)
        self._apply(sequencer, sequencer.on_activate_request(self.clock.now_ms()))

    def release_lsn(self, log_id: LogId) -> Lsn:
        sequencer = self.sequencers.get(log_id)
        return sequencer.release_lsn if sequencer is not None else Lsn(0)

    def epoch(self, log_id: LogId) -> Epoch:
        sequencer = self.sequencers.get(log_id)
        return sequencer.epoch if sequencer is not None else Epoch(0)

    def inflight_tail(self, log_id: LogId) -> Lsn:
        """``Sequencer.inflight_tail`` (rebuilding's walk bound)."""
        sequencer = self.sequencers.get(log_id)
        return sequencer.inflight_tail() if sequencer is not None else Lsn(0)

    def active_tails(self) -> list[tuple[LogId, Lsn, Lsn]]:
        """``(log, release_lsn, inflight_tail)`` of every active log here: only an active
        sequencer acknowledges appends (rebuilding's plan)."""
        return [(log_id, s.release_lsn, s.inflight_tail())
                for log_id, s in self.sequencers.items() if s.state is SequencerState.ACTIVE]

    def is_active(self, log_id: LogId) -> bool:
        sequencer = self.sequencers.get(log_id)
        return sequencer is not None and sequencer.state is SequencerState.ACTIVE

    async def wait_release_above(self, log_id: LogId, lsn: Lsn, timeout_s: float) -> None:
        """Return once this node's release pointer of the log passes ``lsn``, or at timeout."""
        if self.release_lsn(log_id) > lsn or timeout_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.release_lsn(log_id) <= lsn:
                    # A fresh event each round: a set one is popped by ReleaseAdvanced, and
                    # awaiting an event that is already set would never yield to the loop.
                    event = self._release_events.setdefault(log_id, asyncio.Event())
                    await event.wait()

    def set_unavailable_nodes(self, nodes: frozenset[NodeId]) -> None:
        """Storage nodes the failure detector reports DEAD; copyset selection skips them."""
        if nodes == self._unavailable:
            return
        self._unavailable = nodes
        for sequencer in self.sequencers.values():
            sequencer.set_unavailable_nodes(nodes)

    def set_shard_states(self, retired: frozenset[NodeId], moved: frozenset[NodeId],
                         storage_nodes: tuple[NodeId, ...]) -> None:
        """From the cluster state (``services.shard_watch``): ``retired`` storage nodes take
        no new copies (DRAINING, DRAINED, REMOVED), ``moved`` ones hold none any more
        (DRAINED, REMOVED). Every active log whose nodeset holds a retired node finishes its
        epoch and moves to a new one without it (``Sequencer.on_nodes_retired``); later
        activations leave retired nodes out of the epoch they take."""
        if (moved, storage_nodes) != (self._moved, self._storage_nodes):
            # Only on a change: this runs every second, and a node may hold a million logs.
            self._moved, self._storage_nodes = moved, storage_nodes
            for sequencer in self.sequencers.values():
                sequencer.moved_nodes, sequencer.storage_nodes = moved, storage_nodes
        if retired == self._retired:
            return
        self._retired = retired
        now_ms = self.clock.now_ms()
        storage = len(self.cluster.storage_node_ids)
        for sequencer in list(self.sequencers.values()):
            metadata = sequencer.metadata
            target = None
            if metadata is not None and not retired.isdisjoint(metadata.nodeset):
                # Only a log that loses nodes may take others in their place (ranking the
                # candidates hashes every storage node: not for each of a million logs).
                kept = len(set(metadata.nodeset) - retired)
                if may_grow(self.cluster.nodeset_size, metadata.replication_factor, kept,
                            storage):
                    target = self._nodeset_target(sequencer.log_id)
            effects = sequencer.on_nodes_retired(retired, now_ms, target)
            if effects:
                log.info("log %d: storage nodes %s leave its nodeset: moving to a new epoch",
                         sequencer.log_id, ",".join(sorted(retired)))
                self._apply(sequencer, effects)

    # ---- effects -------------------------------------------------------------------------

    def _sequencer(self, log_id: LogId) -> Sequencer:
        sequencer = self.sequencers.get(log_id)
        if sequencer is None:
            sequencer = Sequencer(log_id=log_id, node_id=self.node_id, config=self.config,
                                  rng=self.rng, weights=self._weights,
                                  store_latency=self.store_latency)
            sequencer.set_unavailable_nodes(self._unavailable)
            sequencer.moved_nodes, sequencer.storage_nodes = self._moved, self._storage_nodes
            self.sequencers[log_id] = sequencer
        return sequencer

    def _apply(self, sequencer: Sequencer, effects: list[Any]) -> None:
        self._driver.apply(sequencer, effects)

    def _after_apply(self, sequencer: Sequencer) -> None:
        """After every batch of a core's effects: re-arm its timer, wake what waits for it."""
        self._rearm(sequencer)
        if self._releasable_events and sequencer.releasable:
            event = self._releasable_events.pop(sequencer.log_id, None)
            if event is not None:
                event.set()
        if self._closing:
            self._note_drained()

    def _note_drained(self) -> None:
        # Walks every log: once drained, never again (with 10,000 logs, walking them on each
        # effect applied while stopping took longer than the shutdown bound).
        if not self._drained.is_set() and not any(s.appenders for s in self.sequencers.values()):
            self._drained.set()

    def _send(self, sequencer: Sequencer, effect: Send) -> None:
        self._driver.send(sequencer, effect)

    async def _write_lce(self, sequencer: Sequencer, effect: WriteLastCleanEpoch) -> None:
        stored = Epoch(0)
        try:
            async with asyncio.timeout(self.config.activation_timeout_ms / 1000):
                status = await self.epoch_store.set_last_clean_epoch(
                    effect.log_id, effect.epoch, effect.tail_lsn)
                if status is Status.STALE:
                    read_status, lce = await self.epoch_store.get_last_clean_epoch(
                        effect.log_id)
                    if read_status is Status.OK and lce is not None:
                        stored = lce.epoch
        except TimeoutError:
            status = Status.TIMEDOUT
        except Exception:
            log.exception("log %d: writing the last clean epoch failed", effect.log_id)
            status = Status.INTERNAL
        log.info("log %d: last clean epoch -> %d (tail %d): %s", effect.log_id, effect.epoch,
                 effect.tail_lsn, status.name)
        self._apply(sequencer, sequencer.on_lce_written(status, stored, self.clock.now_ms()))

    async def _activate(self, sequencer: Sequencer) -> None:
        log_id = sequencer.log_id
        marking = self._deactivating.get(log_id)
        if marking is not None:
            # The previous sequencer of this log was deactivated: once its epoch is marked
            # clean, this activation needs no recovery.
            await asyncio.wait({marking}, timeout=self.config.activation_timeout_ms / 1000)
        provision = None
        if self.provision_on_append:
            provision = ProvisionSpec(nodeset=self.cluster.default_nodeset(),
                                      replication_factor=self.cluster.replication_factor)
        try:
            async with asyncio.timeout(self.config.activation_timeout_ms / 1000):
                status, epoch, metadata = await self.epoch_store.activate(
                    log_id, writer=self.node_id, provision=provision, retired=self._retired,
                    target=self._nodeset_target(log_id))
                lce = None
                if status is Status.OK:
                    status, lce = await self.epoch_store.get_last_clean_epoch(log_id)
        except TimeoutError:
            log.warning("activation of log %d timed out", log_id)
            status, epoch, metadata, lce = Status.TIMEDOUT, Epoch(0), None, None
        except Exception:
            log.exception("activation of log %d failed", log_id)
            status, epoch, metadata, lce = Status.INTERNAL, Epoch(0), None, None
        if status is Status.OK and (epoch <= sequencer.epoch or metadata is None
                                    or not metadata.nodeset):
            log.error("log %d: the epoch store answered epoch %d with %r after epoch %d",
                      log_id, epoch, metadata, sequencer.epoch)
            status = Status.INTERNAL
        if status is Status.OK:
            failpoints.hit("sequencer.after_epoch_bump")
            log.info("log %d: sequencer active in epoch %d (last clean epoch %d)",
                     log_id, epoch, lce.epoch if lce else -1)
        self._apply(sequencer, sequencer.on_activated(status, epoch, metadata, lce,
                                                      self.clock.now_ms()))
        if status is Status.OK and metadata is not None and (self._retired or may_grow(
                self.cluster.nodeset_size, metadata.replication_factor,
                len(metadata.nodeset), len(self.cluster.storage_node_ids))):
            # A drain that began, or storage nodes added, while this activation was under
            # way: move on at once.
            self._apply(sequencer, sequencer.on_nodes_retired(
                self._retired, self.clock.now_ms(), self._nodeset_target(log_id)))
        if sequencer.idle_unavailable() and self.sequencers.get(log_id) is sequencer:
            # Nothing to remember: a log id that never activated (e.g. NOTFOUND).
            del self.sequencers[log_id]
        self._watch_idle(sequencer)

    async def _fetch_producer(self, sequencer: Sequencer, effect: FetchProducer) -> None:
        entries: list[tuple[int, int, int, int]] | None = None
        try:
            async with asyncio.timeout(self.config.producer_lookup_timeout_ms / 1000):
                entries = await self._lookup_producer(sequencer, effect)
        except TimeoutError:
            log.warning("log %d: lookup of producer %r timed out", effect.log_id,
                        effect.producer_id)
        except Exception:
            log.exception("log %d: lookup of producer %r failed", effect.log_id,
                          effect.producer_id)
        self.producer_lookups_count[entries is not None] += 1
        self._apply(sequencer, sequencer.on_producer_fetched(
            effect.epoch, effect.producer_id, entries, self.clock.now_ms()))

    async def _lookup_producer(self, sequencer: Sequencer,
                               effect: FetchProducer) -> list[tuple[int, int, int, int]] | None:
        log_id = effect.log_id
        # Until earlier epochs are recovered, an append of the producer may sit on fewer than
        # R nodes, where an f-majority of answers can miss it.
        while not sequencer.releasable:
            if sequencer.epoch != effect.epoch:
                return None
            await self._releasable_events.setdefault(log_id, asyncio.Event()).wait()
        metadata = sequencer.metadata
        if sequencer.epoch != effect.epoch or metadata is None:
            return None

        async def wait_release_above(lsn: Lsn) -> None:
            await self.wait_release_above(log_id, lsn,
                                          self.config.producer_lookup_timeout_ms / 1000)

        return await lookup_producer(
            transport=self.transport, metadata=metadata, producer_id=effect.producer_id,
            epoch=effect.epoch, release_lsn=lambda: sequencer.release_lsn,
            wait_release_above=wait_release_above,
            spans=metadata_spans(metadata, self._moved, self._storage_nodes))

    # ---- timers --------------------------------------------------------------------------

    def _rearm(self, sequencer: Sequencer) -> None:
        deadline_ms = sequencer.deadline_ms()
        log_id = sequencer.log_id
        if deadline_ms is None:
            # Nothing due: the log's heap entry, if any, is stale now (skipped when it fires;
            # with many logs most appends leave one behind).
            if self._timer_due:
                self._timer_due.pop(log_id, None)
            return
        due_ms = self._timer_due.get(log_id)
        if due_ms is not None and (deadline_ms is None or due_ms < deadline_ms):
            timers = self._timers
            if due_ms == self._armed_ms and timers[0] == (due_ms, log_id):
                # The armed deadline, this log's, moved later or went away (its STOREs were
                # answered, or carried the release pointer owed): arm for what comes next
                # instead of waking up for nothing (at 1 append in flight, every other one).
                if deadline_ms is None:
                    heapq.heappop(timers)
                    del self._timer_due[log_id]
                else:
                    heapq.heapreplace(timers, (deadline_ms, log_id))
                    self._timer_due[log_id] = deadline_ms
                if timers:
                    self._arm(timers[0][0])
                elif self._timer_handle is not None:
                    self._timer_handle.cancel()
                    self._timer_handle, self._armed_ms = None, None
            # Otherwise that entry fires first; on_timer then finds the log's next deadline.
            return
        if deadline_ms is None or due_ms == deadline_ms:
            return
        self._timer_due[log_id] = deadline_ms
        heapq.heappush(self._timers, (deadline_ms, log_id))
        if self._armed_ms is None or deadline_ms < self._armed_ms:
            self._arm(deadline_ms)

    def _arm(self, deadline_ms: int) -> None:
        if self._timer_handle is not None:
            self._timer_handle.cancel()
        self._armed_ms = deadline_ms
        delay_s = max(deadline_ms - self.clock.now_ms(), 0) / 1000
        self._timer_handle = self._loop.call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer_handle, self._armed_ms = None, None
        now_ms = self.clock.now_ms()
        due: set[LogId] = set()
        timer_due = self._timer_due
        while self._timers and self._timers[0][0] <= now_ms:
            entry_ms, log_id = heapq.heappop(self._timers)
            if timer_due.get(log_id) == entry_ms:
                # The log's earliest entry (any other is stale: its deadline passed, or it was
                # superseded by an earlier one, whose handling re-arms the log).
                del timer_due[log_id]
                due.add(log_id)
        for log_id in due:
            sequencer = self.sequencers.get(log_id)
            if sequencer is None:
                continue  # a stale deadline of a deactivated log
            deadline_ms = sequencer.deadline_ms()
            if deadline_ms is not None and deadline_ms > now_ms:
                # Stale (its appender finished in time, as most do): only the next deadline.
                self._rearm(sequencer)
            elif deadline_ms is not None:
                self._apply(sequencer, sequencer.on_timer(now_ms))
        if self._timers and self._armed_ms is None:
            self._arm(self._timers[0][0])

    # ---- background ----------------------------------------------------------------------

    async def _broadcast_loop(self) -> None:
        interval_s = self.config.release_broadcast_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self._broadcast_due()

    async def _broadcast_due(self) -> None:
        """One periodic broadcast: only the logs with something to tell, in chunks. A log
        whose RELEASEs (``EffectDriver.released``) told every node of its nodeset its
        current pointer since the previous broadcast is not told again now, and gets one
        broadcast more instead of three (``Sequencer.release_broadcast_told``): with many
        busy logs nearly every log has moved since the previous broadcast, and re-sending
        every pointer three times was a sixth of the sequencer's time at 10,000 logs
        (issue 15)."""
        dirty, self._broadcast_dirty = self._broadcast_dirty, set()
        released = self._driver.released
        if released:
            self._driver.released = {}
        for index, log_id in enumerate(dirty):
            if index and index % LOGS_PER_LOOP_TURN_MAX == 0:
                await asyncio.sleep(0)
            sequencer = self.sequencers.get(log_id)
            if sequencer is None:
                continue
            told = released.get(log_id) if released else None
            if told is not None and sequencer.release_broadcast_told(*told):
                if sequencer.release_broadcast_due():
                    self._broadcast_dirty.add(log_id)
                continue
            self._apply(sequencer, sequencer.release_broadcast())
            if self._driver.released:
                # The broadcast's own RELEASEs are not a reason to skip the next one.
                self._driver.released.pop(log_id, None)
            if sequencer.release_broadcast_due():
                self._broadcast_dirty.add(log_id)

    def _watch_idle(self, sequencer: Sequencer) -> None:
        due_ms = sequencer.idle_deadline_ms()
        if due_ms is not None:
            heapq.heappush(self._idle_checks, (due_ms, sequencer.log_id, sequencer.epoch))

    async def _idle_loop(self) -> None:
        """Deactivate sequencers idle for ``idle_deactivate_ms``; looks only at the logs whose
        time has come (a heap), a chunk per loop turn."""
        interval_s = min(max(self.config.idle_deactivate_ms / 4, 10), 1_000) / 1000
        while True:
            await asyncio.sleep(interval_s)
            handled = 0
            checks = self._idle_checks
            while checks and checks[0][0] <= self.clock.now_ms() and not self._closing:
                _, log_id, epoch = heapq.heappop(checks)
                sequencer = self.sequencers.get(log_id)
                if sequencer is None or sequencer.epoch != epoch:
                    continue  # gone, or watched again by its newer activation
                self._check_idle(sequencer)
                handled += 1
                if handled % LOGS_PER_LOOP_TURN_MAX == 0:
                    await asyncio.sleep(0)

    def _check_idle(self, sequencer: Sequencer) -> None:
        now_ms = self.clock.now_ms()
        due_ms = sequencer.idle_deadline_ms()
        if due_ms is None:
            return  # not active: its next activation watches it again
        if due_ms > now_ms:
            heapq.heappush(self._idle_checks, (due_ms, sequencer.log_id, sequencer.epoch))
            return
        tail = sequencer.idle_clean_tail(now_ms)
        if tail is None:
            # Idle but something is still owed or in flight: look again a little later.
            heapq.heappush(self._idle_checks, (
                now_ms + self.config.release_broadcast_interval_ms, sequencer.log_id,
                sequencer.epoch))
            return
        self._deactivate(sequencer, tail)

    def _deactivate(self, sequencer: Sequencer, tail: Lsn) -> None:
        """Drop an idle, drained sequencer: every nodeset node is told the final release
        pointer, and the epoch is marked clean with ``tail`` (what a graceful drain does for
        one log)."""
        log_id = sequencer.log_id
        del self.sequencers[log_id]
        self._broadcast_dirty.discard(log_id)
        self.deactivations_count += 1
        for event in (self._release_events.pop(log_id, None),
                      self._releasable_events.pop(log_id, None)):
            if event is not None:
                event.set()
        for effect in sequencer.release_broadcast(final=True):
            self._send(sequencer, effect)
        task = asyncio.create_task(self._mark_idle_clean(sequencer, tail))
        self._deactivating[log_id] = task
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if self._deactivating.get(log_id) is finished:
                del self._deactivating[log_id]

        task.add_done_callback(done)

    async def _mark_idle_clean(self, sequencer: Sequencer, tail: Lsn) -> None:
        try:
            async with self._idle_marks, asyncio.timeout(
                    self.config.activation_timeout_ms / 1000):
                await self._mark_clean(sequencer, tail)
        except TimeoutError:
            # The next activation then recovers the epoch (nothing is lost, it costs time).
            log.warning("log %d: marking idle epoch %d clean timed out", sequencer.log_id,
                        sequencer.epoch)
        except Exception:
            log.exception("log %d: marking idle epoch %d clean failed", sequencer.log_id,
                          sequencer.epoch)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float) -> None:
        """Stop taking appends, let in-flight ones finish (until ``timeout_s``), then mark
        every fully drained epoch clean in the epoch store, so that the next sequencer of those
        logs releases at once. The tail stored with the last clean epoch is the authority: the
        next sequencer starts its release pointer there and tells every storage node, so the
        final RELEASE broadcast here is only a courtesy to readers in between."""
        self._closing = True
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        self._note_drained()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._drained.wait()
        drained = [(s, tail) for s in self.sequencers.values()
                   if (tail := s.drained_clean_tail()) is not None]
        for sequencer, _ in drained:
            # Only sends: not through _apply, which looks at every log when closing.
            for effect in sequencer.release_broadcast(final=True):
                self._send(sequencer, effect)
        self._driver.flush()
        marking = list(self._deactivating.values())  # idle epochs being marked clean
        if not drained and not marking:
            return
        remaining_s = max(deadline_s - loop.time(), DRAIN_MARK_CLEAN_TIMEOUT_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining_s):
                await asyncio.gather(*(self._mark_clean(s, tail) for s, tail in drained),
                                     *marking)

    async def _mark_clean(self, sequencer: Sequencer, tail: Lsn) -> None:
        status = await self.epoch_store.set_last_clean_epoch(
            sequencer.log_id, sequencer.epoch, tail)
        log.info("log %d: epoch %d drained, marked clean with tail %d: %s",
                 sequencer.log_id, sequencer.epoch, tail, status.name)

    async def close(self) -> None:
        self._closing = True
        self._stopped = True
        if self._timer_handle is not None:
            self._timer_handle.cancel()
        tasks = [t for t in (self._broadcast_task, self._expiry_task, self._idle_task,
                             *self._tasks)
                 if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # An append that got an LSN may have been stored: its outcome is unknown.
        with_lsn = {request_id for s in self.sequencers.values()
                    for a in s.appenders.values() for request_id, _ in a.requests}
        waiters = dict(self._waiters)
        self._waiters.clear()  # in place: the effect driver holds this dict
        for request_id, done in waiters.items():
            if request_id in with_lsn:
                _deliver(done, AppendResult(Status.TIMEDOUT, Lsn(0), Lsn(0), 0,
                                            "shutting down; outcome unknown"))
            else:
                _deliver(done, AppendResult(Status.SHUTDOWN, Lsn(0), Lsn(0), 0,
                                            "shutting down; nothing was written"))
