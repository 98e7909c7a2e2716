"""The sequencer of one log: activation, the current epoch's window and appenders, the release
pointer, and preemption.

States (forward-only within one activation; PREEMPTED or a failed activation leads to a new
one):
- UNAVAILABLE: no epoch yet. The first append asks the driver to activate.
- ACTIVATING: waiting for the epoch store. Appends wait in a bounded queue.
- ACTIVE: running ``epoch``; appends get LSNs from its sliding window.
- PREEMPTED: a storage node reported a seal of our epoch by a newer sequencer. In-flight
  appends end with TIMEDOUT (outcome unknown); the next append reactivates in a new epoch.

An ACTIVE sequencer idle for ``idle_deactivate_ms`` with nothing in flight or owed
(``idle_clean_tail``) may be deactivated by its driver: the epoch is marked clean with that
tail and the object dropped, so that the next append's new sequencer needs no recovery.

Release: records of the current epoch are released only when every earlier epoch is clean
(the epoch store's last clean epoch is ``epoch - 1``). When it is not, activation starts epoch
recovery (``sequencer.core.recovery``) of the unclean epochs: appends are taken and stored
meanwhile, and released once recovery has advanced the last clean epoch. Once every earlier
epoch is clean, a purge (``sequencer.core.purge``) settles the nodes that missed a CLEAN.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sequencer.core.appender import Appender, AppenderResult
from sequencer.core.effects import (
    ActivateEpoch,
    AppendReply,
    FetchLogState,
    FetchProducer,
    append_ok,
    release_advanced,
)
from sequencer.core.nodeset_state import NodesetState
from sequencer.core.producers import ProducerTable, Verdict
from sequencer.core.purge import PurgeCoordinator
from sequencer.core.recovery import LogRecovery, Phase
from sequencer.core.sliding_window import SlidingWindow
from sequencer.core.store_timeout import StoreLatency
from shared.config import SequencerConfig
from shared.effects import Send, send_of
from shared.epoch_metadata import LastCleanEpoch, LogMetadata, NodesetTarget, next_nodeset
from shared.limits import PRODUCER_SEQS_KEPT
from shared.ports import Rng
from shared.read_round import metadata_spans, nodes_of_epochs
from shared.status import Status
from shared.types import (
    ESN_MAX,
    Epoch,
    Esn,
    LogId,
    Lsn,
    NodeId,
    compose_lsn,
    lsn_to_epoch,
    lsn_to_esn,
)
from shared.wire.recovery import Clean
from shared.wire.release import Release, release_of
from shared.wire.store import ProducerTag, Store

Effect = Any
RELEASE_BROADCASTS_PER_MOVE = 3
"""Periodic broadcasts that carry a log's release pointer after it moved: more than one, since
a RELEASE is one-way and may be lost; after that an idle log is left alone (a node that missed
all of them still learns the pointer from the next STORE, RELEASE or a reader's READ)."""

RELEASE_BROADCASTS_AFTER_TOLD = 1
"""Periodic broadcasts still owed once RELEASEs told the whole nodeset the current pointer
(``release_broadcast_told``): one, in case one of them was lost."""


class SequencerState(Enum):
    UNAVAILABLE = "UNAVAILABLE"
    ACTIVATING = "ACTIVATING"
    ACTIVE = "ACTIVE"
    PREEMPTED = "PREEMPTED"


@dataclass(slots=True)
class PendingAppend:
    request_id: int
    payloads: tuple[bytes, ...]
    key: str | None
    timestamp_ms: int
    producer: tuple[str, int] | None = None
    """``(producer_id, producer_seq)`` of an idempotent append."""
    compression: int = 0
    """A compressed batch (``shared.compression``): ``payloads`` is ``(blob,)`` holding
    ``records`` records, validated where it entered the cluster. It gets one LSN per record
    and goes to storage as one blob, alone in its appender (blobs are never merged)."""
    records: int = 0

    @property
    def records_count(self) -> int:
        return self.records if self.compression else len(self.payloads)


class Sequencer:
    def __init__(
        self,
        *,
        log_id: LogId,
        node_id: NodeId,
        config: SequencerConfig,
        rng: Rng,
        weights: dict[NodeId, float] | None = None,
        esn_max: Esn = ESN_MAX,
        store_latency: StoreLatency | None = None,
    ) -> None:
        self.log_id = log_id
        self.node_id = node_id
        self.config = config
        self.rng = rng
        self.weights = weights
        self.esn_max = esn_max
        self.state = SequencerState.UNAVAILABLE
        self.epoch = Epoch(0)
        self.metadata: LogMetadata | None = None
        self.release_lsn = Lsn(0)
        self.releasable = False
        """True when every epoch before ``epoch`` is clean, so this epoch may release."""
        self.sealed_epoch = Epoch(0)
        self.sealed_by: NodeId | None = None
        self.window: SlidingWindow | None = None
        self.nodeset: NodesetState | None = None
        self.appenders: dict[Esn, Appender] = {}
        self._timers: list[tuple[int, int, int]] = []  # (deadline_ms, first_esn, wave)
        self.store_latency = store_latency or StoreLatency()
        """The storage nodes' STORE round trips, which the first wave's timeout follows
        (shared by the sequencers of one process: the same disks serve every log)."""
        self._release_owed: set[NodeId] = set()
        """Copyset nodes not yet told the current release pointer (see release_delay_ms)."""
        self._release_due_ms: int | None = None
        self._pending: deque[PendingAppend] = deque()
        self._unavailable: frozenset[NodeId] = frozenset()
        self._drain_until_ms: int | None = None
        """While set, the epoch ran out of ESNs and drains before the next one: new appends
        wait for it, and at this time whatever is still in flight is given up."""
        self.recovery: LogRecovery | None = None
        self.purge: PurgeCoordinator | None = None
        """Settles nodes that missed a CLEAN of an earlier epoch, once every earlier epoch is
        clean (``sequencer.core.purge``)."""
        self.producers: ProducerTable[PendingAppend] = ProducerTable(
            config.producers_per_log_max)
        """Idempotent appends: each producer's latest ones (``sequencer.core.producers``)."""
        self._producer_of: dict[int, tuple[str, int]] = {}
        """Request id -> producer pair, for idempotent appends in flight."""
        self.last_append_ms = 0
        """When the latest append arrived (for idle deactivation)."""
        self.timestamp_floor_ms = 0
        """The highest record timestamp given so far: a record never gets a lower one than
        a record before it, so that timestamps do not fall along LSNs (an append that waited
        for activation or a producer lookup keeps its arrival time otherwise), which age
        retention on the storage nodes relies on (``storage_node.core.retention``)."""
        self._release_broadcasts_owed = 0
        """Periodic broadcasts still owed the current release pointer (see
        ``RELEASE_BROADCASTS_PER_MOVE``)."""
        self.moved_nodes: frozenset[NodeId] = frozenset()
        """Storage nodes whose copies were all moved elsewhere (DRAINED, REMOVED); set by the
        driver with ``storage_nodes`` (every storage node of the cluster): recovery and the
        purge reach each earlier epoch where its copies are (``metadata_spans``)."""
        self.storage_nodes: tuple[NodeId, ...] = ()

    def _earlier_epochs_nodes(self, metadata: LogMetadata, first_epoch: Epoch,
                              epoch: Epoch) -> tuple[NodeId, ...]:
        """Every node that may hold copies of epochs ``first_epoch .. epoch``: the union of
        their nodesets (an f-majority of a superset of a record's nodeset holds one of its R
        copies, and sealing one leaves fewer than R unsealed nodes of any of them)."""
        spans = metadata_spans(metadata, self.moved_nodes, self.storage_nodes)
        return nodes_of_epochs(spans, first_epoch, epoch)

    def on_nodes_retired(self, retired: frozenset[NodeId], now_ms: int,
                         target: NodesetTarget | None = None) -> list[Effect]:
        """The next epoch's nodeset differs from this one: storage nodes of the current
        nodeset take no new copies any more (being drained), or the nodeset wanted
        (``target``: storage nodes were added) is larger. Finish this epoch as an exhausted one
        is finished (its appends complete, up to ``epoch_drain_timeout_ms``; new ones wait)
        and take a new epoch, whose nodeset the activation picks. Nothing if the nodeset
        would stay as it is (fewer than R would remain, nothing to add)."""
        metadata = self.metadata
        if (self.state is not SequencerState.ACTIVE or self._drain_until_ms is not None
                or metadata is None or self.window is None
                or next_nodeset(metadata, retired, target) == metadata.nodeset):
            return []
        if not self.appenders:
            return self._advance_after_drain(True, now_ms)
        self._drain_until_ms = now_ms + self.config.epoch_drain_timeout_ms
        return []

    def set_unavailable_nodes(self, nodes: frozenset[NodeId]) -> None:
        """Storage nodes the failure detector reports DEAD: copysets avoid them."""
        self._unavailable = nodes
        if self.nodeset is not None:
            self.nodeset.unavailable = nodes

    # ---- appends ------------------------------------------------------------------------

    def on_append(
        self, request_id: int, payloads: tuple[bytes, ...], key: str | None, wall_ms: int,
        now_ms: int,
    ) -> list[Effect]:
        return self.on_append_group([PendingAppend(request_id, payloads, key, wall_ms)], now_ms)

    def on_append_group(self, group: list[PendingAppend], now_ms: int) -> list[Effect]:
        """Appends that arrived together (same key): while ACTIVE they share one appender, so
        one STORE per copyset node carries all of them, with consecutive LSNs in group order.
        Each append still gets its own LSNs and its own answer."""
        assert group and all(p.payloads and p.key == group[0].key for p in group)
        self.last_append_ms = now_ms
        if len(group) > 1 and any(p.compression for p in group):
            return self._split_compressed(group, now_ms)
        if self.state is SequencerState.ACTIVE and self._drain_until_ms is None:
            for pending in group:
                if pending.producer is not None:
                    effects: list[Effect] = []
                    group = self._admit_producers(group, effects)
                    if group:
                        effects.extend(self._start_append(group, now_ms))
                    return effects
            return self._start_append(group, now_ms)
        effects = []
        for pending in group:
            if len(self._pending) >= self.config.activation_appends_queued_max:
                effects.append(AppendReply(pending.request_id, Status.SEQNOBUFS,
                                           message="activation queue full"))
            else:
                self._pending.append(pending)
        if self._pending and self.state is not SequencerState.ACTIVATING and (
                self._drain_until_ms is None):
            effects.extend(self._begin_activation(now_ms))
        return effects

    def _split_compressed(self, group: list[PendingAppend], now_ms: int) -> list[Effect]:
        """A compressed batch is its own appender (one STORE per blob): the plain appends
        between them still share theirs, in group order."""
        effects: list[Effect] = []
        run: list[PendingAppend] = []
        for pending in group:
            if pending.compression:
                if run:
                    effects.extend(self.on_append_group(run, now_ms))
                    run = []
                effects.extend(self.on_append_group([pending], now_ms))
            else:
                run.append(pending)
        if run:
            effects.extend(self.on_append_group(run, now_ms))
        return effects

    def _admit_producers(self, group: list[PendingAppend],
                         effects: list[Effect]) -> list[PendingAppend]:
        """The appends of ``group`` to write now; the others are answered (duplicates,
        refusals) or wait (for a lookup, or for the in-flight append they retry)."""
        admitted: list[PendingAppend] = []
        for pending in group:
            if pending.producer is None:
                admitted.append(pending)
                continue
            producer_id, seq = pending.producer
            admission = self.producers.admit(producer_id, seq, pending)
            verdict = admission.verdict
            if verdict is Verdict.NEW:
                self._producer_of[pending.request_id] = pending.producer
                admitted.append(pending)
            elif verdict is Verdict.DUPLICATE:
                assert admission.entry is not None
                _, first_lsn, last_lsn, timestamp_ms = admission.entry
                effects.append(AppendReply(pending.request_id, Status.OK, Lsn(first_lsn),
                                           Lsn(last_lsn), timestamp_ms,
                                           message="duplicate of an earlier append"))
            elif verdict is Verdict.STALE:
                effects.append(AppendReply(
                    pending.request_id, Status.STALE,
                    message=f"producer_seq {seq} is older than the {PRODUCER_SEQS_KEPT} latest "
                            "appends remembered for this producer: whether it was written "
                            "cannot be told"))
            elif verdict is Verdict.LOOKUP:
                effects.append(FetchProducer(self.log_id, self.epoch, producer_id))
            elif verdict is Verdict.BUSY:
                effects.append(AppendReply(
                    pending.request_id, Status.SEQNOBUFS,
                    message="too many producers or retries waiting; nothing written"))
        return admitted

    def on_producer_fetched(self, epoch: Epoch, producer_id: str,
                            entries: list[tuple[int, int, int, int]] | None,
                            now_ms: int) -> list[Effect]:
        """The driver's lookup of ``producer_id`` ended: the producer's verified appends
        ``(producer_seq, first_lsn, last_lsn, timestamp_ms)``, or None if it failed."""
        if epoch != self.epoch:
            return []  # the table was reset since, and the waiting appends answered
        waiting = self.producers.looked_up(producer_id, entries)
        if entries is None:
            return [AppendReply(p.request_id, Status.NOTREADY,
                                message="could not learn this producer's earlier appends; "
                                        "nothing written") for p in waiting]
        effects: list[Effect] = []
        for pending in waiting:
            effects.extend(self.on_append_group([pending], now_ms))
        return effects

    def _settle_producers(self, group: list[PendingAppend], status: Status,
                          effects: list[Effect]) -> None:
        """Appends of ``group`` ended with ``status`` (nothing written): so do their
        retries."""
        for pending in group:
            pair = self._producer_of.pop(pending.request_id, None)
            if pair is not None:
                for joined in self.producers.failed(*pair):
                    effects.append(AppendReply(joined.request_id, status,
                                               message="the original append failed"))

    def on_activate_request(self, now_ms: int) -> list[Effect]:
        """Activate with no append waiting (a reader asked for the tail of a log whose last
        epoch is not clean); nothing if active, activating or draining."""
        if self.state in (SequencerState.UNAVAILABLE, SequencerState.PREEMPTED) and (
                self._drain_until_ms is None):
            return self._begin_activation(now_ms)
        return []

    def _begin_activation(self, now_ms: int) -> list[Effect]:
        self._drain_until_ms = None
        effects = self._abort_epoch("sequencer is reactivating in a new epoch")
        self.recovery = None  # the next epoch's recovery covers this one's too
        self.purge = None  # and the next epoch's purge this one's
        self.state = SequencerState.ACTIVATING
        effects.append(ActivateEpoch(self.log_id))
        return effects

    def _start_append(self, group: list[PendingAppend], now_ms: int) -> list[Effect]:
        window, nodeset, metadata = self.window, self.nodeset, self.metadata
        assert window is not None and nodeset is not None and metadata is not None
        payloads = group[0].payloads if len(group) == 1 else tuple(
            payload for pending in group for payload in pending.payloads)
        compression = group[0].compression
        esn_count = group[0].records if compression else len(payloads)
        if esn_count > window.esns_left():
            # The epoch ran out of ESNs: continue in a new one. Drain this one first (its
            # appends finish; up to epoch_drain_timeout_ms), so that the new epoch's recovery
            # does not cut them off and leave their clients an unknown outcome.
            if self._producer_of:
                group = self._withdraw_producers(group)
            self._pending.extendleft(reversed(group))
            if not self.appenders:
                return self._begin_activation(now_ms)
            if self._drain_until_ms is None:
                self._drain_until_ms = now_ms + self.config.epoch_drain_timeout_ms
            return []
        first_esn = window.grow(esn_count)
        if first_esn is None:
            refused: list[Effect] = [
                AppendReply(p.request_id, Status.SEQNOBUFS, message="window full")
                for p in group]
            if self._producer_of:
                self._settle_producers(group, Status.SEQNOBUFS, refused)
            return refused
        lsn = compose_lsn(self.epoch, first_esn)
        producers: tuple[ProducerTag, ...] = ()
        if self._producer_of:
            producers = _producer_tags(group, lsn)
        timestamp_ms = self.timestamp_floor_ms = max(group[0].timestamp_ms,
                                                     self.timestamp_floor_ms)
        appender = Appender(
            log_id=self.log_id, lsn=lsn, first_esn=first_esn,
            payloads=payloads, key=group[0].key, timestamp_ms=timestamp_ms,
            requests=tuple((p.request_id, p.records_count) for p in group),
            replication=metadata.replication_factor, producers=producers,
            compression=compression, records=esn_count,
        )
        self.appenders[first_esn] = appender
        return self._send_wave(appender, now_ms)

    # ---- appends sharing a wave with other logs' (sequencer.core.shared_wave) -----------

    def start_shared(self, group: list[PendingAppend], now_ms: int) -> Appender | None:
        """``group`` (as for ``on_append_group``) gets its LSNs and appender, whose first wave
        goes out with other logs' appenders of the same moment (one copyset, one timer, one
        answer per node for all of them: ``sequencer.core.shared_wave``); None, nothing
        done, when it cannot (not ACTIVE, draining, idempotent or compressed appends, a
        black- or graylisted node, the window or the epoch's ESNs full): then
        ``on_append_group`` takes it the usual way."""
        window, nodeset, metadata = self.window, self.nodeset, self.metadata
        if (self.state is not SequencerState.ACTIVE or self._drain_until_ms is not None
                or window is None or nodeset is None or metadata is None
                or not nodeset.clean()):
            return None
        for pending in group:
            if pending.producer is not None or pending.compression:
                return None
        payloads = group[0].payloads if len(group) == 1 else tuple(
            payload for pending in group for payload in pending.payloads)
        if len(payloads) > window.esns_left():
            return None
        first_esn = window.grow(len(payloads))
        if first_esn is None:
            return None
        self.last_append_ms = now_ms
        timestamp_ms = self.timestamp_floor_ms = max(group[0].timestamp_ms,
                                                     self.timestamp_floor_ms)
        appender = Appender(
            log_id=self.log_id, lsn=compose_lsn(self.epoch, first_esn), first_esn=first_esn,
            payloads=payloads, key=group[0].key, timestamp_ms=timestamp_ms,
            requests=((group[0].request_id, len(payloads)),) if len(group) == 1 else tuple(
                (p.request_id, len(p.payloads)) for p in group),
            replication=metadata.replication_factor)
        self.appenders[first_esn] = appender
        return appender

    def send_shared(self, appender: Appender, copyset: tuple[NodeId, ...], timeout_ms: int,
                    now_ms: int) -> Store:
        """The STORE of ``appender``'s shared first wave to ``copyset``."""
        assert self.window is not None
        store = appender.send_shared_wave(
            copyset=copyset, timeout_ms=timeout_ms, sequencer_node=self.node_id,
            last_known_good=self.window.lng, release_lsn=self.release_lsn, now_ms=now_ms)
        owed = self._release_owed
        if owed:
            # These STOREs carry the release pointer (as in _send_wave).
            owed.difference_update(copyset)
            if not owed:
                self._release_due_ms = None
        return store

    def send_first_wave(self, appender: Appender, now_ms: int) -> list[Effect]:
        """``appender`` (from ``start_shared``) sends its first wave alone after all."""
        return self._send_wave(appender, now_ms)

    def shared_live(self, appender: Appender) -> bool:
        """Whether ``appender`` is still this sequencer's, in its first wave (not completed,
        not ended by a preemption or a new epoch)."""
        return (self.state is SequencerState.ACTIVE and appender.wave == 1
                and self.appenders.get(appender.first_esn) is appender)

    def complete_shared(self, appender: Appender, copyset: frozenset[NodeId],
                        now_ms: int) -> list[Effect]:
        """Every node of the shared wave's ``copyset`` answered STORED OK for ``appender``."""
        if (self.state is not SequencerState.ACTIVE or appender.wave != 1
                or self.appenders.get(appender.first_esn) is not appender):
            return []
        # What on_stored_ok of each node leaves (the appender is retired next).
        appender.stored_nodes = copyset
        appender.missing = 0
        return self._complete(appender, now_ms)

    def adopt_shared(self, appender: Appender) -> None:
        """The shared wave ended without completing ``appender`` (an answer other than OK,
        or its timeout): from now on it is this sequencer's like any other, with the
        wave's deadline as its store timeout."""
        if self.shared_live(appender):
            heapq.heappush(self._timers, (appender.deadline_ms, appender.first_esn, 1))

    def _withdraw_producers(self, group: list[PendingAppend]) -> list[PendingAppend]:
        """``group`` goes back to wait without LSNs: its idempotent appends are no longer in
        flight, and the retries that joined them wait again behind them."""
        again: list[PendingAppend] = []
        for pending in group:
            again.append(pending)
            pair = self._producer_of.pop(pending.request_id, None)
            if pair is not None:
                again.extend(self.producers.failed(*pair))
        return again

    def _send_wave(self, appender: Appender, now_ms: int) -> list[Effect]:
        assert self.nodeset is not None and self.window is not None
        sends = appender.send_wave(
            nodeset=self.nodeset, config=self.config, rng=self.rng,
            sequencer_node=self.node_id, last_known_good=self.window.lng,
            release_lsn=self.release_lsn, now_ms=now_ms,
            latency=self.store_latency,
        )
        if appender.recipients and not appender.missing:
            # Every node of the new copyset already holds a copy from an earlier wave.
            return self._complete(appender, now_ms)
        if self._release_owed:
            # These STOREs carry the release pointer.
            self._release_owed.difference_update(send.node for send in sends)
            if not self._release_owed:
                self._release_due_ms = None  # all paid: no timer is due for it
        heapq.heappush(self._timers, (appender.deadline_ms, appender.first_esn, appender.wave))
        return sends

    # ---- activation ---------------------------------------------------------------------

    def on_activated(
        self,
        status: Status,
        epoch: Epoch,
        metadata: LogMetadata | None,
        lce: LastCleanEpoch | None,
        now_ms: int,
    ) -> list[Effect]:
        assert self.state is SequencerState.ACTIVATING
        if status is not Status.OK or metadata is None or lce is None:
            self.state = SequencerState.UNAVAILABLE
            failed = status if status is not Status.OK else Status.NOSEQUENCER
            replies: list[Effect] = [
                AppendReply(p.request_id, _activation_failure(failed),
                            message=f"sequencer activation failed: {failed.name}")
                for p in self._pending
            ]
            self._pending.clear()
            return replies
        assert epoch > self.epoch, (epoch, self.epoch)
        self.state = SequencerState.ACTIVE
        self.epoch = epoch
        # In a log's first epoch every idempotent append goes through this table.
        self.producers.reset(complete=epoch == 1)
        self.metadata = metadata
        self.window = SlidingWindow(
            window_appends_max=self.config.window_appends_max, esn_max=self.esn_max
        )
        self.nodeset = NodesetState(metadata.nodeset, self.config, self.weights)
        self.nodeset.unavailable = self._unavailable
        self.releasable = lce.epoch >= epoch - 1
        effects: list[Effect] = []
        if self.releasable:
            self._advance_release(max(lce.tail_lsn, self.release_lsn), effects)
            effects.extend(self._start_purge({}))
        else:
            # Readers keep reading what earlier sequencers released while recovery runs.
            effects.append(FetchLogState(self.log_id, metadata.nodeset))
            self.recovery = LogRecovery(
                log_id=self.log_id, node_id=self.node_id, seal_epoch=Epoch(epoch - 1), lce=lce,
                nodeset=self._earlier_epochs_nodes(metadata, Epoch(lce.epoch + 1), epoch),
                replication=metadata.replication_factor, config=self.config)
            effects.extend(self.recovery.start(now_ms))
        pending, self._pending = self._pending, deque()
        for item in pending:
            effects.extend(self.on_append_group([item], now_ms))
        return effects

    # ---- recovery ------------------------------------------------------------------------

    def on_recovery_reply(self, node: NodeId, request: Any, reply: Any,
                          now_ms: int) -> list[Effect]:
        """The answer (or failure ``Status``) to a request recovery or the purge sent."""
        purge = self.purge
        if purge is not None and purge.owns(node, request):
            effects = purge.on_reply(node, request, reply, now_ms)
            if purge.finished:
                self.purge = None
            return effects
        recovery = self.recovery
        if recovery is None:
            return []
        return self._recovery_step(recovery.on_reply(node, request, reply, now_ms), now_ms)

    def on_lce_written(self, status: Status, stored_epoch: Epoch, now_ms: int) -> list[Effect]:
        recovery = self.recovery
        if recovery is None:
            return []
        return self._recovery_step(recovery.on_lce_written(status, stored_epoch, now_ms),
                                   now_ms)

    def _recovery_step(self, effects: list[Effect], now_ms: int) -> list[Effect]:
        recovery = self.recovery
        assert recovery is not None
        if recovery.phase is Phase.PREEMPTED:
            self.recovery = None
            epoch, by = recovery.preempted_by
            if epoch >= self.epoch or self.state is not SequencerState.ACTIVE:
                effects.extend(self._on_preempted(epoch, by))
            else:
                # Sealed by a recovery of an older epoch than ours: recover again.
                self.recovery = LogRecovery(
                    log_id=self.log_id, node_id=self.node_id, seal_epoch=recovery.seal_epoch,
                    lce=recovery.lce, nodeset=recovery.nodeset,
                    replication=recovery.replication, config=self.config,
                    attempts_before=recovery.attempt)
                effects.extend(self.recovery.start(now_ms))
        elif recovery.phase is Phase.DONE:
            self.recovery = None
            if self.state is SequencerState.ACTIVE:
                effects.extend(self._start_purge(recovery.cleans))
            if self.state is SequencerState.ACTIVE and self.window is not None:
                self.releasable = True
                release = max(recovery.tail_lsn, compose_lsn(self.epoch, self.window.lng))
                before = self.release_lsn
                self._advance_release(release, effects)
                if self.release_lsn > before:
                    effects.extend(self.release_broadcast())
        return effects

    def _start_purge(self, known: dict[Epoch, Clean]) -> list[Effect]:
        """Every epoch before ours is clean: settle the nodes that missed a CLEAN of one."""
        if self.epoch <= 1 or self.metadata is None:
            return []
        self.purge = PurgeCoordinator(
            log_id=self.log_id, node_id=self.node_id, epoch=self.epoch,
            nodeset=self._earlier_epochs_nodes(self.metadata, Epoch(1), self.epoch),
            replication=self.metadata.replication_factor, config=self.config, known=known)
        return self.purge.start()

    def on_release_hint(self, release_lsn: Lsn) -> list[Effect]:
        """A storage node reported how far the log was released (by an earlier sequencer)."""
        if lsn_to_epoch(release_lsn) >= self.epoch and self.state is SequencerState.ACTIVE:
            return []  # only the current epoch's own reaping may release in it
        effects: list[Effect] = []
        self._advance_release(release_lsn, effects)
        return effects

    # ---- STORED --------------------------------------------------------------------------

    def on_stored(
        self, node: NodeId, lsn: Lsn, wave: int, status: Status, sealed_epoch: Epoch,
        sealed_by: NodeId | None, now_ms: int,
    ) -> list[Effect]:
        if lsn_to_epoch(lsn) != self.epoch or self.state is not SequencerState.ACTIVE:
            return []
        assert self.window is not None and self.nodeset is not None
        appender = self.appenders.get(lsn_to_esn(lsn))
        if appender is None:
            return []
        if status is Status.OK:
            # The answer names its wave, so it measures that wave's STORE, late or not.
            if wave == appender.wave:
                self.store_latency.on_sample(node, appender.payload_bytes,
                                             now_ms - appender.sent_ms)
            elif wave == appender.wave - 1:
                self.store_latency.on_sample(node, appender.payload_bytes,
                                             now_ms - appender.previous_sent_ms)
        result, resend = appender.on_reply(node, wave, status, self.nodeset, now_ms)
        if result is AppenderResult.PREEMPTED:
            return self._on_preempted(sealed_epoch, sealed_by)
        if result is AppenderResult.DONE:
            return self._complete(appender, now_ms)
        if resend:
            return self._send_wave(appender, now_ms)
        return []

    def on_stored_ok(self, node: NodeId, lsn: Lsn, wave: int, now_ms: int) -> list[Effect]:
        """A STORED OK out of a STORED_BATCH whose answers were all OK: what ``on_stored``
        does with it, in fewer steps (one per record and copy with many logs)."""
        if lsn >> 32 != self.epoch or self.state is not SequencerState.ACTIVE:
            return []
        appender = self.appenders.get(Esn(lsn & 0xFFFFFFFF))
        if appender is None:
            return []
        if wave == appender.wave:
            self.store_latency.on_sample(node, appender.payload_bytes, now_ms - appender.sent_ms)
        elif wave == appender.wave - 1:
            self.store_latency.on_sample(node, appender.payload_bytes,
                                         now_ms - appender.previous_sent_ms)
        elif wave > appender.wave:
            return []
        if not appender.on_stored_ok(node):
            return []
        return self._complete(appender, now_ms)

    def _complete(self, appender: Appender, now_ms: int) -> list[Effect]:
        assert self.window is not None
        del self.appenders[appender.first_esn]
        effects: list[Effect] = []
        lsn = appender.lsn
        producer_of = self._producer_of
        for request_id, count in appender.requests:
            last = Lsn(lsn + count - 1)
            effects.append(append_ok(request_id, lsn, last, appender.timestamp_ms))
            if producer_of and (pair := producer_of.pop(request_id, None)) is not None:
                for joined in self.producers.completed(*pair, lsn, last,
                                                       appender.timestamp_ms):
                    effects.append(AppendReply(joined.request_id, Status.OK, lsn, last,
                                               appender.timestamp_ms,
                                               message="duplicate of an earlier append"))
            lsn = Lsn(last + 1)
        self.window.retire(appender.first_esn, fully_replicated=True)
        reaped = self.window.reap()
        if self._drain_until_ms is not None and not self.appenders:
            effects.extend(self._advance_after_drain(bool(reaped), now_ms))
            return effects
        if reaped and self.releasable:
            before = self.release_lsn
            self._advance_release(compose_lsn(self.epoch, self.window.lng), effects)
            if self.release_lsn > before:
                # The copyset of the append that completed learns the new pointer (see
                # release_delay_ms); the periodic broadcast reaches every other node.
                if self.config.release_delay_ms == 0:
                    release = Release(log_id=self.log_id, release_lsn=self.release_lsn)
                    # After the answers: the client hears first, the RELEASE leaves in the
                    # same loop iteration. Readers do not depend on its timing: the nodes'
                    # read paths and the nodesets answer give readers the sequencer's own
                    # pointer, which has already moved (see docs/ARCHITECTURE.md).
                    effects.extend(Send(n, release) for n in appender.recipients)
                    return effects
                self._release_owed.update(appender.recipients)
                if self._release_due_ms is None:
                    self._release_due_ms = now_ms + self.config.release_delay_ms
        return effects

    def _advance_after_drain(self, reaped: bool, now_ms: int) -> list[Effect]:
        """The exhausted epoch is drained: release its end, then move to the next epoch."""
        assert self.window is not None
        effects: list[Effect] = []
        if reaped and self.releasable:
            self._advance_release(compose_lsn(self.epoch, self.window.lng), effects)
            effects.extend(self.release_broadcast())
        effects.extend(self._begin_activation(now_ms))
        return effects

    def _advance_release(self, release_lsn: Lsn, effects: list[Effect]) -> None:
        if release_lsn > self.release_lsn:
            self.release_lsn = release_lsn
            self._release_broadcasts_owed = RELEASE_BROADCASTS_PER_MOVE
            effects.append(release_advanced(self.log_id, release_lsn))

    def _on_preempted(self, sealed_epoch: Epoch, sealed_by: NodeId | None) -> list[Effect]:
        if sealed_epoch > self.sealed_epoch:
            self.sealed_epoch, self.sealed_by = sealed_epoch, sealed_by
        self.state = SequencerState.PREEMPTED
        self.recovery = None
        self.purge = None
        draining, self._drain_until_ms = self._drain_until_ms is not None, None
        effects = self._abort_epoch(f"epoch {self.epoch} preempted by {sealed_by}")
        if draining and self._pending:
            # Appends that waited for the drain got no LSN yet: they go to a new epoch, as
            # an append arriving now would.
            effects.extend(self._begin_activation(0))
        return effects

    def _abort_epoch(self, why: str) -> list[Effect]:
        """End every in-flight append of the current epoch: their outcome is unknown."""
        effects: list[Effect] = [
            AppendReply(request_id, Status.TIMEDOUT, message=f"{why}; outcome unknown")
            for a in self.appenders.values() for request_id, _ in a.requests
        ]
        # Whether in-flight idempotent appends were written is now up to recovery: retries
        # that joined them share their unknown outcome, and every producer is looked up again.
        queued, joined = self.producers.reset(complete=False)
        effects.extend(AppendReply(p.request_id, Status.TIMEDOUT, message=f"{why}; outcome "
                                   "of the original append unknown") for p in joined)
        effects.extend(AppendReply(p.request_id, Status.NOTREADY, message=f"{why}; nothing "
                                   "written") for p in queued)
        self._producer_of.clear()
        self.appenders.clear()
        self._timers.clear()
        self.window = None
        return effects

    # ---- timers --------------------------------------------------------------------------

    def deadline_ms(self) -> int | None:
        """The earliest store timeout of a live appender wave (stale entries are dropped), or
        the time owed RELEASEs are due."""
        timers = self._timers
        appenders = self.appenders
        while timers:
            _, first_esn, wave = timers[0]
            appender = appenders.get(first_esn)  # type: ignore[call-overload]
            if appender is not None and appender.wave == wave:
                break
            heapq.heappop(timers)
        # No list and min(): this runs after nearly every call into the core.
        due = timers[0][0] if timers else None
        for other_ms in (self._drain_until_ms, self._release_due_ms):
            if other_ms is not None and (due is None or other_ms < due):
                due = other_ms
        if self.recovery is not None and (
                recovery_due_ms := self.recovery.deadline_ms()) is not None and (
                due is None or recovery_due_ms < due):
            due = recovery_due_ms
        if self.purge is not None and (purge_due_ms := self.purge.deadline_ms()) is not None and (
                due is None or purge_due_ms < due):
            due = purge_due_ms
        return due

    def on_timer(self, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        if self._drain_until_ms is not None and self._drain_until_ms <= now_ms:
            # Still in flight after the drain timeout: given up (TIMEDOUT); recovery settles.
            return self._begin_activation(now_ms)
        recovery = self.recovery
        if recovery is not None and (
                due_ms := recovery.deadline_ms()) is not None and due_ms <= now_ms:
            effects.extend(self._recovery_step(recovery.on_timer(now_ms), now_ms))
        purge = self.purge
        if purge is not None and (due_ms := purge.deadline_ms()) is not None and (
                due_ms <= now_ms):
            effects.extend(purge.on_timer(now_ms))
        if self._release_due_ms is not None and self._release_due_ms <= now_ms:
            effects.extend(self.release_owed_now())
        timers = self._timers
        while timers and timers[0][0] <= now_ms:
            _, first_esn, wave = heapq.heappop(timers)
            appender = self.appenders.get(Esn(first_esn))
            if appender is None or appender.wave != wave:
                continue  # completed, or superseded by a newer wave
            assert self.nodeset is not None
            if appender.recipients and all(
                    answer is None for answer in appender.recipients.values()):
                for node in appender.recipients:
                    self.store_latency.on_silent_timeout(
                        node, appender.payload_bytes,
                        appender.deadline_ms - appender.awaited_sent_ms(node))
            appender.on_timeout(self.nodeset, now_ms)
            effects.extend(self._send_wave(appender, now_ms))
        return effects

    def release_owed_now(self) -> list[Effect]:
        """The RELEASEs owed to copyset nodes (see ``release_delay_ms``), now instead of when
        due; nothing is owed afterwards. A driver that sends this loop iteration's frames to
        those nodes anyway (a cross-log STORE_BATCH) sends them along: earlier is always
        allowed, and no timer then fires per log to send them on their own."""
        owed = self.take_release_owed()
        if owed is None:
            return []
        release, nodes = owed
        return [send_of(node, release) for node in nodes]

    def take_release_owed(self) -> tuple[Release, list[NodeId]] | None:
        """``release_owed_now`` as the RELEASE and the nodes it is owed to (in node order),
        for a driver that stages it for those nodes itself; nothing is owed afterwards."""
        owed = self._release_owed
        self._release_due_ms = None
        if not owed:
            return None
        nodes = sorted(owed)
        owed.clear()
        return release_of(self.log_id, self.release_lsn), nodes

    # ---- release broadcast and draining -------------------------------------------------

    def idle_unavailable(self) -> bool:
        """Never activated and nothing waiting: this object holds no state worth keeping."""
        return (self.state is SequencerState.UNAVAILABLE and self.epoch == 0
                and not self._pending)

    def release_broadcast_due(self) -> bool:
        """Whether the periodic broadcast has anything to tell about this log: a release
        pointer that moved in the last few broadcasts. An idle log has not."""
        return self._release_broadcasts_owed > 0

    def release_broadcast_told(self, release_lsn: Lsn, nodes: list[NodeId]) -> bool:
        """A periodic broadcast is due and ``nodes`` were sent ``release_lsn`` since the
        previous one: when that is the current pointer and they are the whole nodeset, that
        RELEASE did what a broadcast does; one more (the next) is owed, in case it was lost
        (True: nothing to send now). Else False, and nothing changed."""
        metadata = self.metadata
        if (metadata is None or release_lsn != self.release_lsn
                or not set(metadata.nodeset).issubset(nodes)):
            return False
        self._release_broadcasts_owed = min(self._release_broadcasts_owed,
                                            RELEASE_BROADCASTS_AFTER_TOLD)
        return True

    def release_broadcast(self, *, final: bool = False) -> list[Effect]:
        """RELEASEs of the pointer to the whole nodeset. ``final``: the last broadcast of a
        drained epoch (graceful stop, idle deactivation): it lets the nodes settle the epoch
        (``Release.drained_epoch``), so that the next sequencer has nothing to purge."""
        if self._release_broadcasts_owed:
            self._release_broadcasts_owed -= 1
        if self.metadata is None or self.release_lsn == 0:
            return []
        drained = Epoch(0)
        if final and lsn_to_epoch(self.release_lsn) == self.epoch and (
                self.drained_clean_tail() == self.release_lsn):
            drained = self.epoch
        release = release_of(self.log_id, self.release_lsn, drained)
        return [send_of(node, release) for node in self.metadata.nodeset]

    def idle_deadline_ms(self) -> int | None:
        """While ACTIVE, when the sequencer has been without appends for
        ``idle_deactivate_ms`` (it may be deactivated then if nothing is left to do)."""
        if self.state is not SequencerState.ACTIVE:
            return None
        return self.last_append_ms + self.config.idle_deactivate_ms

    def idle_clean_tail(self, now_ms: int) -> Lsn | None:
        """The tail to mark the epoch clean with when this sequencer may be deactivated now:
        idle for ``idle_deactivate_ms``, nothing in flight, waiting or owed (appends,
        recovery, producer lookups, RELEASEs), every record released. The next append then
        starts a new epoch with no recovery: the clean mark covers this one. A purge still
        running does not hold it back: what it settles is reported by the storage nodes to
        the next sequencer too."""
        due_ms = self.idle_deadline_ms()
        if (
            due_ms is None or due_ms > now_ms or self._pending or self.recovery is not None
            or self._drain_until_ms is not None or self._release_owed
            or self._producer_of or self.producers.waiting()
        ):
            return None
        return self.drained_clean_tail()

    def inflight_tail(self) -> Lsn:
        """The highest LSN this sequencer has handed out (in flight or done), at least the
        release pointer: once the release pointer reaches it, every append it had taken is
        decided and earlier epochs are recovered (rebuilding plans its walks by it:
        ``storage_node.core.rebuild``). With no append in this epoch yet it is the epoch's
        ESN 0, which only recovery's release reaches."""
        window = self.window
        if self.state is not SequencerState.ACTIVE or window is None:
            return self.release_lsn
        return max(self.release_lsn, compose_lsn(self.epoch, Esn(window.next_esn - 1)))

    def drained_clean_tail(self) -> Lsn | None:
        """When the current epoch is fully drained (nothing in flight, every record released),
        the LSN that ends it: the epoch can be marked clean in the epoch store with that tail."""
        window = self.window
        if (
            self.state is not SequencerState.ACTIVE or window is None or not self.releasable
            or window.appends_in_flight or self.appenders
        ):
            return None
        return compose_lsn(self.epoch, window.lng) if window.lng else self.release_lsn

    def check_invariants(self) -> None:
        if self.window is not None:
            assert len(self.appenders) <= self.window.appends_in_flight
            if self.releasable:
                assert self.release_lsn <= compose_lsn(self.epoch, self.window.lng) or (
                    lsn_to_epoch(self.release_lsn) < self.epoch
                )
        if not self.releasable:
            assert lsn_to_epoch(self.release_lsn) < max(self.epoch, 1) or self.epoch == 0


def _producer_tags(group: list[PendingAppend], first_lsn: Lsn) -> tuple[ProducerTag, ...]:
    tags: list[ProducerTag] = []
    lsn = first_lsn
    for pending in group:
        count = pending.records_count
        if pending.producer is not None:
            tags.append((*pending.producer, lsn, lsn + count - 1))
        lsn = Lsn(lsn + count)
    return tuple(tags)


def _activation_failure(status: Status) -> Status:
    # Appends that never got an LSN wrote nothing: report a "nothing written" status.
    return status if status in (Status.NOTFOUND, Status.TOOBIG) else Status.NOSEQUENCER
