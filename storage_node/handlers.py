"""The storage node's write-side and recovery glue, sans I/O: STORE, RELEASE, GET_LOG_STATE,
SEAL, GET_DIGEST and CLEAN (with its purge) handled between the pure ``StoreMachine`` and a
durable store behind ``StoragePorts``.

``storage_node.runtime.StorageNode`` (asyncio, the segment-file ``RecordStore``) and the
deterministic simulation (``tests/simulation/sim_storage.py``, an in-memory disk) both serve
these messages with this one ``StorageHandlers``, so that the simulation runs the code
production runs. The ports' durable writes must complete in submission order (the record
store's writer is FIFO): CLEAN relies on it (see ``on_clean``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from shared.status import Status
from shared.types import (
    EPOCH_INVALID,
    ESN_MAX,
    LSN_INVALID,
    Epoch,
    Esn,
    LogId,
    Lsn,
    compose_lsn,
    lsn_to_epoch,
    lsn_to_esn,
)
from shared.wire.read import GetLogState, LogState
from shared.wire.recovery import Clean, Digest, GetDigest, Seal
from shared.wire.release import Release
from shared.wire.store import Store
from shared.wire.store_batch import ReleaseBatch, StoreBatch, release_batch_pairs
from storage_node.core.inflight_stores import InflightStores
from storage_node.core.store_batch import StoredBatchAnswers
from storage_node.core.store_machine import (
    StoreMachine,
    purge_ranges,
    recovery_hole_stores,
    stored_reply,
)
from storage_node.record_reads import CopiesResult
from storage_node.segment_format import SealEntry

ReplyFn = Callable[[Any], None]
DoneFn = Callable[[Status], None]


class StoragePorts(Protocol):
    """What the handlers need from the node: its state and its durable store."""

    def not_serving(self) -> Status | None:
        """NOTREADY before start, SHUTDOWN once closing, else None."""
        ...

    @property
    def disk_low(self) -> bool: ...

    def submit_store(self, store: Store, done: DoneFn) -> Status:
        """Queue a durable write (``RecordStore.submit_store``): OK when queued (``done``
        follows once durable or failed), else the refusal and ``done`` never comes."""
        ...

    def submit_seal(self, seal: SealEntry, done: DoneFn) -> Status:
        """Queue a durable seal; same contract as ``submit_store``, same FIFO queue."""
        ...

    def submit_clean_mark(self, log_id: LogId, epoch: Epoch, esn: int,
                          done: DoneFn) -> Status:
        """Queue a durable mark that ``epoch`` is settled here up to ``esn``
        (``LogStorageState.settled``, never its last-known-good ESN); same contract as
        ``submit_store``, same FIFO queue."""
        ...

    def note_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        """The node's release pointer of ``log_id`` moved: persist it, wake readers."""
        ...

    def durable_release_lsn(self, log_id: LogId) -> Lsn:
        """The release pointer of ``log_id`` as last written (fsynced)."""
        ...

    def held_ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        """The LSN ranges the node holds copies of (what is durable and indexed)."""
        ...

    def read_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                    bytes_max: int, done: Callable[[CopiesResult], None]) -> Status:
        """Start reading copies with their flags and waves (``RecordStore.read_copies``):
        OK when started (``done`` follows, with INTERNAL on an I/O error), else the refusal
        (OVERLOADED) and ``done`` never comes."""
        ...


