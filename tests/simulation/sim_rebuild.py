"""Disk replacement and rebuilding in the simulation (issue 17).

A replaced disk (``SimCluster.replace_disk``): the storage node goes down, its disk is new
and empty (records, release pointers, seals and settled marks gone), its authoritative status
vouches for nothing (``AuthorityStatus.unsure_of_everything``) and its disk has a new
generation. When it comes back, the shard is recorded REBUILDING in the cluster state with
every other storage node as a donor, as ``storage_node.rebuild_runtime`` does.

What runs is the production code, driven by the event queue:

- the cluster state is a ``shared.cluster_state.ClusterState`` in a simulated store
  (``SimClusterStateStore``), changed only by the module's transitions (``rebuild_started``,
  ``donor_progressed``, ``rebuild_finished``), by compare-and-swap on a version;
- each donor walks its copies with ``storage_node.core.rebuild.DonorCore`` (its plan, token
  bucket, chunks, checkpoints, resume from the checkpoint after a crash); the plan's
  questions are the shipped ``RebuildRuntime._ask_tails`` through a ``FrontEnd`` of the
  donor's own (``SimFrontends.storage_frontend``) over simulated messages, and a donor's
  activation requests are delivered (an unclean log's sequencer activates); its reads come from the
  simulated disk, each record packed as the STORE fields a segment holds
  (``shared.wire.codec.encode_fields``); its chunks go over the simulated network as
  REBUILD_STORE frames, with a timeout;
- the node being rebuilt answers them with ``RebuildRuntime.on_rebuild_store`` itself (the
  shipped handler: it adopts release pointers and seals, writes copies only where it holds
  none, answers once they are durable), through ``_RuntimePorts``, which gives it the
  simulated node as the ``StorageNode`` it expects;
- every ``poll_interval_ms`` each up node reads the cluster state: donors start (or resume)
  their walks, and a node whose donors are all done vouches for everything again
  (``AuthorityStatus.clear``) and records AUTHORITATIVE, or, having found damage since its
  rebuild began, begins it again for a new generation over the old scope and the new
  damage's; an authoritative node that found damage records its rebuild (the shipped
  ``target_decision``).

Mini-rebuilding: a damaged restart whose damage is ranged (``SimCluster.restart_storage``
with ``damage_repair_ratio``; ``SimStorageNode.restart(repair=True)``) reports the scope of
what it lost (per log, its first to last lost LSN, as a damaged segment's index file says),
and the node records a mini-rebuild of that scope; donors walk only those ranges (the
shipped ``DonorCore`` with ``dirty``), and D1 is checked for the lost copies when it
finishes. Damage without a range stays unrepaired, as before.

Not modelled: drains, the start-up identity marker (the sim knows the disk is new),
epoch-store failures of the cluster state (it always answers).
"""

from __future__ import annotations

import dataclasses
from asyncio import events as asyncio_events
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared import cluster_state as cs
from shared.cluster_state import ClusterState, DonorProgress, ShardStatus
from shared.status import Status
from shared.types import LSN_MAX, Esn, LogId, Lsn, NodeId
from shared.wire.codec import encode_fields
from shared.wire.rebuild import RebuildStore, RebuildStored
from shared.wire.store import Store, copy_precedence, payloads_checksum
from storage_node.core.rebuild import (
    READ_RECORDS_MAX,
    AskTails,
    DonorCore,
    Finished,
    ListLogs,
    Piece,
    ReadChunk,
    SaveCheckpoint,
    SendChunk,
    Sleep,
    Tail,
    TokenBucket,
)
from storage_node.core.rebuild_accept import HeldCopy
from storage_node.core.rebuild_scope import TargetStep, target_decision
from storage_node.rebuild_runtime import RebuildConfig, RebuildRuntime
from tests.simulation.sim_clock import EventQueue
from tests.simulation.sim_storage import SimStorageNode

