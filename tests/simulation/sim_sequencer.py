"""A simulated sequencer node: one real ``Sequencer`` core per log, driven with no asyncio by
the same effect glue as ``sequencer.runtime.SequencerRuntime`` (``sequencer.handlers``): this
node is its ``SequencerPorts``.

Ports: STOREs and recovery requests become network requests (the checker sees every STORE
sent); RELEASE is one-way; ``activate`` asks the epoch store (after a delay, sometimes
failing) and answers ``on_activated``; ``write_lce`` likewise; ``answer`` answers the
client. One timer per distinct core deadline calls ``on_timer``; a periodic event broadcasts
the release pointers of the cores that have one to tell (``release_broadcast_due``, the
runtime's dirty set) and, with ``idle_deactivate_ms``, deactivates idle cores: final release
sent, epoch marked clean, core dropped (the next append activates a new one).
After every call the core's ``check_invariants`` runs and its release
pointer goes to the checker. Appends to one log that arrive at the same moment are handed over
together (``on_append_group``), as the runtime does for one event-loop iteration; and, as
there, the STOREs and RELEASEs of every log of one moment go to each storage node in one
STORE_BATCH and one RELEASE_BATCH (``sequencer.core.store_batcher``), whose answer is split
back into each STORE's ``on_stored``.

Lifecycle: up -> crash (cores and their in-flight appends are lost) -> restart (empty), or
up -> drain (refuse appends, let in-flight ones finish, confirm the release on every node of
the nodeset, mark drained epochs clean, as ``SequencerRuntime.drain``) -> down -> restart.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sequencer.core.effects import (
    AppendReply,
    FetchProducer,
    RecoveryProgress,
    ReleaseAdvanced,
    WriteLastCleanEpoch,
)
from sequencer.core.sequencer import PendingAppend, Sequencer
from sequencer.core.store_timeout import StoreLatency
from sequencer.handlers import Callback, EffectDriver
from shared.compression import Codec
from shared.config import SequencerConfig
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import Epoch, Esn, LogId, NodeId, format_lsn
from shared.wire.read import GetLogState, LogState
from shared.wire.store import Store, Stored
from shared.wire.store_batch import StoreBatch
from tests.simulation.checkers import SafetyChecker, fail
from tests.simulation.sim_client import ClientAppend, sim_blob
from tests.simulation.sim_clock import EventQueue
from tests.simulation.sim_epoch_store import SimEpochStore
from tests.simulation.sim_network import ReplyFn, SimNetwork
from tests.simulation.sim_options import SimOptions
from tests.simulation.sim_trace import Trace

DRAIN_POLL_MS = 10


@dataclass(eq=False)
class Core:
    """One ``Sequencer`` object and what the driver keeps for it."""

    sequencer: Sequencer
    name: str
    armed_ms: set[int] = field(default_factory=set)


@dataclass(slots=True, kw_only=True)
class SequencerEnv:
    """What a sequencer node shares with the rest of the simulated cluster."""

    options: SimOptions
    network: SimNetwork
    queue: EventQueue
    rng: random.Random
    epoch_store: SimEpochStore
    checker: SafetyChecker
    trace: Trace
    provision: ProvisionSpec
    on_core_reply: Callable[[ClientAppend, AppendReply], None]
    epoch_store_failure_ratio: float = 0.0
    stats: Counter[str] = field(default_factory=Counter)
    """What happened how often (faults, preemptions, clean epochs), for the run's summary."""


