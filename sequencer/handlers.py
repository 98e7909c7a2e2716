"""The sequencer's effect glue, sans I/O: carries out a ``Sequencer`` core's effects through a
small set of ports and feeds the answers (STORED, recovery replies, log states) back to the
core. ``sequencer.runtime.SequencerRuntime`` (asyncio, ``shared.net.PeerPool``) and the
deterministic simulation (``tests/simulation/sim_sequencer.py``) both drive their cores with
this one ``EffectDriver``, so that the simulation runs the code production runs.

``append_groups`` hands a moment's appends to the cores and lets the appenders of different
logs share their first wave (``sequencer.core.shared_wave``): it stages their STOREs with a
``WaveEntry`` as owner, counts the STORED_BATCH answers per wave, and completes or hands back
the wave's appenders.

What differs between the two lives behind ``SequencerPorts``: how a message travels, how an
epoch is activated or a last clean epoch written (tasks against the epoch store, or simulated
delays), what an append's answer reaches, and what happens after each batch of effects (timers,
waiters, checkers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sequencer.core.effects import (
    ActivateEpoch,
    AppendReply,
    FetchLogState,
    FetchProducer,
    RecoveryProgress,
    ReleaseAdvanced,
    WriteLastCleanEpoch,
)
from sequencer.core.sequencer import PendingAppend, Sequencer
from sequencer.core.shared_wave import SHARED_WAVE_APPENDERS_MAX, SharedWave, WaveEntry
from sequencer.core.store_batcher import (
    StoreBatcher,
    all_ok,
    chunk_answers,
)
from shared import failpoints
from shared.effects import Send
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.codec import encode_fields
from shared.wire.read import GetLogState, LogState
from shared.wire.release import Release
from shared.wire.store import Store, Stored
from shared.wire.store_batch import StoreBatch, StoredBatch

Callback = Callable[[Any], None]
"""Gets the reply message, or the ``Status`` that ended the request (CONNFAILED, TIMEDOUT)."""
ArmTimer = Callable[[int, Callable[[], None]], None]
"""Call the function at the given time (the cores' clock, ms), once."""


class SequencerPorts(Protocol):
    """What the effect glue needs from its driver."""

    def now_ms(self) -> int:
        """The monotonic clock the cores' deadlines use."""
        ...

    def send(self, node: NodeId, message: Any) -> None:
        """One-way message (RELEASE); may be lost."""
        ...

    def send_store(self, node: NodeId, store: Store, callback: Callback) -> None:
        """A sequencer STORE (no recovery flags); ``callback`` gets STORED or a ``Status``,
        at most once."""
        ...

    def send_store_batch(self, node: NodeId, batch: StoreBatch, callback: Callback) -> None:
        """The STOREs of several logs to one node in one frame; ``callback`` gets the
        STORED_BATCH or a ``Status``, at most once."""
        ...

    def schedule_flush(self) -> None:
        """Call ``EffectDriver.flush`` soon (the runtime: next loop turn), once."""
        ...

    def request(self, node: NodeId, message: Any, callback: Callback, *,
                timeout_ms: int | None = None) -> None:
        """Any other request (epoch recovery's SEAL, GET_DIGEST, recovery STOREs and CLEAN,
        GET_LOG_STATE); ``callback`` gets the reply or a ``Status``, at most once."""
        ...

    def answer(self, sequencer: Sequencer, reply: AppendReply) -> None:
        """Give an append's answer to whoever waits for it."""
        ...

    def release_advanced(self, sequencer: Sequencer, effect: ReleaseAdvanced) -> None: ...

    def activate(self, sequencer: Sequencer) -> None:
        """Start activating a new epoch; answer with ``sequencer.on_activated`` (via
        ``EffectDriver.apply``)."""
        ...

    def fetch_producer(self, sequencer: Sequencer, effect: FetchProducer) -> None: ...

    def write_lce(self, sequencer: Sequencer, effect: WriteLastCleanEpoch) -> None:
        """Start writing the last clean epoch; answer with ``sequencer.on_lce_written``."""
        ...

    def recovery_progress(self, sequencer: Sequencer, effect: RecoveryProgress) -> None: ...

    def applied(self, sequencer: Sequencer) -> None:
        """Called after every batch of effects: re-arm timers, wake waiters, check."""
        ...


Live = Callable[[Sequencer], bool]
"""Whether answers for a sequencer still go to it (False once its node dropped it: the
simulation's crashed or replaced cores)."""


class EffectDriver:
    """Applies a core's effects through ``ports``; one per sequencer node. ``now_ms`` is
    the clock (the ports' own by default); ``live`` filters late answers (none by default:
    the runtime lets a dropped core's appenders finish)."""

    __slots__ = ("_answer", "_applied", "_arm_timer", "_batcher", "_deliver", "_live",
                 "_now_ms", "_ports", "_recovery_request_timeout_ms", "_send_store",
                 "_stores_max", "_waiters", "flushing", "released", "wave_counts")

    def __init__(self, ports: SequencerPorts, *, now_ms: Callable[[], int] | None = None,
                 applied: Callable[[Sequencer], None] | None = None,
                 send_store: Callable[[NodeId, Store, Callback], None] | None = None,
                 live: Live | None = None, recovery_request_timeout_ms: int | None = None,
                 store_batch_stores_max: int = 1,
                 waiters: dict[int, Callable[[Any], None]] | None = None,
                 deliver: Callable[[Callable[[Any], None], AppendReply], None] | None = None,
                 arm_timer: ArmTimer | None = None, track_released: bool = False,
                 ) -> None:
        """``now_ms``, ``applied``, ``send_store``: the ports' own, given directly (no hop per
        STORE or STORED reply);
        ``store_batch_stores_max``: above 1, the STOREs and RELEASEs of one moment go to each
        node in one STORE_BATCH and one RELEASE_BATCH (``flush``; 1 sends each alone);
        ``recovery_request_timeout_ms``: the transport timeout of every recovery request
        (None: none), so that a member that hangs fails as TIMEDOUT;
        ``waiters`` and ``deliver``: answers go straight to ``deliver(waiters.pop(id),
        reply)`` instead of ``ports.answer`` (the runtime's hot path: no call per append);
        ``arm_timer``: with it (and STORE batching on), ``append_groups`` lets the appenders
        of different logs share their first wave (``sequencer.core.shared_wave``);
        ``track_released``: note in ``released`` which nodes each owed RELEASE went to."""
        self._ports = ports
        # Bound once: ``apply`` runs for every batch of appends, ``on_reply`` per STORED.
        self._answer = ports.answer
        self._applied = applied or ports.applied
        self._send_store = send_store or ports.send_store
        self._now_ms = now_ms or ports.now_ms
        self._live = live
        self._recovery_request_timeout_ms = recovery_request_timeout_ms
        assert (waiters is None) == (deliver is None)
        self._waiters = waiters
        self._deliver = deliver
        self._stores_max = store_batch_stores_max
        self._batcher: StoreBatcher[Sequencer | WaveEntry] = StoreBatcher(
            stores_max=store_batch_stores_max)
        self._arm_timer = arm_timer if store_batch_stores_max > 1 else None
        self.wave_counts = [0, 0, 0]
        """Shared first waves sent, completed, and handed back to their logs (metrics)."""
        self.flushing = False
        self.released: dict[LogId, tuple[Lsn, list[NodeId]]] | None = (
            {} if track_released else None)
        """Per log, the release pointer of its last RELEASEs sent here and the nodes they went
        to; the runtime takes it at each periodic broadcast, which need not tell those nodes
        that pointer again (bounded by the active logs: emptied there)."""
        """Set by the owner while it hands a moment's appends to the cores: it calls
        ``flush`` itself afterwards, so nothing is scheduled meanwhile."""

    def append_groups(self, groups: list[tuple[Sequencer, list[PendingAppend]]],
                      now_ms: int) -> None:
        """The appends of one moment, per log (each as ``Sequencer.on_append_group`` takes
        them): those of logs that can share a first wave get one
        (``sequencer.core.shared_wave``), the others go to their cores as usual. The caller
        flushes afterwards (``flushing`` set meanwhile)."""
        if self._arm_timer is None:
            for sequencer, group in groups:
                self.apply(sequencer, sequencer.on_append_group(group, now_ms))
            return
        shared: dict[tuple[Any, ...], list[tuple[Sequencer, Any]]] = {}
        for sequencer, group in groups:
            appender = sequencer.start_shared(group, now_ms)
            if appender is None:
                self.apply(sequencer, sequencer.on_append_group(group, now_ms))
                continue
            metadata = sequencer.metadata
            assert metadata is not None
            key = (metadata.nodeset, metadata.replication_factor)
            members = shared.get(key)
            if members is None:
                shared[key] = [(sequencer, appender)]
            else:
                members.append((sequencer, appender))
        for members in shared.values():
            for start in range(0, len(members), SHARED_WAVE_APPENDERS_MAX):
                self._send_shared(members[start:start + SHARED_WAVE_APPENDERS_MAX], now_ms)

    def _send_shared(self, members: list[tuple[Sequencer, Any]], now_ms: int) -> None:
        first, _ = members[0]
        nodeset = first.nodeset
        assert nodeset is not None and first.metadata is not None
        copyset = nodeset.pick_copyset(first.metadata.replication_factor, first.rng, now_ms)
        if copyset is None or len(members) == 1:
            # Alone, or no copyset now: each appender sends its own wave, as it would have.
            for sequencer, appender in members:
                self.apply(sequencer, sequencer.send_first_wave(appender, now_ms))
            return
        config = first.config
        payload_bytes = max(appender.payload_bytes for _, appender in members)
        timeout_ms = first.store_latency.timeout_ms(copyset, payload_bytes, config)
        wave = SharedWave(copyset, now_ms, now_ms + timeout_ms)
        batcher = self._batcher
        scheduled = self.flushing
        for sequencer, appender in members:
            entry = wave.add(sequencer, appender)
            store = sequencer.send_shared(appender, copyset, timeout_ms, now_ms)
            for node in copyset:
                if batcher.add(node, store, entry) and not scheduled:
                    self._ports.schedule_flush()
                    scheduled = True
        assert self._arm_timer is not None
        self._arm_timer(wave.deadline_ms, lambda: self._wave_timeout(wave))
        self.wave_counts[0] += 1

    def _wave_timeout(self, wave: SharedWave) -> None:
        if not wave.done and not wave.dissolved:
            self._dissolve(wave, self._now_ms())

    def _dissolve(self, wave: SharedWave, now_ms: int) -> None:
        """Hand the wave's appenders back to their logs (see ``sequencer.core.shared_wave``):
        their own timers, the OK answers they got replayed."""
        wave.dissolved = True
        self.wave_counts[2] += 1
        live = self._live
        for entry in wave.entries:
            sequencer = entry.sequencer
            if live is not None and not live(sequencer):
                continue
            appender = entry.appender
            sequencer.adopt_shared(appender)
            effects: list[Any] = []
            for node in entry.ok_nodes:
                effects.extend(sequencer.on_stored_ok(node, appender.lsn, 1, now_ms))
            self.apply(sequencer, effects)  # re-arms the log's timer in any case
        self._release_owed_now(entry.sequencer for entry in wave.entries)

    def _complete_wave(self, wave: SharedWave, now_ms: int) -> None:
        self.wave_counts[1] += 1
        live = self._live
        copyset = frozenset(wave.copyset)
        for entry in wave.entries:
            sequencer = entry.sequencer
            if live is not None and not live(sequencer):
                continue
            effects = sequencer.complete_shared(entry.appender, copyset, now_ms)
            if effects:
                # The owed RELEASE is staged first (see _release_owed_now).
                self._release_owed_now((sequencer,))
                self.apply(sequencer, effects)

    def _wave_sample(self, wave: SharedWave, node: NodeId, now_ms: int) -> None:
        # One round-trip sample per node and wave: its STOREs travelled together.
        if node not in wave.sampled:
            wave.sampled.add(node)
            wave.entries[0].sequencer.store_latency.on_sample(
                node, wave.payload_bytes, now_ms - wave.sent_ms)

    def apply(self, sequencer: Sequencer, effects: list[Any]) -> None:
        ports = self._ports
        waiters = self._waiters
        for effect in effects:
            kind = type(effect)
            if kind is AppendReply:
                if waiters is None:
                    self._answer(sequencer, effect)
                else:
                    done = waiters.pop(effect.request_id, None)
                    if done is not None:
                        self._deliver(done, effect)  # type: ignore[misc]
            elif kind is Send:
                self.send(sequencer, effect)
            elif kind is ReleaseAdvanced:
                ports.release_advanced(sequencer, effect)
            elif kind is ActivateEpoch:
                ports.activate(sequencer)
            elif kind is FetchLogState:
                self.fetch_log_state(sequencer, effect)
            elif kind is FetchProducer:
                ports.fetch_producer(sequencer, effect)
            elif kind is WriteLastCleanEpoch:
                ports.write_lce(sequencer, effect)
            elif kind is RecoveryProgress:
                ports.recovery_progress(sequencer, effect)
            else:
                raise AssertionError(f"unknown effect {effect!r}")
        self._applied(sequencer)

    def send(self, sequencer: Sequencer, effect: Send) -> None:
        message = effect.message
        if type(message) is Release:
            if message.drained_epoch:
                # The last RELEASE of a drained epoch settles it on the node: a RELEASE_BATCH
                # carries only pointers, so it goes alone.
                self._ports.send(effect.node, message)
                return
            # Leaves with this moment's other RELEASEs to that node, in one frame.
            if self._batcher.add_release(effect.node, message) and not self.flushing:
                self._ports.schedule_flush()
            released = self.released
            if released is not None:
                told = released.get(message.log_id)
                if told is None or told[0] != message.release_lsn:
                    released[message.log_id] = (message.release_lsn, [effect.node])
                else:
                    told[1].append(effect.node)
            return
        node = effect.node
        if type(message) is not Store or message.flags:
            self.send_recovery(sequencer, node, message)
            return
        if self._batcher.add(node, message, sequencer) and not self.flushing:
            self._ports.schedule_flush()

    def reset(self) -> None:
        """Forget what is staged (the node crashed: those sends are lost)."""
        self._batcher = StoreBatcher(stores_max=self._stores_max)

    def flush(self) -> None:
        """Send the STOREs staged since the last flush: to each storage node one STORE_BATCH
        (a STORE alone goes as it is), its STOREs packed once for all nodes; and the
        RELEASEs, one RELEASE_BATCH per node."""
        batcher = self._batcher
        if not batcher:
            return
        for node, release in batcher.take_releases():
            self._ports.send(node, release)
        packed: dict[int, bytes] = {}
        for node, chunk in batcher.take():
            if len(chunk) == 1 and type(chunk[0][0]) is not WaveEntry:
                sequencer, store = chunk[0]
                self.send_store(sequencer, node, store)  # type: ignore[arg-type]
                continue
            parts = []
            for _, store in chunk:
                fields = packed.get(id(store))
                if fields is None:
                    fields = packed[id(store)] = encode_fields(store)
                parts.append(fields)
            batch = StoreBatch(stores=tuple(store for _, store in chunk)).with_packed(
                tuple(parts))
            self._ports.send_store_batch(node, batch, self._batch_reply(node, chunk))

    def _batch_reply(self, node: NodeId,
                     chunk: list[tuple[Sequencer | WaveEntry, Store]]) -> Callback:
        def on_reply(reply: Any) -> None:
            # One callback per STORE_BATCH: each STORE's answer goes to its log's core, or
            # to its shared wave.
            now_ms = self._now_ms()
            live = self._live
            answered: list[Sequencer] = []
            if type(reply) is StoredBatch and all_ok(reply, len(chunk)):
                # The common case, kept lean (no per-STORE status, seal or tuple).
                armed = failpoints.armed("appender.after_k_stores")
                done: list[SharedWave] = []
                for owner, store in chunk:
                    if type(owner) is WaveEntry:
                        wave = owner.wave
                        if not wave.dissolved:
                            if armed:
                                failpoints.hit("appender.after_k_stores")
                            if wave.on_ok(owner, node):
                                done.append(wave)
                            continue
                        sequencer = owner.sequencer
                    else:
                        sequencer = owner  # type: ignore[assignment]
                    if live is not None and not live(sequencer):
                        continue
                    if armed:
                        failpoints.hit("appender.after_k_stores")
                    effects = sequencer.on_stored_ok(node, store.lsn, store.wave, now_ms)
                    if effects:
                        # The owed RELEASE is staged first (see _release_owed_now): then the
                        # log's timer is not re-armed for it, only to find nothing due.
                        self._release_owed_now((sequencer,))
                        self.apply(sequencer, effects)
                if chunk and type(chunk[0][0]) is WaveEntry:
                    self._wave_sample(chunk[0][0].wave, node, now_ms)
                for wave in done:
                    self._complete_wave(wave, now_ms)
                return
            for (owner, store), (status, sealed_epoch, sealed_by) in zip(
                    chunk, chunk_answers(reply, len(chunk)), strict=True):
                if type(owner) is WaveEntry:
                    if not owner.wave.dissolved:
                        # Not all OK: the wave's appenders go back to their logs first.
                        self._dissolve(owner.wave, now_ms)
                    sequencer = owner.sequencer
                else:
                    sequencer = owner  # type: ignore[assignment]
                if live is not None and not live(sequencer):
                    continue
                if status is Status.OK:
                    failpoints.hit("appender.after_k_stores")
                effects = sequencer.on_stored(node, store.lsn, store.wave, status,
                                              sealed_epoch, sealed_by, now_ms)
                if effects or status is not Status.OK:
                    # Nothing (most OK answers, all but an appender's last): nothing changed
                    # that apply looks at, no deadline or appender came or went. Any other
                    # answer may have moved a deadline with no effect (a new wave that found
                    # no copyset waits for its timer), which only ``apply`` re-arms.
                    self.apply(sequencer, effects)
                    answered.append(sequencer)
            self._release_owed_now(answered)

        return on_reply

    def _release_owed_now(self, answered: Iterable[Sequencer]) -> None:
        # Many logs are busy: the RELEASEs their completed appends owe leave now, all in
        # one RELEASE_BATCH per node, rather than each log's timer sending its own 2 ms
        # later. Earlier is always allowed.
        live = self._live
        batcher = self._batcher
        scheduled = self.flushing
        for sequencer in answered:
            if live is None or live(sequencer):
                owed = sequencer.take_release_owed()
                if owed is not None:
                    release, nodes = owed
                    if self.released is not None:
                        self.released[release.log_id] = (release.release_lsn, nodes)
                    for node in nodes:
                        # (What send does with a RELEASE that settles nothing.)
                        if batcher.add_release(node, release) and not scheduled:
                            self._ports.schedule_flush()
                            scheduled = True

    def send_store(self, sequencer: Sequencer, node: NodeId, message: Store) -> None:
        """One STORE on its own."""
        def on_reply(reply: Any) -> None:
            live = self._live
            if live is not None and not live(sequencer):
                return
            now_ms = self._now_ms()
            if type(reply) is Stored:
                status = reply.status
                if status is Status.OK:
                    failpoints.hit("appender.after_k_stores")
                effects = sequencer.on_stored(node, reply.lsn, reply.wave, status,
                                              reply.sealed_epoch, reply.sealed_by, now_ms)
            else:
                status = reply if isinstance(reply, Status) else Status.BADMSG
                effects = sequencer.on_stored(node, message.lsn, message.wave, status,
                                              Epoch(0), None, now_ms)
            if effects or status is not Status.OK:  # as in _batch_reply
                self.apply(sequencer, effects)

        self._send_store(node, message, on_reply)

    def send_recovery(self, sequencer: Sequencer, node: NodeId, message: Any) -> None:
        def on_reply(reply: Any) -> None:
            if self._live is None or self._live(sequencer):
                self.apply(sequencer, sequencer.on_recovery_reply(node, message, reply,
                                                                  self._now_ms()))

        self._ports.request(node, message, on_reply,
                            timeout_ms=self._recovery_request_timeout_ms)

    def fetch_log_state(self, sequencer: Sequencer, effect: FetchLogState) -> None:
        def on_reply(reply: Any) -> None:
            if ((self._live is None or self._live(sequencer)) and type(reply) is LogState
                    and reply.status is Status.OK):
                self.apply(sequencer, sequencer.on_release_hint(reply.release_lsn))

        for node in effect.nodes:
            self._ports.request(node, GetLogState(log_id=effect.log_id), on_reply)