if TYPE_CHECKING:  # avoids an import cycle
    from tests.simulation.sim_cluster import SimCluster


class SimClusterStateStore:
    """The cluster state document, changed by compare-and-swap on its version (the epoch
    store's znode). Synchronous: a change is read, planned and written in one event."""

    def __init__(self) -> None:
        self.state: ClusterState = cs.EMPTY
        self.version = 0

    def change(self, transition: cs.Transition) -> ClusterState:
        new = transition(self.state)
        if new is not None:
            self.state, self.version = new, self.version + 1
        return self.state


@dataclass(frozen=True, slots=True, kw_only=True)
class SimRebuildConfig:
    rate_bytes_per_s: int = 0
    burst_bytes: int = 4096
    chunk_bytes_max: int = 4096
    poll_interval_ms: int = 100
    checkpoint_interval_ms: int = 200
    send_timeout_ms: int = 1_000


class _StorePorts:
    """``node.store`` as ``RebuildRuntime.on_rebuild_store`` uses it."""

    def __init__(self, node: SimStorageNode) -> None:
        self._node = node

    @property
    def authority(self) -> Any:
        return self._node.disk.authority

    def held_ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        return self._node.held_ranges(log_id, from_lsn, until_lsn)

    def submit_store(self, store: Store, done: Callable[[Status], None], *,
                     inline_ok: bool = True) -> Status:
        # ``inline_ok`` picks the real store's commit thread; the simulated disk has none.
        return self._node.submit_store(store, done)

    def submit_seal(self, seal: Any, done: Callable[[Status], None]) -> Status:
        return self._node.submit_seal(seal, done)

    def submit_trim(self, trim: Any, done: Callable[[Status], None]) -> Status:
        raise AssertionError("the simulation never trims")

    def indexed_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn
                       ) -> list[tuple[int, int, object]]:
        """As ``RecordStore.indexed_copies``: which copy each LSN resolves to (the record
        written there is its key)."""
        records = self._node.disk.records
        return [(lsn, lsn, records[(log_id, Lsn(lsn))])
                for lsn, _ in self._node.held_ranges(log_id, from_lsn, until_lsn)]

    def read_precedences(self, log_id: LogId, ranges: list[tuple[int, int]],
                         done: Callable[[list[HeldCopy]], None]) -> None:
        """As ``RecordStore.read_precedences``: the held copies as they are now, answered
        after a disk access (a copy written meanwhile has another key)."""
        records = self._node.disk.records
        found: list[HeldCopy] = []
        for first, last in ranges:
            for lsn, _ in self._node.held_ranges(log_id, Lsn(first), Lsn(last)):
                record = records[(log_id, lsn)]
                found.append((lsn, lsn, copy_precedence(record.flags, record.wave), record))
        loop = asyncio_events.get_running_loop()
        self._node.after_disk(lambda: loop.call_soon(done, found))

    def queued_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn
                      ) -> list[tuple[int, int, tuple[int, int]]]:
        """As ``RecordStore.queued_copies``: the copies submitted and not yet written."""
        return [(s.lsn, s.last_lsn, copy_precedence(s.flags, s.wave))
                for s in self._node.pending_stores
                if s.log_id == log_id and s.lsn <= until_lsn and s.last_lsn >= from_lsn]


class _RuntimePorts:
    """The simulated node as the ``StorageNode`` that ``RebuildRuntime`` drives (only what
    its REBUILD_STORE handler touches)."""

    def __init__(self, node: SimStorageNode) -> None:
        self._node = node
        self.node_id = node.node_id
        self.accepts_writes = True
        self.store = _StorePorts(node)
        self.handler: Callable[[RebuildStore, Callable[[Any], None]], None] | None = None

    def add_handler(self, kind: type, handler: Any) -> None:
        assert kind is RebuildStore
        self.handler = handler

    def not_serving(self) -> Status | None:
        return self._node.not_serving()

    @property
    def machine(self) -> Any:
        return self._node.machine

    @property
    def core(self) -> Any:
        return self._node.handlers

    def log_state(self, log_id: LogId) -> Any:
        return self._node.machine.state(log_id)