class SimSequencerNode:
    def __init__(self, node_id: NodeId, env: SequencerEnv) -> None:
        self.node_id = node_id
        self.env = env
        options = env.options
        self.config = SequencerConfig(
            window_appends_max=options.window_appends_max,
            store_timeout_ms_min=options.store_timeout_ms_min,
            store_timeout_ms_max=options.store_timeout_ms_max,
            release_broadcast_interval_ms=options.release_broadcast_interval_ms,
            append_timeout_ms=options.append_timeout_ms,
            append_group_records_max=options.append_group_records_max,
            # Short, so that runs also see recoveries that start over.
            recovery_timeout_ms=options.recovery_timeout_ms,
            **({"idle_deactivate_ms": options.idle_deactivate_ms}
               if options.idle_deactivate_ms else {}),
        )
        self.up = True
        self.draining = False
        self.incarnation = 0
        self.cores: dict[LogId, Core] = {}
        self.inflight: dict[int, ClientAppend] = {}
        """Appends a core took (or that wait in ``_staged``) and has not answered yet."""
        self._staged: dict[LogId, list[PendingAppend]] = {}
        self._flush_scheduled = False
        self._cores_created_count = 0
        self.store_latency = StoreLatency()
        """As in ``SequencerRuntime``: shared by this node's cores, kept across restarts
        only as long as the process lives (see ``crash``)."""
        self._core_of: dict[Sequencer, Core] = {}
        """Every core this node ever made, by its ``Sequencer`` (the ports get the latter)."""
        self.driver = EffectDriver(
            self, live=self.live, store_batch_stores_max=self.config.store_batch_stores_max,
            arm_timer=self._arm_timer)
        env.network.add_node(node_id, self._on_message)
        env.queue.after(self.config.release_broadcast_interval_ms, self._broadcast)

    @property
    def _now_ms(self) -> int:
        return self.env.queue.clock.now_ms()

    def _log(self, text: str) -> None:
        self.env.trace.log(self._now_ms, f"{self.node_id} {text}")

    # ---- appends --------------------------------------------------------------------------

    def accepts_appends(self) -> bool:
        return self.up and not self.draining

    def submit(self, append: ClientAppend) -> bool:
        """Stage the append for its log's core; False if this node cannot take it now."""
        if not self.accepts_appends():
            return False
        append.reached_core = True
        self.inflight[append.request_id] = append
        group = self._staged.setdefault(append.log_id, [])
        payloads, compression = append.payloads, 0
        if len(payloads) > 1 and append.request_id % 3 == 0:
            # Every third batch travels compressed, as a buffered writer's would: one blob,
            # its own STORE, one LSN per record (no RNG draw: seeds keep their schedules).
            payloads, compression = (sim_blob(payloads),), int(Codec.LZ4)
        group.append(PendingAppend(append.request_id, payloads, None,
                                   self.env.queue.clock.wall_ms(), None, compression,
                                   len(append.payloads) if compression else 0))
        if sum(p.records_count for p in group) >= self.config.append_group_records_max:
            self._flush_group(append.log_id)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.env.queue.after(0, self._flush_staged)
        return True

    def _flush_staged(self) -> None:
        self._flush_scheduled = False
        driver = self.driver
        driver.flushing = True
        staged, self._staged = self._staged, {}
        try:
            if self.up:
                # As the runtime: appends of different logs may share their first wave.
                driver.append_groups([(self.core(log_id).sequencer, group)
                                      for log_id, group in staged.items() if group],
                                     self._now_ms)
        finally:
            driver.flushing = False
        driver.flush()

    def _arm_timer(self, due_ms: int, callback: Callable[[], None]) -> None:
        incarnation = self.incarnation

        def fire() -> None:
            if incarnation == self.incarnation and self.up:
                callback()

        self.env.queue.after(max(0, due_ms - self._now_ms), fire)

    def _flush_group(self, log_id: LogId) -> None:
        group = self._staged.pop(log_id, None)
        if group and self.up:
            core = self.core(log_id)
            self._apply(core, core.sequencer.on_append_group(group, self._now_ms))

    def core(self, log_id: LogId) -> Core:
        core = self.cores.get(log_id)
        if core is None:
            self._cores_created_count += 1
            sequencer = Sequencer(
                log_id=log_id, node_id=self.node_id, config=self.config,
                rng=random.Random(self.env.rng.getrandbits(64)), esn_max=Esn(
                    self.env.options.esn_max), store_latency=self.store_latency)
            core = Core(sequencer, f"sequencer {self.node_id}#{self._cores_created_count}")
            self.cores[log_id] = core
            self._core_of[sequencer] = core
        return core

    def _live(self, core: Core) -> bool:
        return self.up and self.cores.get(core.sequencer.log_id) is core

    def _apply(self, core: Core, effects: list[Any]) -> None:
        self.driver.apply(core.sequencer, effects)

    # ---- ports of the shared effect glue (``sequencer.handlers.SequencerPorts``) -----------

    def now_ms(self) -> int:
        return self._now_ms

    def send(self, node: NodeId, message: Any) -> None:
        self.env.network.send(self.node_id, node, message)

    def send_store(self, node: NodeId, store: Store, callback: Callback) -> None:
        self.env.checker.on_store_sent(store)
        if store.wave > 1:
            self.env.stats["store_retry_wave"] += 1
        stats = self.env.stats

        def on_reply(reply: Any) -> None:
            if type(reply) is Stored and reply.status != Status.OK:
                stats[f"stored_{reply.status.name.lower()}"] += 1
            callback(reply)

        self.env.network.request(self.node_id, node, store, on_reply)

    def send_store_batch(self, node: NodeId, batch: StoreBatch, callback: Callback) -> None:
        self.env.stats["store_batches"] += 1
        for store in batch.stores:
            self.env.checker.on_store_sent(store)
            if store.wave > 1:
                self.env.stats["store_retry_wave"] += 1
        self.env.network.request(self.node_id, node, batch, callback)

    def schedule_flush(self) -> None:
        incarnation = self.incarnation

        def flush() -> None:
            if incarnation == self.incarnation and self.up:
                self.driver.flush()

        self.env.queue.after(0, flush)

    def request(self, node: NodeId, message: Any, callback: Callback, *,
                timeout_ms: int | None = None) -> None:
        if type(message) is Store:
            self.env.checker.on_store_sent(message)
            self.env.stats["recovery_mutation_stores"] += 1
        core = self.cores.get(getattr(message, "log_id", None))  # type: ignore[arg-type]
        purge = core.sequencer.purge if core is not None else None
        if purge is not None and type(message) is not GetLogState and purge.owns(node, message):
            self.env.stats[f"purge_{type(message).__name__.lower()}"] += 1
        self.env.network.request(self.node_id, node, message, callback, timeout_ms=timeout_ms)

    def answer(self, sequencer: Sequencer, reply: AppendReply) -> None:
        self._on_append_reply(self._core_of[sequencer], reply)

    def release_advanced(self, sequencer: Sequencer, effect: ReleaseAdvanced) -> None:
        pass  # the checker looks at every pointer after every call (``applied``)

    def activate(self, sequencer: Sequencer) -> None:
        self._activate(self._core_of[sequencer])

    def fetch_producer(self, sequencer: Sequencer, effect: FetchProducer) -> None:
        raise AssertionError(f"the simulation appends without producers: {effect!r}")

    def write_lce(self, sequencer: Sequencer, effect: WriteLastCleanEpoch) -> None:
        self._write_lce(self._core_of[sequencer], effect)

    def recovery_progress(self, sequencer: Sequencer, effect: RecoveryProgress) -> None:
        self.env.stats[f"recovery_{effect.phase.lower()}"] += 1
        if effect.phase == "SEALING" and effect.attempt > 1:
            self.env.stats["recovery_restart"] += 1
        self._log(f"log {effect.log_id}: recovery #{effect.attempt} {effect.phase}")

    def applied(self, sequencer: Sequencer) -> None:
        core = self._core_of[sequencer]
        # Checked after every call rather than only on ReleaseAdvanced, so that a pointer
        # that moves without the effect is caught too; before the core's own invariants, so
        # that the checkers are what catches a core broken in a way it does not know about.
        self.env.checker.on_release(core.name, sequencer.log_id, sequencer.release_lsn)
        sequencer.check_invariants()
        self._arm(core)

    def live(self, sequencer: Sequencer) -> bool:
        core = self.cores.get(sequencer.log_id)
        return self.up and core is not None and core.sequencer is sequencer

    def _write_lce(self, core: Core, effect: WriteLastCleanEpoch) -> None:
        env = self.env

        def done() -> None:
            if env.rng.random() < env.epoch_store_failure_ratio:
                status, stored = Status.CONNFAILED, Epoch(0)
            else:
                status = env.epoch_store.set_last_clean_epoch(effect.log_id, effect.epoch,
                                                              effect.tail_lsn)
                stored = env.epoch_store.clean_epoch(effect.log_id)
                if status == Status.OK:
                    env.checker.on_clean_epoch(effect.log_id, effect.epoch, effect.tail_lsn)
            if not self._live(core):
                return
            env.stats[f"recovery_lce_{status.name.lower()}"] += 1
            self._log(f"log {effect.log_id}: recovered epochs up to {effect.epoch}, tail "
                      f"{format_lsn(effect.tail_lsn)}: {status.name}")
            self._apply(core, core.sequencer.on_lce_written(status, stored, self._now_ms))

        env.queue.after(env.rng.randint(0, env.options.epoch_store_delay_ms_max), done)

    def _on_append_reply(self, core: Core, reply: AppendReply) -> None:
        append = self.inflight.pop(reply.request_id, None)
        if append is None:
            fail("CORE", f"{core.name} answered request {reply.request_id} twice or unasked: "
                 f"{reply}")
        if reply.status == Status.TIMEDOUT:
            self.env.stats[f"core_timedout_{core.sequencer.state.name.lower()}"] += 1
        self.env.on_core_reply(append, reply)

    def _activate(self, core: Core) -> None:
        env = self.env
        log_id = core.sequencer.log_id

        def done() -> None:
            rng = env.rng
            failing = rng.random() < env.epoch_store_failure_ratio
            if failing and rng.random() < 0.5:
                status, epoch, metadata = Status.CONNFAILED, Epoch(0), None
            else:
                status, epoch, metadata = env.epoch_store.activate(
                    log_id, writer=self.node_id, provision=env.provision)
                if failing:
                    # The epoch was taken but the answer got lost: it stays unused forever.
                    status, epoch, metadata = Status.TIMEDOUT, Epoch(0), None
            lce = None
            if status == Status.OK:
                status, lce = env.epoch_store.get_last_clean_epoch(log_id)
            if not self._live(core):
                return
            env.stats[f"activation_{status.name.lower()}"] += 1
            if status == Status.OK and lce is not None and lce.epoch < epoch - 1:
                env.stats["activation_over_unclean"] += 1
            self._log(f"log {log_id}: activation {status.name} epoch {epoch} "
                      f"(clean {lce.epoch if lce else '-'})")
            self._apply(core, core.sequencer.on_activated(status, epoch, metadata, lce,
                                                          self._now_ms))

        env.queue.after(env.rng.randint(0, env.options.epoch_store_delay_ms_max), done)

    def _on_message(self, peer: NodeId, message: Any, reply: ReplyFn | None) -> None:
        raise AssertionError(f"{self.node_id} got unexpected {message!r} from {peer}")

    # ---- timers ---------------------------------------------------------------------------

    def _arm(self, core: Core) -> None:
        deadline_ms = core.sequencer.deadline_ms()
        if deadline_ms is None or deadline_ms in core.armed_ms:
            return
        core.armed_ms.add(deadline_ms)

        def fire() -> None:
            core.armed_ms.discard(deadline_ms)
            due_ms = core.sequencer.deadline_ms()
            if self._live(core) and due_ms is not None and due_ms <= self._now_ms:
                self._apply(core, core.sequencer.on_timer(self._now_ms))

        self.env.queue.at(max(deadline_ms, self._now_ms), fire)

    def _broadcast(self) -> None:
        if self.up:
            for core in list(self.cores.values()):
                if self._deactivate_if_idle(core):
                    continue
                if core.sequencer.release_broadcast_due():
                    self._apply(core, core.sequencer.release_broadcast())
        self.env.queue.after(self.config.release_broadcast_interval_ms, self._broadcast)

    def _deactivate_if_idle(self, core: Core) -> bool:
        """As ``SequencerRuntime._deactivate``; the clean mark is written at once (the
        runtime's next activation of the log waits for it)."""
        sequencer = core.sequencer
        if not self.env.options.idle_deactivate_ms or not self.accepts_appends():
            return False
        tail = sequencer.idle_clean_tail(self._now_ms)
        if tail is None or sequencer.metadata is None:
            return False
        self._apply(core, sequencer.release_broadcast(final=True))
        del self.cores[sequencer.log_id]
        status = self.env.epoch_store.set_last_clean_epoch(sequencer.log_id, sequencer.epoch,
                                                           tail)
        self._log(f"log {sequencer.log_id}: idle, deactivated; epoch {sequencer.epoch} clean "
                  f"with tail {format_lsn(tail)}: {status.name}")
        self.env.stats[f"idle_clean_epoch_{status.name.lower()}"] += 1
        if status == Status.OK:
            self.env.checker.on_clean_epoch(sequencer.log_id, sequencer.epoch, tail)
        return True

    # ---- crash, restart, drain ------------------------------------------------------------

    def crash(self, outcome: Status = Status.CONNFAILED) -> None:
        """Stop at once: the cores and every append they had are gone (outcome unknown)."""
        assert self.up, self.node_id
        self.up = False
        self.draining = False
        self.incarnation += 1
        self.env.network.crash(self.node_id)
        for append in self.inflight.values():
            append.orphaned = True
            append.answer(outcome, self._now_ms)
        self.inflight.clear()
        self._staged.clear()
        self.driver.reset()
        self.cores = {}
        self.store_latency = StoreLatency()
        self.env.stats["sequencer_crash" if outcome == Status.CONNFAILED else "drain_closed"] += 1
        self._log("CRASH" if outcome == Status.CONNFAILED else "CLOSED")

    def restart(self) -> None:
        assert not self.up, self.node_id
        self.up = True
        self.env.network.restart(self.node_id)
        self._log("RESTART")

    def drain(self, on_closed: Callable[[], None]) -> None:
        assert self.up and not self.draining, self.node_id
        self.draining = True
        incarnation = self.incarnation
        deadline_ms = self._now_ms + self.env.options.drain_timeout_ms
        self._log("DRAIN")

        def poll() -> None:
            if self.incarnation != incarnation:
                return
            busy = any(core.sequencer.appenders for core in self.cores.values())
            if busy and self._now_ms < deadline_ms:
                self.env.queue.after(DRAIN_POLL_MS, poll)
                return
            cores = [c for c in self.cores.values()
                     if c.sequencer.drained_clean_tail() is not None
                     and c.sequencer.metadata is not None]
            waiting = {id(c) for c in cores}

            def finished(core: Core) -> None:
                waiting.discard(id(core))
                if not waiting and self.incarnation == incarnation:
                    close()

            for core in cores:
                self._confirm_and_clean(core, deadline_ms, finished)
            if not cores:
                close()

        def close() -> None:
            self.crash(Status.SHUTDOWN)
            on_closed()

        poll()

    def _confirm_and_clean(self, core: Core, deadline_ms: int,
                           finished: Callable[[Core], None]) -> None:
        """Broadcast the release, confirm every nodeset node has it (GET_LOG_STATE), then
        mark the drained epoch clean; give up at the drain deadline."""
        sequencer = core.sequencer
        assert sequencer.metadata is not None
        self._apply(core, sequencer.release_broadcast(final=True))
        self.driver.flush()  # the RELEASEs leave before the GET_LOG_STATEs
        nodes = sequencer.metadata.nodeset
        answers: dict[NodeId, bool] = {}
        state = {"done": False}

        def end(confirmed: bool) -> None:
            if state["done"] or not self._live(core):
                return
            state["done"] = True
            tail = sequencer.drained_clean_tail()
            if confirmed and tail is not None:
                status = self.env.epoch_store.set_last_clean_epoch(
                    sequencer.log_id, sequencer.epoch, tail)
                self._log(f"log {sequencer.log_id}: epoch {sequencer.epoch} clean with tail "
                          f"{format_lsn(tail)}: {status.name}")
                self.env.stats[f"clean_epoch_{status.name.lower()}"] += 1
                if status == Status.OK:
                    self.env.checker.on_clean_epoch(sequencer.log_id, sequencer.epoch, tail)
            finished(core)

        def on_reply(node: NodeId, reply: Any) -> None:
            answers[node] = (type(reply) is LogState and reply.status == Status.OK
                             and reply.release_lsn >= sequencer.release_lsn)
            if len(answers) == len(nodes):
                end(all(answers.values()))

        def reply_from(node: NodeId) -> Callable[[Any], None]:
            return lambda reply: on_reply(node, reply)

        for node in nodes:
            self.env.network.request(self.node_id, node, GetLogState(log_id=sequencer.log_id),
                                     reply_from(node))
        self.env.queue.at(max(deadline_ms, self._now_ms), lambda: end(False))
