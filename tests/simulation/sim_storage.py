"""A simulated storage node: the real ``StoreMachine`` plus an in-memory disk.

The disk (records with their flags, release pointers and durable seals) survives crashes; with
``fsync=always`` semantics a record is on it before STORED goes out. STORE, RELEASE,
GET_LOG_STATE and epoch recovery's messages (SEAL, GET_DIGEST, CLEAN and its purge) are served
by the same ``storage_node.handlers.StorageHandlers`` as ``storage_node.runtime`` serves them
with; this node is its ``StoragePorts``. Writing takes up to ``disk_delay_ms``, in submission
order: a crash in between loses the write and its reply. A crash loses everything only in
memory (the machine, hence the soft seals); a restart rebuilds the machine with ``restore``
from the disk, the way ``storage_node.record_store`` does (the newest record's epoch
re-creates its soft seal).

A damaged disk, as a restart's scan finds it (``damage_disk``: a random part of the records
is gone; ``restart(lose_entries=N)``: the last N durable writes are gone, as with a corrupt
or torn segment tail): the node knows it, its authoritative status
(``storage_node.core.authority``, kept with the disk) then marks every log, and its SEALED
and DIGEST answers say so, as the real node's do. (Release pointers are kept.)
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from shared.status import Status
from shared.types import (
    Epoch,
    LogId,
    Lsn,
    NodeId,
    lsn_to_epoch,
    lsn_to_esn,
)
from shared.wire.read import GetLogState
from shared.wire.rebuild import RebuildStore
from shared.wire.recovery import Clean, GetDigest, Seal
from shared.wire.release import Release
from shared.wire.store import RecordFlags, Store
from shared.wire.store_batch import ReleaseBatch, StoreBatch
from storage_node.core.authority import AuthorityStatus, annotated_reply
from storage_node.core.inflight_stores import InflightStores
from storage_node.core.rebuild_scope import Scope, segment_scope
from storage_node.core.store_machine import LogStorageState, StoreMachine
from storage_node.handlers import StorageHandlers
from storage_node.record_reads import CopiesResult
from storage_node.segment_format import SealEntry
from tests.simulation.sim_client import store_payloads
from tests.simulation.sim_clock import EventQueue
from tests.simulation.sim_network import ReplyFn, SimNetwork
from tests.simulation.sim_trace import Trace

DiskWriteHook = Callable[[NodeId, LogId, Lsn, "DiskRecord", "DiskRecord | None"], None]
"""(node, log, lsn, copy written, copy it replaced or None)."""
DamageHook = Callable[[NodeId, "dict[tuple[LogId, Lsn], DiskRecord]",
                       "dict[tuple[LogId, Lsn], DiskRecord]", bool], None]
"""(node, records before, records after, to be repaired) of a damaged restart."""
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


RecordWrite = tuple[tuple[LogId, Lsn], DiskRecord]
SealWrite = tuple[LogId, tuple[Epoch, NodeId]]
MarkWrite = tuple[tuple[LogId, Epoch], int]


@dataclass(slots=True)
class Disk:
    records: dict[tuple[LogId, Lsn], DiskRecord]
    release_lsn: dict[LogId, Lsn]
    seals: dict[LogId, tuple[Epoch, NodeId]] = field(default_factory=dict)
    clean_marks: dict[tuple[LogId, Epoch], int] = field(default_factory=dict)
    """Epochs a CLEAN or a drained release settled here, up to which ESN
    (``LogStorageState.settled``)."""
    authority: AuthorityStatus = field(default_factory=AuthorityStatus)
    """What the node can vouch for (lost copies found by a restart's scan)."""
    journal: list[RecordWrite | SealWrite | MarkWrite] = field(default_factory=list)
    """Every record, seal and settled-mark write, in order (what the segment files hold): a
    damaged restart loses a suffix of it (a mark written after a purge goes with it)."""

    def lose_suffix(self, entries_count: int) -> None:
        """Forget the last ``entries_count`` writes, as a corrupt or torn segment tail does:
        what they overwrote is what the node holds again. Release pointers are kept."""
        del self.journal[max(len(self.journal) - entries_count, 0):]
        self.records, self.seals, self.clean_marks = {}, {}, {}
        for key, value in self.journal:
            if isinstance(value, DiskRecord):
                self.records[key] = value  # type: ignore[index]
            elif isinstance(value, int):
                mark_key: tuple[LogId, Epoch] = key  # type: ignore[assignment]
                self.clean_marks[mark_key] = max(self.clean_marks.get(mark_key, 0), value)
            else:
                self.seals[key] = value  # type: ignore[index]


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
        on_damage: DamageHook | None = None,
    ) -> None:
        self.node_id = node_id
        self._network = network
        self._queue = queue
        self._rng = rng
        self._disk_delay_ms_max = disk_delay_ms_max
        self._trace = trace
        self._on_disk_write = on_disk_write
        self._on_release = on_release
        self._on_damage = on_damage
        self.disk = Disk(records={}, release_lsn={})
        self.machine = StoreMachine(accept_writes=True)
        self._counts: Counter[str] = Counter()
        self.handlers = StorageHandlers(self.machine, self, self._counts)
        self._disk_free_ms = 0
        """When the last submitted disk write completes (writes complete in order)."""
        self.up = True
        self.incarnation = 0
        self.generation = 1
        """The disk's generation (``disk_identity``): a replaced disk has the next one."""
        self.rebuild_handler: Callable[[RebuildStore, ReplyFn], None] | None = None
        """REBUILD_STORE's handler (``sim_rebuild``: ``RebuildRuntime.on_rebuild_store``)."""
        self.pending_stores: list[Store] = []
        """STOREs submitted and not yet on the disk (the record store's writer queue)."""
        network.add_node(node_id, self.on_message)

    # ---- lifecycle ----------------------------------------------------------------------

    def crash(self) -> None:
        assert self.up, self.node_id
        self.up = False
        self.incarnation += 1
        self.handlers.inflight = InflightStores()  # the writes in flight are lost, and replies
        self.pending_stores = []
        self._network.crash(self.node_id)
        self._trace.log(self._queue.clock.now_ms(), f"storage {self.node_id} CRASH")

    def restart(self, *, lose_entries: int = 0, repair: bool = False) -> None:
        """Come back with what the disk holds; ``lose_entries`` > 0: damaged, without the
        last that many durable writes. ``repair``: the damage's scope is known (as a
        damaged segment's index file knows it: per log, from the first to the last LSN of
        the copies lost), and a mini-rebuild repairs it (``sim_rebuild``); else it is
        unranged, and never repaired."""
        assert not self.up, self.node_id
        if lose_entries:
            before = dict(self.disk.records)
            lost = self.disk.journal[max(len(self.disk.journal) - lose_entries, 0):]
            self.disk.lose_suffix(lose_entries)
            scope: Scope = None
            if repair:
                runs: dict[int, list[tuple[int, int]]] = {}
                for key, value in lost:
                    if isinstance(value, DiskRecord):
                        log_id, lsn = key  # type: ignore[misc]
                        runs.setdefault(int(log_id), []).append((int(lsn), int(lsn)))
                scope = segment_scope(runs)
            self.disk.authority.segments_damaged(frozenset({self.incarnation}), scope)
            self._trace.log(self._queue.clock.now_ms(),
                            f"storage {self.node_id} DAMAGED: lost its last {lose_entries} "
                            f"writes{f', scope {scope}' if repair else ''}")
            if self._on_damage is not None:
                self._on_damage(self.node_id, before, self.disk.records, repair)
        self.machine = StoreMachine(accept_writes=True)
        for log_id, state in self._recovered_states().items():
            self.machine.restore(log_id, state)
        self.handlers = StorageHandlers(self.machine, self, self._counts)
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
        gone = set(lost)
        self.disk.journal = [w for w in self.disk.journal if w[0] not in gone]
        self.disk.authority.segments_damaged(frozenset({self.incarnation}))
        self._trace.log(self._queue.clock.now_ms(),
                        f"storage {self.node_id} DISK DAMAGED ({len(lost)} copies lost)")
        return lost

    def replace_disk(self) -> dict[tuple[LogId, Lsn], DiskRecord]:
        """While down: a new, empty disk of the next generation (records, release pointers,
        seals and settled marks gone); the node vouches for nothing on it until it is
        rebuilt (``sim_rebuild``). Returns the records the old disk held."""
        assert not self.up, self.node_id
        before = self.disk.records
        self.disk = Disk(records={}, release_lsn={})
        self.disk.authority.unsure_of_everything()
        self.generation += 1
        self._trace.log(self._queue.clock.now_ms(),
                        f"storage {self.node_id} DISK REPLACED ({len(before)} copies lost), "
                        f"generation {self.generation}")
        return before

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
        settled: dict[LogId, dict[Epoch, int]] = {}
        for (log_id, epoch), esn in self.disk.clean_marks.items():
            settled.setdefault(log_id, {})[epoch] = esn
        for log_id, epoch_tails in tails.items():
            states[log_id] = replace(states.get(log_id, LogStorageState()),
                                     epoch_tails=epoch_tails)
        for log_id, marks in settled.items():
            states[log_id] = replace(states.get(log_id, LogStorageState()), settled=marks)
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
        kind = type(message)
        if kind is Release:
            self.handlers.on_release(message)
            return
        if kind is ReleaseBatch:
            self.handlers.on_release_batch(message)
            return
        assert reply is not None, message
        if kind is Store:
            self.handlers.on_store(message, reply)
        elif kind is StoreBatch:
            self.handlers.on_store_batch(message, reply)
        elif kind is GetLogState:
            self.handlers.on_get_log_state(message, reply)
        elif kind is Seal:
            self.handlers.on_seal(message, reply)
        elif kind is GetDigest:
            self.handlers.on_get_digest(message, reply)
        elif kind is Clean:
            self.handlers.on_clean(message, reply)
        elif kind is RebuildStore and self.rebuild_handler is not None:
            self.rebuild_handler(message, reply)
        else:
            raise AssertionError(f"storage node got unexpected {message!r}")

    # ---- ports of the shared handlers (``storage_node.handlers.StoragePorts``) -------------

    def not_serving(self) -> Status | None:
        return None  # the network delivers nothing to a node that is down

    @property
    def disk_low(self) -> bool:
        return False

    def submit_store(self, store: Store, done: Callable[[Status], None]) -> Status:
        pending = self.pending_stores
        pending.append(store)

        def write() -> None:
            pending.remove(store)
            self._write(store)
            done(Status.OK)

        self._after_disk(write)
        return Status.OK

    def submit_seal(self, seal: SealEntry, done: Callable[[Status], None]) -> Status:
        def write() -> None:
            current = self.disk.seals.get(seal.log_id)
            if current is None or current[0] < seal.epoch:
                value = (seal.epoch, seal.sealed_by)
                self.disk.seals[seal.log_id] = value
                self.disk.journal.append((seal.log_id, value))
            done(Status.OK)

        self._after_disk(write)
        return Status.OK

    def submit_clean_mark(self, log_id: LogId, epoch: Epoch, esn: int,
                          done: Callable[[Status], None]) -> Status:
        def write() -> None:
            key = (log_id, epoch)
            self.disk.clean_marks[key] = max(self.disk.clean_marks.get(key, 0), esn)
            self.disk.journal.append((key, esn))
            done(Status.OK)

        self._after_disk(write)
        return Status.OK

    def note_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        self.disk.release_lsn[log_id] = release_lsn
        self._on_release(f"storage {self.node_id}", log_id, release_lsn)

    def durable_release_lsn(self, log_id: LogId) -> Lsn:
        return self.disk.release_lsn.get(log_id, Lsn(0))

    def held_ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        return [(lsn, lsn) for lsn in sorted(
            lsn for (log, lsn) in self.disk.records if log == log_id
            and from_lsn <= lsn <= until_lsn)]

    def read_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                    bytes_max: int, done: Callable[[CopiesResult], None]) -> Status:
        found = sorted((lsn, record) for (log, lsn), record in self.disk.records.items()
                       if log == log_id and from_lsn <= lsn <= until_lsn)
        page = found[:records_max]
        next_lsn = Lsn(page[-1][0] + 1 if len(found) > len(page) else until_lsn + 1)
        done(CopiesResult(Status.OK, tuple(
            (lsn, r.timestamp_ms, None, r.payload, r.flags, r.wave, None) for lsn, r in page),
            next_lsn))
        return Status.OK

    # ---- the in-memory disk -----------------------------------------------------------

    def _write(self, store: Store) -> None:
        for index, payload in enumerate(store_payloads(store)):
            key = (store.log_id, Lsn(store.lsn + index))
            previous = self.disk.records.get(key)
            record = DiskRecord(payload, store.sequencer_node, store.flags, store.wave,
                                store.last_known_good, store.timestamp_ms)
            self.disk.records[key] = record
            self.disk.journal.append((key, record))
            self._on_disk_write(self.node_id, key[0], key[1], record, previous)

    def after_disk(self, action: Callable[[], None]) -> None:
        """``action`` after a disk access (a rebuild donor's read), in order with the
        writes; dropped if the node crashes first."""
        self._after_disk(action)

    def _after_disk(self, action: Callable[[], None]) -> None:
        """Run ``action`` once a disk write of up to ``disk_delay_ms`` is done, unless we
        crashed first. Writes complete in the order they were submitted, as the record
        store's writer does (CLEAN's purge relies on it)."""
        incarnation = self.incarnation

        def done() -> None:
            if self.incarnation == incarnation:
                action()

        now_ms = self._queue.clock.now_ms()
        at_ms = max(now_ms + self._rng.randint(0, self._disk_delay_ms_max), self._disk_free_ms)
        self._disk_free_ms = at_ms
        self._queue.at(at_ms, done)

    def release_lsn(self, log_id: LogId) -> Lsn:
        return self.machine.state(log_id).release_lsn

    @property
    def stores_joined_count(self) -> int:
        """STOREs answered with a copy's write already under way (``InflightStores``)."""
        return self.handlers.counts["stores_joined"]
