"""A simulated storage node: the real ``StoreMachine`` plus an in-memory disk.

The disk (records and release pointers) survives crashes; with ``fsync=always`` semantics a
record is on it before STORED goes out. Writing takes ``disk_delay_ms``: a crash in between
loses the write and its reply. A crash loses everything only in memory (the machine, hence the
soft seals); a restart rebuilds the machine with ``restore`` from the disk, the way
``storage_node.record_store`` does (the newest record's epoch re-creates its soft seal).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId, lsn_to_epoch
from shared.wire.read import GetLogState
from shared.wire.release import Release
from shared.wire.store import Store
from storage_node.core.store_machine import LogStorageState, StoreMachine
from tests.simulation.sim_clock import EventQueue
from tests.simulation.sim_network import ReplyFn, SimNetwork
from tests.simulation.sim_trace import Trace

DiskWriteHook = Callable[[NodeId, LogId, Lsn, bytes, "bytes | None"], None]
"""(node, log, lsn, payload written, payload it replaced or None)."""
ReleaseHook = Callable[[str, LogId, Lsn], None]


@dataclass(frozen=True, slots=True)
class DiskRecord:
    payload: bytes
    sequencer_node: NodeId


@dataclass(slots=True)
class Disk:
    records: dict[tuple[LogId, Lsn], DiskRecord]
    release_lsn: dict[LogId, Lsn]


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
        self.up = True
        self.incarnation = 0
        network.add_node(node_id, self.on_message)

    # ---- lifecycle ----------------------------------------------------------------------

    def crash(self) -> None:
        assert self.up, self.node_id
        self.up = False
        self.incarnation += 1
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

    def _recovered_states(self) -> dict[LogId, LogStorageState]:
        states: dict[LogId, LogStorageState] = {}
        newest: dict[LogId, NodeId] = {}
        for (log_id, lsn), record in self.disk.records.items():
            state = states.get(log_id, LogStorageState())
            if lsn > state.last_lsn:
                states[log_id] = replace(state, last_lsn=lsn)
                newest[log_id] = record.sequencer_node
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
        if type(message) is Store:
            assert reply is not None
            self._on_store(message, reply)
        elif type(message) is Release:
            released = self.machine.on_release(message)
            if released is not None:
                self._persist_release(message.log_id, released)
        elif type(message) is GetLogState:
            assert reply is not None
            reply(self.machine.on_get_log_state(message))
        else:
            raise AssertionError(f"storage node got unexpected {message!r}")

    def _on_store(self, store: Store, reply: ReplyFn) -> None:
        decision = self.machine.on_store(store, disk_low=False)
        if decision.release_lsn is not None:
            self._persist_release(store.log_id, decision.release_lsn)
        if decision.status != Status.OK:
            assert decision.reply is not None
            reply(decision.reply)
            return
        incarnation = self.incarnation

        def persisted() -> None:
            if self.incarnation != incarnation:
                return  # crashed before the write was durable: no record, no reply
            for index, payload in enumerate(store.payloads):
                key = (store.log_id, Lsn(store.lsn + index))
                previous = self.disk.records.get(key)
                self.disk.records[key] = DiskRecord(payload, store.sequencer_node)
                self._on_disk_write(self.node_id, key[0], key[1], payload,
                                    None if previous is None else previous.payload)
            reply(self.machine.on_persisted(store))

        self._queue.after(self._rng.randint(0, self._disk_delay_ms_max), persisted)

    def _persist_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        self.disk.release_lsn[log_id] = release_lsn
        self._on_release(f"storage {self.node_id}", log_id, release_lsn)

    def release_lsn(self, log_id: LogId) -> Lsn:
        return self.machine.state(log_id).release_lsn
