"""A simulated storage node: the real ``StoreMachine`` plus an in-memory disk.

The disk (records with their flags, release pointers and durable seals) survives crashes; with
``fsync=always`` semantics a record is on it before STORED goes out. Epoch recovery's messages
(SEAL, GET_DIGEST, CLEAN) are served like ``storage_node.runtime`` serves them, with the same
pure decisions of ``StoreMachine``. Writing takes ``disk_delay_ms``: a crash in between
loses the write and its reply. A crash loses everything only in memory (the machine, hence the
soft seals); a restart rebuilds the machine with ``restore`` from the disk, the way
``storage_node.record_store`` does (the newest record's epoch re-creates its soft seal).

``damage_disk`` models a segment damaged mid-way that a restart's scan finds: some records
are gone, and the node knows it: its authoritative status (``storage_node.core.authority``,
kept with the disk) then marks every log, and its SEALED and DIGEST answers say so, as the
real node's do. (The model loses records only; a real damaged segment can lose seals and
release pointers too.)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

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
from shared.wire.read import GetLogState
from shared.wire.recovery import Clean, Digest, GetDigest, Seal
from shared.wire.release import Release
from shared.wire.store import RecordFlags, Store
from shared.wire.store_batch import ReleaseBatch, StoreBatch, release_batch_entries
from storage_node.core.authority import AuthorityStatus, annotated_reply
from storage_node.core.inflight_stores import InflightStores
from storage_node.core.store_batch import StoredBatchAnswers
from storage_node.core.store_machine import (
    LogStorageState,
    StoreMachine,
    purge_ranges,
    recovery_hole_stores,
    stored_reply,
)
from tests.simulation.sim_client import store_payloads
from tests.simulation.sim_clock import EventQueue
from tests.simulation.sim_network import ReplyFn, SimNetwork
from tests.simulation.sim_trace import Trace

DiskWriteHook = Callable[[NodeId, LogId, Lsn, "DiskRecord", "DiskRecord | None"], None]
"""(node, log, lsn, copy written, copy it replaced or None)."""
ReleaseHook = Callable[[str, LogId, Lsn], None]


@dataclass(frozen=True, slots=True)
class DiskRecord:
    payload: bytes
    sequencer_node: NodeId
    flags: int = 0
    wave: int = 1
    last_known_good: int = 0
    timestamp_ms: int = 0

    @property
    def is_hole(self) -> bool:
        return bool(self.flags & RecordFlags.HOLE)


@dataclass(slots=True)
class Disk:
    records: dict[tuple[LogId, Lsn], DiskRecord]
    release_lsn: dict[LogId, Lsn]
    seals: dict[LogId, tuple[Epoch, NodeId]] = field(default_factory=dict)
    clean_marks: dict[tuple[LogId, Epoch], int] = field(default_factory=dict)
    """Epochs a CLEAN settled here: their last-known-good ESN raised (``clean_mark``)."""
    authority: AuthorityStatus = field(default_factory=AuthorityStatus)
    """What the node can vouch for (lost copies found by a restart's scan)."""


class SimStorageNode:
    def __init__(
        self,
        node_id: NodeId,
        *,
        network: SimNetwork,
        queue: EventQueue,
        rng: random.Random,
        disk_delay_ms_max: int,
        trace: Trace,
        on_disk_write: DiskWriteHook,
        on_release: ReleaseHook,
    ) -> None:
        self.node_id = node_id
        self._network = network
        self._queue = queue
        self._rng = rng
        self._disk_delay_ms_max = disk_delay_ms_max
        self._trace = trace
        self._on_disk_write = on_disk_write
        self._on_release = on_release
        self.disk = Disk(records={}, release_lsn={})
        self.machine = StoreMachine(accept_writes=True)
        self.inflight: InflightStores[ReplyFn] = InflightStores()
        """As in ``storage_node.runtime``: STOREs being written, which copies join."""
        self.stores_joined_count = 0
        self.up = True
        self.incarnation = 0
        network.add_node(node_id, self.on_message)

    # ---- lifecycle ----------------------------------------------------------------------

    def crash(self) -> None:
        assert self.up, self.node_id
        self.up = False
        self.incarnation += 1
        self.inflight = InflightStores()  # the writes in flight are lost, and their replies
        self._network.crash(self.node_id)
        self._trace.log(self._queue.clock.now_ms(), f"storage {self.node_id} CRASH")

    def restart(self) -> None:
        assert not self.up, self.node_id
        self.machine = StoreMachine(accept_writes=True)
        for log_id, state in self._recovered_states().items():
            self.machine.restore(log_id, state)
        self.up = True
        self._network.restart(self.node_id)
        self._trace.log(self._queue.clock.now_ms(), f"storage {self.node_id} RESTART")

    def damage_disk(self, keep_fraction: float) -> list[tuple[LogId, Lsn]]:
        """While down: lose a random part of the records (each kept with ``keep_fraction``),
        as a damaged segment does; the restart's scan finds it (marks every log). Returns
        the copies lost."""
        assert not self.up, self.node_id
        lost = [key for key in sorted(self.disk.records) if self._rng.random() >= keep_fraction]
        for key in lost:
            del self.disk.records[key]
        self.disk.authority.segments_damaged(frozenset({self.incarnation}))
        self._trace.log(self._queue.clock.now_ms(),
                        f"storage {self.node_id} DISK DAMAGED ({len(lost)} copies lost)")
        return lost

    def _recovered_states(self) -> dict[LogId, LogStorageState]:
        states: dict[LogId, LogStorageState] = {}
        newest: dict[LogId, NodeId] = {}
        tails: dict[LogId, dict[Epoch, tuple[int, int]]] = {}
        for (log_id, lsn), record in self.disk.records.items():
            state = states.get(log_id, LogStorageState())
            if lsn > state.last_lsn:
                states[log_id] = replace(state, last_lsn=lsn)
                newest[log_id] = record.sequencer_node
            epoch_tails = tails.setdefault(log_id, {})
            lng, last = epoch_tails.get(lsn_to_epoch(lsn), (0, 0))
            epoch_tails[lsn_to_epoch(lsn)] = (max(lng, record.last_known_good),
                                             max(last, lsn_to_esn(lsn)))
        for (log_id, epoch), esn in self.disk.clean_marks.items():
            epoch_tails = tails.setdefault(log_id, {})
            lng, last = epoch_tails.get(epoch, (0, 0))
            epoch_tails[epoch] = (max(lng, esn), max(last, esn))
        for log_id, epoch_tails in tails.items():
            states[log_id] = replace(states.get(log_id, LogStorageState()),
                                     epoch_tails=epoch_tails)
        for log_id, (sealed_epoch, sealed_by) in self.disk.seals.items():
            states[log_id] = replace(states.get(log_id, LogStorageState()),
                                     sealed_epoch=sealed_epoch, sealed_by=sealed_by)
        for log_id, release_lsn in self.disk.release_lsn.items():
            states[log_id] = replace(states.get(log_id, LogStorageState()),
                                     release_lsn=release_lsn)
        for log_id, state in states.items():
            epoch = lsn_to_epoch(state.last_lsn)
            if epoch > 1:
                states[log_id] = replace(state, soft_sealed_epoch=Epoch(epoch - 1),
                                         soft_sealed_by=newest[log_id])
        return dict(sorted(states.items()))

    # ---- messages -----------------------------------------------------------------------

    def on_message(self, peer: NodeId, message: Any, reply: ReplyFn | None) -> None:
        assert self.up
        if reply is not None and self.disk.authority.damaged:
            reply = annotated_reply(self.disk.authority, message, reply)
        if type(message) is Store:
            assert reply is not None
            self._on_store(message, reply)
        elif type(message) is StoreBatch:
            # As ``StorageNode._on_store_batch``: each STORE as if alone, one answer for all.
            assert reply is not None
            answers = StoredBatchAnswers(len(message.stores), reply)
            for index, store in enumerate(message.stores):
                self._on_store(store, answers.slot(index))
        elif type(message) is Release:
            self._handle_release(message)
        elif type(message) is ReleaseBatch:
            for release in release_batch_entries(message):
                self._handle_release(release)
        elif type(message) is GetLogState:
            assert reply is not None
            reply(self.machine.on_get_log_state(message))
        elif type(message) is Seal:
            assert reply is not None
            self._on_seal(message, reply)
        elif type(message) is GetDigest:
            assert reply is not None
            self._on_get_digest(message, reply)
        elif type(message) is Clean:
            assert reply is not None
            self._on_clean(message, reply)
        else:
            raise AssertionError(f"storage node got unexpected {message!r}")

    def _handle_release(self, release: Release) -> None:
        released = self.machine.on_release(release)
        if released is not None:
            self._persist_release(release.log_id, released)
        esn = self.machine.drained_mark(release)
        if esn is not None:
            self._mark(release.log_id, release.drained_epoch, esn)

    def _on_store(self, store: Store, reply: ReplyFn) -> None:
        decision = self.machine.on_store(store, disk_low=False)
        if decision.release_lsn is not None:
            self._persist_release(store.log_id, decision.release_lsn)
        if decision.status != Status.OK:
            assert decision.reply is not None
            reply(decision.reply)
            return
        if self.inflight.join(store, reply):
            self.stores_joined_count += 1  # a copy still being written: not written again
            return
        self.inflight.begin(store)
        incarnation = self.incarnation

        def persisted() -> None:
            if self.incarnation != incarnation:
                return  # crashed before the write was durable: no record, no reply
            self._write(store)
            reply(self.machine.on_persisted(store))
            for other, other_reply in self.inflight.finish(store):
                other_reply(stored_reply(other, Status.OK))

        self._queue.after(self._rng.randint(0, self._disk_delay_ms_max), persisted)

    def _write(self, store: Store) -> None:
        for index, payload in enumerate(store_payloads(store)):
            key = (store.log_id, Lsn(store.lsn + index))
            previous = self.disk.records.get(key)
            record = DiskRecord(payload, store.sequencer_node, store.flags, store.wave,
                                store.last_known_good, store.timestamp_ms)
            self.disk.records[key] = record
            self._on_disk_write(self.node_id, key[0], key[1], record, previous)

    def _after_disk(self, action: Callable[[], None]) -> None:
        """Run ``action`` once a disk write of ``disk_delay_ms`` is done, unless we crashed."""
        incarnation = self.incarnation

        def done() -> None:
            if self.incarnation == incarnation:
                action()

        self._queue.after(self._rng.randint(0, self._disk_delay_ms_max), done)

    def _on_seal(self, seal: Seal, reply: ReplyFn) -> None:
        answer = self.machine.on_seal(seal)
        if answer is not None:
            reply(answer)
            return

        def persisted() -> None:
            current = self.disk.seals.get(seal.log_id)
            if current is None or current[0] < seal.seal_epoch:
                self.disk.seals[seal.log_id] = (seal.seal_epoch, seal.sealed_by)
            reply(self.machine.sealed(seal, Status.OK))

        self._after_disk(persisted)

    def _on_get_digest(self, request: GetDigest, reply: ReplyFn) -> None:
        status = self.machine.digest_status(request)
        if status != Status.OK:
            reply(self.machine.digest_refused(request, status))
            return
        first = compose_lsn(request.epoch, Esn(max(request.from_esn, 1)))
        last = compose_lsn(request.epoch, ESN_MAX)
        found = sorted((lsn, record) for (log_id, lsn), record in self.disk.records.items()
                       if log_id == request.log_id and first <= lsn <= last)
        page = found[: request.records_max]
        entries = tuple((lsn_to_esn(lsn), r.flags, r.wave, r.timestamp_ms, None, r.payload, None)
                        for lsn, r in page)
        next_esn = (lsn_to_esn(page[-1][0]) + 1 if len(found) > len(page) else ESN_MAX + 1)
        reply(Digest(status=Status.OK, log_id=request.log_id, epoch=request.epoch,
                     entries=entries, next_esn=next_esn))

    def _on_clean(self, clean: Clean, reply: ReplyFn) -> None:
        answer = self.machine.clean_status(clean)
        if answer is not None:
            reply(answer)
            return
        if self.machine.seal(clean.log_id, clean.seal_epoch, clean.sealed_by) == Status.OK:
            self.disk.seals[clean.log_id] = (clean.seal_epoch, clean.sealed_by)
        held = sorted(lsn_to_esn(lsn) for (log_id, lsn) in self.disk.records
                      if log_id == clean.log_id and lsn_to_epoch(lsn) == clean.epoch)
        stores = recovery_hole_stores(clean, purge_ranges([(e, e) for e in held], clean), 0)
        refusals = [d.status for d in (self.machine.on_purge_store(s, disk_low=False)
                                       for s in stores) if d.status != Status.OK]
        if refusals:
            reply(self.machine.cleaned_after_purge(clean, refusals[0]))
            return
        accepted = stores

        def persisted() -> None:
            for store in accepted:
                self._write(store)
                self.machine.on_persisted(store)
            esn = self.machine.clean_mark(clean)
            if esn is not None:
                self._mark(clean.log_id, clean.epoch, esn)
            reply(self.machine.cleaned_after_purge(clean, Status.OK))

        self._after_disk(persisted)

    def _mark(self, log_id: LogId, epoch: Epoch, esn: int) -> None:
        """The epoch is settled here (``clean_mark``, ``drained_mark``): durably at once."""
        key = (log_id, epoch)
        self.disk.clean_marks[key] = max(self.disk.clean_marks.get(key, 0), esn)
        self.machine.on_clean_marked(log_id, epoch, esn)

    def _persist_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        self.disk.release_lsn[log_id] = release_lsn
        self._on_release(f"storage {self.node_id}", log_id, release_lsn)

    def release_lsn(self, log_id: LogId) -> Lsn:
        return self.machine.state(log_id).release_lsn