class StorageHandlers:
    """Serves one node's write-side and recovery messages."""

    def __init__(self, machine: StoreMachine, ports: StoragePorts,
                 counts: collections.Counter[str] | None = None) -> None:
        self.machine = machine
        self.ports = ports
        self.counts: collections.Counter[str] = (
            counts if counts is not None else collections.Counter())
        """What happened how often (``storage_node.runtime.COUNTERS``)."""
        self.inflight: InflightStores[ReplyFn] = InflightStores()
        """STOREs queued and not yet durable: a copy arriving again waits for their write."""

    # ---- writes ----

    def on_store(self, store: Store, reply: ReplyFn) -> None:
        counts = self.counts
        counts["store_messages"] += 1
        ports = self.ports
        refused = ports.not_serving()
        if refused is not None:
            self._reply_store(reply, store, refused)
            return
        machine = self.machine
        decision = machine.on_store(store, disk_low=ports.disk_low)
        if decision.release_lsn is not None:
            ports.note_release(store.log_id, decision.release_lsn)
        if decision.reply is not None:
            counts[f"stored_{decision.status.name.lower()}"] += 1
            reply(decision.reply)
            return
        inflight = self.inflight
        if inflight.join(store, reply):
            counts["stores_joined"] += 1  # answered with the write already queued
            return

        def persisted(status: Status) -> None:
            joined = inflight.finish(store)
            if status != Status.OK:
                self._reply_store(reply, store, status)
            else:
                counts["stored_ok"] += 1
                reply(machine.on_persisted(store))
            for other, other_reply in joined:
                self._reply_store(other_reply, other, status)

        status = ports.submit_store(store, persisted)
        if status != Status.OK:
            self._reply_store(reply, store, status)
        else:
            inflight.begin(store)

    def on_store_batch(self, batch: StoreBatch, reply: ReplyFn) -> None:
        """The STOREs of many logs in one frame: each handled as if it came alone (its own
        checks, seals and answer), all written in this iteration's group commit, and answered
        together in one STORED_BATCH once the last is settled."""
        counts = self.counts
        counts["store_batches"] += 1
        stores = batch.stores
        answers = StoredBatchAnswers(len(stores), reply)
        ports = self.ports
        if ports.not_serving() is not None:
            for index, store in enumerate(stores):
                self.on_store(store, answers.slot(index))
            return
        # What on_store does for each STORE, with the per-frame lookups made once and an
        # answer that is a status (no Stored, no reply function per STORE written).
        counts["store_messages"] += len(stores)
        machine = self.machine
        inflight = self.inflight
        disk_low = ports.disk_low
        submit_store = ports.submit_store
        note_release = ports.note_release
        persisted = self._batch_persisted
        for index, store in enumerate(stores):
            decision = machine.on_store(store, disk_low=disk_low)
            if decision.release_lsn is not None:
                note_release(store.log_id, decision.release_lsn)
            if decision.reply is not None:
                counts[f"stored_{decision.status.name.lower()}"] += 1
                answers.put(index, decision.reply)
                continue
            if inflight.writing(store) and inflight.join(store, answers.slot(index)):
                counts["stores_joined"] += 1
                continue
            status = submit_store(store, persisted(store, answers, index))
            if status != Status.OK:
                self._reply_store(answers.slot(index), store, status)
            else:
                inflight.begin(store)

    def _batch_persisted(self, store: Store, answers: StoredBatchAnswers,
                         index: int) -> Callable[[Status], None]:
        """The ``done`` of a STORE of a batch: ``on_store``'s ``persisted``, answering with
        its status."""
        def persisted(status: Status) -> None:
            joined = self.inflight.finish(store)
            if status != Status.OK:
                self._reply_store(answers.slot(index), store, status)
            else:
                self.counts["stored_ok"] += 1
                self.machine.note_persisted(store)
                answers.put_ok(index)
            for other, other_reply in joined:
                self._reply_store(other_reply, other, status)

        return persisted

    def _reply_store(self, reply: ReplyFn, store: Store, status: Status) -> None:
        self.counts[f"stored_{status.name.lower()}"] += 1
        reply(stored_reply(store, status))

    def on_release(self, release: Release, reply: ReplyFn | None = None) -> None:
        """One-way: ``reply`` is never called."""
        self.counts["release_messages"] += 1
        if self.ports.not_serving() is not None:
            return
        release_lsn = self.machine.on_release(release)
        if release_lsn is not None:
            self.ports.note_release(release.log_id, release_lsn)
        if release.drained_epoch:
            self._settle_drained(release)

    def _settle_drained(self, release: Release) -> None:
        """The last RELEASE of a drained epoch settles it here (``drained_mark``)."""
        machine = self.machine
        esn = machine.drained_mark(release)
        if esn is None:
            return

        def marked(status: Status) -> None:
            if status is Status.OK:
                machine.on_clean_marked(release.log_id, release.drained_epoch, esn)

        # Not retried if refused: the epoch is then purged (with nothing to plug) later.
        self.ports.submit_clean_mark(release.log_id, release.drained_epoch, esn, marked)

    def on_release_batch(self, batch: ReleaseBatch, reply: ReplyFn | None = None) -> None:
        """The release pointers of many logs: each as a RELEASE of its own (a batch never
        carries a drained epoch), with the per-frame checks made once."""
        releases = release_batch_pairs(batch)
        self.counts["release_messages"] += len(releases)
        if self.ports.not_serving() is not None:
            return
        on_release = self.machine.on_release_pointer
        note_release = self.ports.note_release
        for log_id, release_lsn in releases:
            if on_release(log_id, release_lsn) is not None:
                note_release(log_id, release_lsn)

    def on_get_log_state(self, message: GetLogState, reply: ReplyFn) -> None:
        status = self.ports.not_serving()
        if status is not None:
            reply(LogState(status=status, log_id=message.log_id, release_lsn=LSN_INVALID,
                           sealed_epoch=EPOCH_INVALID, last_lsn=LSN_INVALID))
            return
        state = self.machine.on_get_log_state(message)
        if state.status is Status.OK:
            # Only a written (fsynced) pointer is reported: tails and new sequencers take it as
            # a high-water mark, which a crash must not lower (record_store.note_release).
            state = dataclasses.replace(state, release_lsn=Lsn(min(
                state.release_lsn, self.ports.durable_release_lsn(message.log_id))))
        reply(state)

    # ---- epoch recovery ----

    def on_seal(self, seal: Seal, reply: ReplyFn) -> None:
        machine = self.machine
        refused = self.ports.not_serving()
        if refused is not None:
            reply(machine.sealed(seal, refused))
            return
        answer = machine.on_seal(seal)
        if answer is not None:
            reply(answer)
            return

        def persisted(status: Status) -> None:
            # Tails are taken once the seal is durable: no STORE of a sealed epoch can be
            # accepted after that, so they cannot grow any more.
            reply(machine.sealed(seal, status))

        status = self.ports.submit_seal(
            SealEntry(seal.log_id, seal.seal_epoch, seal.sealed_by), persisted)
        if status != Status.OK:
            reply(machine.sealed(seal, status))
        else:
            self.counts["seals"] += 1

    def on_get_digest(self, request: GetDigest, reply: ReplyFn) -> None:
        machine = self.machine
        status = self.ports.not_serving() or machine.digest_status(request)
        if status is Status.OK:
            def done(result: CopiesResult) -> None:
                reply(digest_reply(machine, request, result))

            status = self.ports.read_copies(
                request.log_id, compose_lsn(request.epoch, Esn(max(request.from_esn, 1))),
                compose_lsn(request.epoch, ESN_MAX), request.records_max, request.bytes_max,
                done)
            if status is Status.OK:
                self.counts["digests"] += 1
                return
        reply(machine.digest_refused(request, status))

    def on_clean(self, clean: Clean, reply: ReplyFn) -> None:
        machine = self.machine
        refused = self.ports.not_serving()
        answer = (machine.cleaned(clean, refused) if refused is not None
                  else machine.clean_status(clean))
        if answer is not None:
            reply(answer)
            return
        self.counts["cleans"] += 1
        # Seal first (a node that missed the SEAL gets it now, so that no STORE of the
        # recovered epochs is accepted any more), and decide what to purge only once that seal
        # is written: the writer is FIFO, so every STORE accepted before it is on disk and in
        # the index by then, and none of them can slip past the purge. A node sealed higher
        # already writes its own seal again, as the barrier (the purge still applies: see
        # ``StoreMachine.clean_status``).
        machine.seal(clean.log_id, clean.seal_epoch, clean.sealed_by)
        state = machine.state(clean.log_id)

        def sealed(status: Status) -> None:
            if status is not Status.OK:
                reply(machine.cleaned(clean, status))
            else:
                self._purge(clean, reply)

        status = self.ports.submit_seal(
            SealEntry(clean.log_id, state.sealed_epoch, state.sealed_by or clean.sealed_by),
            sealed)
        if status is not Status.OK:
            reply(machine.cleaned(clean, status))

    def _purge(self, clean: Clean, reply: ReplyFn) -> None:
        """Overwrite the copies this node holds where recovery decided "no record", then
        answer the CLEAN."""
        machine, ports = self.machine, self.ports
        held = [(lsn_to_esn(lo), lsn_to_esn(hi)) for lo, hi in ports.held_ranges(
            clean.log_id, compose_lsn(clean.epoch, Esn(1)), compose_lsn(clean.epoch, ESN_MAX))]
        # What the purge covers: a copy that arrives after this was not purged.
        purged_last_esn = machine.epoch_last_esn(clean.log_id, clean.epoch)
        stores = recovery_hole_stores(clean, purge_ranges(held, clean), 0)
        if not stores:
            self._mark_clean(clean, Status.OK, purged_last_esn, reply)
            return
        pending = [len(stores)]
        failed: list[Status] = []

        def persisted(status: Status) -> None:
            if status is not Status.OK:
                failed.append(status)
            pending[0] -= 1
            if pending[0] == 0:
                self._mark_clean(clean, failed[0] if failed else Status.OK, purged_last_esn,
                                 reply)

        for store in stores:
            decision = machine.on_purge_store(store, disk_low=ports.disk_low)
            if decision.status is not Status.OK:
                persisted(decision.status)
                continue
            self.counts["purged_records"] += store.records_count

            def done(status: Status, store: Store = store) -> None:
                if status is Status.OK:
                    machine.on_persisted(store)
                persisted(status)

            status = ports.submit_store(store, done)
            if status is not Status.OK:
                persisted(status)

    def _mark_clean(self, clean: Clean, status: Status, purged_last_esn: int,
                    reply: ReplyFn) -> None:
        """Once the purge is written: mark the epoch settled here (``clean_mark``), then
        answer the CLEAN."""
        machine = self.machine
        esn = machine.clean_mark(clean, purged_last_esn) if status is Status.OK else None
        if esn is None:
            reply(machine.cleaned_after_purge(clean, status))
            return

        def marked(result: Status) -> None:
            if result is Status.OK:
                machine.on_clean_marked(clean.log_id, clean.epoch, esn)
            reply(machine.cleaned_after_purge(clean, result))

        submitted = self.ports.submit_clean_mark(clean.log_id, clean.epoch, esn, marked)
        if submitted is not Status.OK:
            reply(machine.cleaned_after_purge(clean, submitted))


def digest_reply(machine: StoreMachine, request: GetDigest, result: CopiesResult) -> Digest:
    """The DIGEST answering ``request`` from the copies read for it."""
    if result.status is not Status.OK:
        return machine.digest_refused(request, result.status)
    next_esn = (lsn_to_esn(result.next_lsn) if lsn_to_epoch(result.next_lsn) == request.epoch
                else ESN_MAX + 1)
    entries = tuple((lsn_to_esn(Lsn(lsn)), flags, wave, timestamp_ms, key, payload, producer)
                    for lsn, timestamp_ms, key, payload, flags, wave, producer
                    in result.copies)
    return Digest(status=Status.OK, log_id=request.log_id, epoch=request.epoch,
                  entries=entries, next_esn=next_esn)
