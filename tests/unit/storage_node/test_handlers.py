"""The storage node's shared handlers (``storage_node.handlers``) against scripted ports: the
order in which they touch the durable store is what both the runtime and the simulation rely
on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest, Seal, Sealed
from shared.wire.store import Store
from storage_node.core.store_machine import StoreMachine
from storage_node.handlers import StorageHandlers
from storage_node.record_reads import CopiesResult
from storage_node.segment_format import SealEntry

LOG = LogId(1)
SEQ = NodeId("seq")


class ScriptedPorts:
    """Durable writes complete only when the test says so, in order."""

    def __init__(self) -> None:
        self.refusal: Status | None = None
        self.writes: list[tuple[object, Callable[[Status], None]]] = []
        self.held: list[tuple[Lsn, Lsn]] = []
        self.calls: list[str] = []
        self.read_status = Status.OK

    def not_serving(self) -> Status | None:
        return self.refusal

    @property
    def disk_low(self) -> bool:
        return False

    def submit_store(self, store: Store, done: Callable[[Status], None]) -> Status:
        self.calls.append(f"store {store.lsn}")
        self.writes.append((store, done))
        return Status.OK

    def submit_seal(self, seal: SealEntry, done: Callable[[Status], None]) -> Status:
        self.calls.append(f"seal {seal.epoch}")
        self.writes.append((seal, done))
        return Status.OK

    def submit_clean_mark(self, log_id: LogId, epoch: Epoch, esn: int,
                          done: Callable[[Status], None]) -> Status:
        self.calls.append(f"clean mark {epoch}")
        self.writes.append(((log_id, epoch, esn), done))
        return Status.OK

    def note_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        self.calls.append(f"release {release_lsn}")

    def durable_release_lsn(self, log_id: LogId) -> Lsn:
        return Lsn(2**63)

    def held_ranges(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn) -> list[tuple[Lsn, Lsn]]:
        self.calls.append("held")
        return [(lo, hi) for lo, hi in self.held if from_lsn <= lo <= until_lsn]

    def read_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                    bytes_max: int, done: Callable[[CopiesResult], None]) -> Status:
        if self.read_status is not Status.OK:
            return self.read_status
        done(CopiesResult(Status.OK, ((from_lsn, 5, None, b"x", 0, 1, None),),
                          Lsn(until_lsn + 1)))
        return Status.OK

    def complete_all(self) -> None:
        """Complete the writes queued so far (not those their completions queue)."""
        writes, self.writes = self.writes, []
        for _, done in writes:
            done(Status.OK)


def handlers() -> tuple[StorageHandlers, ScriptedPorts, list[Any]]:
    ports = ScriptedPorts()
    return StorageHandlers(StoreMachine(accept_writes=True), ports), ports, []


def test_clean_reads_what_to_purge_only_once_its_seal_is_durable() -> None:
    core, ports, replies = handlers()
    ports.held = [(compose_lsn(Epoch(1), Esn(2)), compose_lsn(Epoch(1), Esn(2)))]
    clean = Clean(log_id=LOG, epoch=Epoch(1), seal_epoch=Epoch(1), sealed_by=SEQ,
                  bridge_esn=Esn(2), holes=())
    core.on_clean(clean, replies.append)
    # A STORE accepted before the seal is queued ahead of it: the purge must see it.
    assert ports.calls == ["seal 1"] and not replies
    ports.complete_all()
    assert ports.calls[:2] == ["seal 1", "held"]
    assert [c for c in ports.calls if c.startswith("store")]  # the bridge over its copy
    assert not replies
    ports.complete_all()  # the bridge, then the epoch's clean mark
    ports.complete_all()
    assert [type(r) for r in replies] == [Cleaned] and replies[0].status is Status.OK


def test_seal_answers_after_it_is_durable_and_refuses_when_not_serving() -> None:
    core, ports, replies = handlers()
    seal = Seal(log_id=LOG, seal_epoch=Epoch(2), sealed_by=SEQ, from_epoch=Epoch(1))
    core.on_seal(seal, replies.append)
    assert not replies
    ports.complete_all()
    assert type(replies[0]) is Sealed and replies[0].status is Status.OK
    ports.refusal = Status.NOTREADY
    core.on_seal(seal, replies.append)
    assert replies[1].status is Status.NOTREADY


def test_digest_refused_when_the_store_cannot_read_now() -> None:
    core, ports, replies = handlers()
    request = GetDigest(log_id=LOG, epoch=Epoch(1), from_esn=Esn(1), seal_epoch=Epoch(2),
                        records_max=10, bytes_max=1 << 20)
    core.on_get_digest(request, replies.append)
    assert type(replies[0]) is Digest and replies[0].status is Status.OK
    assert [e[0] for e in replies[0].entries] == [1]
    ports.read_status = Status.OVERLOADED
    core.on_get_digest(request, replies.append)
    assert replies[1].status is Status.OVERLOADED and not replies[1].entries
    assert core.counts["digests"] == 1