@dataclass(eq=False)
class _Donation:
    donor: NodeId
    shard: NodeId
    generation: int
    incarnation: int
    core: DonorCore
    rebuild_id: int = 0
    """``ShardState.rebuild_id`` walked for (as ``RebuildRuntime``'s ``_Donation``)."""


class SimRebuilding:
    def __init__(self, cluster: SimCluster, config: SimRebuildConfig) -> None:
        self._cluster = cluster
        self.config = config
        self.store = SimClusterStateStore()
        self.runtimes: dict[NodeId, RebuildRuntime] = {}
        self._donations: dict[tuple[NodeId, NodeId], _Donation] = {}
        self.replaced_pending: set[NodeId] = set()
        """Replaced while down: recorded REBUILDING when they come back."""
        self.repair_pending: set[NodeId] = set()
        """Damaged with a known scope: recorded REBUILDING (a mini-rebuild) by their poll."""
        runtime_config = RebuildConfig(send_timeout_ms=config.send_timeout_ms)
        for node_id, node in cluster.storage.items():
            ports = _RuntimePorts(node)

            def front(node_id: NodeId = node_id) -> Any:
                return cluster.frontends.storage_frontend(node_id)

            runtime = RebuildRuntime(
                node=ports,  # type: ignore[arg-type]
                data_dir="", cluster_name="sim", state_store=None,  # type: ignore[arg-type]
                storage_nodes=lambda: tuple(cluster.storage), request=_no_request,
                config=runtime_config, wall_ms=cluster.clock.now_ms,
                sequencer_tail=lambda log_id, front=front: front().inflight_tail(log_id),
                active_tails=lambda front=front: front().active_tails())
            runtime.generation = node.generation
            assert ports.handler is not None
            node.rebuild_handler = _on_the_queue(ports.handler, cluster.queue)
            self.runtimes[node_id] = runtime
            self.store.change(cs.registered(node_id, node.generation, 0))
        self._polling = False

    def start_polling(self) -> None:
        """From the first disk replacement on (runs without one keep their schedule)."""
        if not self._polling:
            self._polling = True
            self._schedule_poll()

    # ---- state ----------------------------------------------------------------------------

    @property
    def state(self) -> ClusterState:
        return self.store.state

    def rebuilding(self) -> list[NodeId]:
        """Shards being rebuilt, or replaced and not yet back."""
        return sorted({NodeId(s.node_id) for s in self.state.shards
                       if s.status is ShardStatus.REBUILDING} | self.replaced_pending
                      | self.repair_pending)

    # ---- the replaced node comes back ------------------------------------------------------

    def on_restart(self, node_id: NodeId) -> None:
        node = self._cluster.storage[node_id]
        runtime = self.runtimes[node_id]
        runtime.generation = node.generation
        if node_id not in self.replaced_pending:
            return
        self.replaced_pending.discard(node_id)
        donors = tuple(n for n in self._cluster.storage if n != node_id)
        runtime.state = self.store.change(cs.rebuild_started(
            node_id, node.generation, donors, now_ms=self._cluster.now_ms,
            reason="disk replaced", requested_by=node_id))
        self._cluster.stats["rebuild_started"] += 1
        self._cluster.log(f"storage {node_id} REBUILDING generation {node.generation} "
                          f"from {list(donors)}")

    # ---- polling ---------------------------------------------------------------------------

    def _schedule_poll(self) -> None:
        self._cluster.queue.after(self.config.poll_interval_ms, self._poll_all)

    def _poll_all(self) -> None:
        if self._cluster.finished:
            return
        for node_id, node in self._cluster.storage.items():
            if node.up and not self._cluster.network.stalled(node_id, self._cluster.now_ms):
                self._poll(node_id)
        self._schedule_poll()

    def _poll(self, node_id: NodeId) -> None:
        node = self._cluster.storage[node_id]
        runtime = self.runtimes[node_id]
        state = self.state
        runtime.state = state
        mine = state.shard(node_id)
        authority = node.disk.authority
        decision = target_decision(mine, node.generation, damaged=authority.damaged,
                                   damage_found=authority.damage_found,
                                   damage_covered=authority.damage_covered,
                                   pending=authority.damage_scope())
        step = decision.step
        if step is TargetStep.START and node_id not in self.repair_pending:
            step = TargetStep.NOTHING  # damage the simulation leaves unrepaired
        if step is TargetStep.RESTART:
            # As ``RebuildRuntime._begin_again``: damage found while being rebuilt (copies
            # the donors sent may be gone): the rebuild begins again, for a new generation,
            # over the old scope and the new damage's.
            found = authority.damage_found
            node.generation += 1
            runtime.generation = node.generation
            donors = tuple(n for n in self._cluster.storage if n != node_id)
            runtime.state = state = self.store.change(cs.rebuild_started(
                node_id, node.generation, donors, now_ms=self._cluster.now_ms,
                reason="copies found damaged while being rebuilt", requested_by=node_id,
                dirty=decision.dirty))
            authority.rebuild_covers(found)
            self.repair_pending.discard(node_id)
            self._cluster.stats["rebuild_begun_again"] += 1
            self._cluster.log(f"storage {node_id} damaged while REBUILDING: generation "
                              f"{node.generation} from {list(donors)}, "
                              f"{'mini ' + str(decision.dirty) if decision.dirty else 'all'}")
        elif step is TargetStep.START:
            # As ``RebuildRuntime.poll_once``: damaged copies found while authoritative: a
            # mini-rebuild of their scope (or the whole shard), same generation.
            found = authority.damage_found
            donors = tuple(n for n in self._cluster.storage if n != node_id)
            runtime.state = state = self.store.change(cs.rebuild_started(
                node_id, node.generation, donors, now_ms=self._cluster.now_ms,
                reason="damaged copies found", requested_by=node_id, dirty=decision.dirty))
            authority.rebuild_covers(found)
            self.repair_pending.discard(node_id)
            self._cluster.stats["rebuild_mini_started" if decision.dirty
                                else "rebuild_damage_started"] += 1
            self._cluster.log(f"storage {node_id} damaged: REBUILDING generation "
                              f"{node.generation} "
                              f"{'mini ' + str(decision.dirty) if decision.dirty else 'all'}")
        elif step is TargetStep.FINISH and mine is not None:
            # As ``RebuildRuntime._finish``: vouch for everything again, then say so.
            node.disk.authority.clear(None, 1, LSN_MAX)
            runtime.state = self.store.change(cs.rebuild_finished(
                node_id, mine.rebuild_generation, self._cluster.now_ms))
            self._cluster.stats["rebuild_finished"] += 1
            self._cluster.stats["rebuild_mini_finished"] += mine.mini
            self._cluster.log(f"storage {node_id} REBUILT generation {node.generation}"
                              f"{' (mini)' if mine.mini else ''}: authoritative again")
            self._cluster.checker.on_rebuilt(node_id)
        for shard in state.shards:
            if shard.node_id == node_id or shard.status is not ShardStatus.REBUILDING:
                continue
            progress = shard.donor(node_id)
            if progress is None or progress.done:
                continue
            key = (node_id, NodeId(shard.node_id))
            current = self._donations.get(key)
            if (current is not None and current.generation == shard.rebuild_generation
                    and current.rebuild_id == shard.rebuild_id
                    and current.incarnation == node.incarnation
                    and not current.core.progress.done):
                # (One of another rebuild of the same generation, an earlier mini-rebuild,
                # is replaced, as ``_run_donations`` does.)
                continue
            self._start(node_id, NodeId(shard.node_id), shard.rebuild_generation, progress,
                        shard.dirty, shard.rebuild_id)

    # ---- donating (``RebuildRuntime._donate``, on the event queue) -------------------------

    def _start(self, donor_id: NodeId, shard: NodeId, generation: int,
               progress: DonorProgress, dirty: cs.DirtyRanges = (),
               rebuild_id: int = 0) -> None:
        node = self._cluster.storage[donor_id]
        now_ms = self._cluster.now_ms
        logs = [(int(log_id), int(node.machine.state(log_id).last_lsn))
                for log_id in node.machine.log_ids()]
        if progress.bytes_total == 0:
            live = sum(len(r.payload) for r in node.disk.records.values())
            progress = dataclasses.replace(progress, bytes_total=max(live, 1),
                                           updated_ms=now_ms)
        bucket = TokenBucket(self.config.rate_bytes_per_s, self.config.burst_bytes, now_ms)
        core = DonorCore(shard=shard, logs=logs, progress=progress, bucket=bucket,
                         by_copyset=False,
                         checkpoint_interval_ms=self.config.checkpoint_interval_ms,
                         now_ms=now_ms, chunk_bytes_max=self.config.chunk_bytes_max,
                         dirty=dirty)
        donation = _Donation(donor_id, shard, generation, node.incarnation, core, rebuild_id)
        self._donations[(donor_id, shard)] = donation
        self._cluster.log(f"storage {donor_id} donates to {shard} (generation {generation}) "
                          f"from log {progress.log_id} LSN {progress.next_lsn}")
        self._step(donation)

    def _alive(self, donation: _Donation) -> bool:
        node = self._cluster.storage[donation.donor]
        return (node.up and node.incarnation == donation.incarnation
                and self._donations.get((donation.donor, donation.shard)) is donation)

    def _step(self, donation: _Donation) -> None:
        cluster = self._cluster
        while self._alive(donation):
            if cluster.network.stalled(donation.donor, cluster.now_ms):
                cluster.queue.after(10, lambda: self._step(donation))
                return
            core = donation.core
            now_ms = cluster.now_ms
            effect = core.next(now_ms)
            if effect is None:
                return  # an effect is under way: its completion steps again
            if isinstance(effect, AskTails):
                self._ask_tails(donation, effect)
                return
            if isinstance(effect, ListLogs):
                node = cluster.storage[donation.donor]
                core.on_logs([(int(log_id), int(node.machine.state(log_id).last_lsn))
                              for log_id in node.machine.log_ids()], now_ms)
                continue
            if isinstance(effect, ReadChunk):
                self._read(donation, effect)
                return
            if isinstance(effect, SendChunk):
                self._send(donation, effect)
                return
            if isinstance(effect, Sleep):
                cluster.queue.at(max(effect.until_ms, now_ms + 1),
                                 lambda: self._step(donation))
                return
            if isinstance(effect, SaveCheckpoint):
                self.store.change(cs.donor_progressed(
                    donation.shard, donation.generation, donation.donor, effect.progress,
                    donation.rebuild_id))
                core.on_checkpointed(True, now_ms)
                continue
            assert isinstance(effect, Finished)
            self.store.change(cs.donor_progressed(
                donation.shard, donation.generation, donation.donor, effect.progress,
                    donation.rebuild_id))
            cluster.stats["rebuild_donor_done"] += 1
            cluster.log(f"storage {donation.donor} donated {effect.progress.records} records "
                        f"to {donation.shard}")
            return

    def _ask_tails(self, donation: _Donation, effect: AskTails) -> None:
        """The shipped ``RebuildRuntime._ask_tails`` (through the shipped
        ``FrontEnd.active_tails``/``inflight_tail`` of the donor's own frontend, over
        simulated messages)."""
        cluster = self._cluster
        runtime = self.runtimes[donation.donor]

        def answered(answers: dict[int, Tail | None] | None) -> None:
            if not self._alive(donation):
                return
            cluster.stats["rebuild_tails_asked"] += len(effect.log_ids)
            donation.core.on_tails(answers, cluster.now_ms)
            self._step(donation)

        cluster.frontends.run(runtime._ask_tails(effect.log_ids, effect.everywhere), answered)

    def _read(self, donation: _Donation, chunk: ReadChunk) -> None:
        node = self._cluster.storage[donation.donor]

        def read() -> None:
            if not self._alive(donation):
                return
            log_id = LogId(chunk.log_id)
            found = sorted((lsn, record) for (log, lsn), record in node.disk.records.items()
                           if log == log_id and chunk.from_lsn <= lsn <= chunk.until_lsn)
            page = found[:READ_RECORDS_MAX]
            next_lsn = (page[-1][0] + 1 if len(found) > len(page) else chunk.until_lsn + 1)
            pieces = []
            for lsn, record in page:
                payloads = (record.payload,)
                store = Store(log_id=log_id, lsn=Lsn(lsn), wave=record.wave,
                              sequencer_node=record.sequencer_node, copyset=(),
                              timestamp_ms=record.timestamp_ms,
                              last_known_good=Esn(record.last_known_good),
                              release_lsn=Lsn(0), timeout_ms=0, key=None, payloads=payloads,
                              checksum=payloads_checksum(payloads), flags=record.flags)
                pieces.append(Piece(lsn, lsn, (), encode_fields(store), len(record.payload)))
            donation.core.on_read(pieces, next_lsn, self._cluster.now_ms)
            self._step(donation)

        node.after_disk(read)

    def _send(self, donation: _Donation, chunk: SendChunk) -> None:
        cluster = self._cluster
        state = cluster.storage[donation.donor].machine.state(LogId(chunk.log_id))
        message = RebuildStore(shard=donation.shard, generation=donation.generation,
                               log_id=chunk.log_id, release_lsn=int(state.release_lsn),
                               trim_lsn=int(state.trim_lsn),
                               sealed_epoch=int(state.sealed_epoch),
                               sealed_by=state.sealed_by or "", entries=chunk.entries)

        def answered(answer: Any) -> None:
            if not self._alive(donation):
                return
            status = (answer.status if isinstance(answer, RebuildStored)
                      else answer if isinstance(answer, Status) else Status.BADMSG)
            if status is Status.OK:
                cluster.stats["rebuild_chunks"] += 1
            else:
                cluster.stats["rebuild_send_failed"] += 1
                if status is Status.STALE:
                    # The shard has another disk now: the next poll decides.
                    del self._donations[(donation.donor, donation.shard)]
                    return
            donation.core.on_sent(status, cluster.now_ms)
            self._step(donation)

        cluster.network.request(donation.donor, donation.shard, message, answered,
                                timeout_ms=self.config.send_timeout_ms)


class _QueueLoop:
    """What the REBUILD_STORE handler may ask of ``asyncio.get_running_loop()`` (it writes a
    large chunk in slices, one per loop iteration): ``call_soon`` on the event queue."""

    def __init__(self, queue: EventQueue) -> None:
        self._queue = queue

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        self._queue.after(0, lambda: self.run(callback, *args))

    def run(self, callback: Callable[..., None], *args: Any) -> None:
        """``callback`` with this as the running loop (the simulation has none)."""
        asyncio_events._set_running_loop(self)
        try:
            callback(*args)
        finally:
            asyncio_events._set_running_loop(None)


def _on_the_queue(handler: Callable[[RebuildStore, Callable[[Any], None]], None],
                  queue: EventQueue) -> Callable[[RebuildStore, Callable[[Any], None]], None]:
    loop = _QueueLoop(queue)

    def handle(message: RebuildStore, reply: Callable[[Any], None]) -> None:
        loop.run(handler, message, reply)
    return handle


def _no_request(*_: Any) -> None:
    raise AssertionError("the simulation sends REBUILD_STOREs itself")
