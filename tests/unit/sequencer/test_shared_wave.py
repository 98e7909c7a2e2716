"""Shared first waves (``sequencer.core.shared_wave`` through ``EffectDriver.append_groups``):
appenders of different logs started at one moment send their first wave to one copyset, in
the same STORE_BATCHes, with one timer; each append keeps its own LSNs and answer; an answer
other than OK or the timeout hands every appender back to its log's own rules."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from sequencer.core.effects import ActivateEpoch, AppendReply
from sequencer.core.sequencer import PendingAppend, Sequencer, SequencerState
from sequencer.handlers import EffectDriver
from shared.config import SequencerConfig
from shared.epoch_metadata import LastCleanEpoch
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.store_batch import StoreBatch, StoredBatch
from tests.unit.sequencer.helpers import metadata, stores
from tests.unit.sequencer.test_handlers import RecordingPorts, stored_ok


class Ports(RecordingPorts):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[NodeId, StoreBatch, Callable[[Any], None]]] = []
        self.now = 0

    def now_ms(self) -> int:
        return self.now

    def send_store_batch(self, node: NodeId, batch: Any, callback: Callable[[Any], None]) -> None:
        self.batches.append((node, batch, callback))


def active(log_id: int, replication: int = 2) -> Sequencer:
    sequencer = Sequencer(log_id=LogId(log_id), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(log_id))
    assert sequencer.on_append(1, (b"first",), None, 0, 0) == [ActivateEpoch(LogId(log_id))]
    lce = LastCleanEpoch(log_id=LogId(log_id), epoch=Epoch(0), tail_lsn=Lsn(0), version=0)
    sends = sequencer.on_activated(Status.OK, Epoch(1), metadata(replication), lce, 0)
    for send in stores(sends):
        sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0), None, 0)
    while (due := sequencer.deadline_ms()) is not None:
        sequencer.on_timer(due)
    return sequencer


def setup(logs: int = 3) -> tuple[Ports, EffectDriver, list[Sequencer],
                                   list[tuple[int, Callable[[], None]]]]:
    ports = Ports()
    timers: list[tuple[int, Callable[[], None]]] = []
    driver = EffectDriver(ports, store_batch_stores_max=64,
                          arm_timer=lambda due, fn: timers.append((due, fn)))
    return ports, driver, [active(10 + i) for i in range(logs)], timers


def start(ports: Ports, driver: EffectDriver, sequencers: list[Sequencer]) -> None:
    driver.flushing = True
    driver.append_groups([(s, [PendingAppend(100 + i, (b"p%d" % i,), None, 5)])
                          for i, s in enumerate(sequencers)], ports.now)
    driver.flushing = False
    driver.flush()


def test_one_copyset_one_timer_and_each_append_its_own_lsn() -> None:
    ports, driver, sequencers, timers = setup()
    start(ports, driver, sequencers)
    assert len(timers) == 1  # one store timer for the three appenders
    copyset = {node for node, _, _ in ports.batches}
    assert len(copyset) == 2 and len(ports.batches) == 2  # one STORE_BATCH per node
    for _, batch, _ in ports.batches:
        assert sorted(s.log_id for s in batch.stores) == [10, 11, 12]
        assert all(set(s.copyset) == copyset and s.wave == 1 for s in batch.stores)
    assert all(s.deadline_ms() is None for s in sequencers)  # no per-log timers
    _, batch, callback = ports.batches[0]
    callback(StoredBatch(statuses=(0,) * len(batch.stores)))
    assert not ports.answers  # the other node has not answered yet
    ports.batches[1][2](StoredBatch(statuses=(0,) * 3))
    assert sorted((a.request_id, a.status, a.first_lsn) for a in ports.answers) == [
        (100 + i, Status.OK, (1 << 32) + 2) for i in range(3)]
    assert all(not s.appenders and s.release_lsn == (1 << 32) + 2 for s in sequencers)


def test_an_answer_other_than_ok_hands_every_appender_back_to_its_log() -> None:
    ports, driver, sequencers, timers = setup()
    start(ports, driver, sequencers)
    (n1, _, done1), (n2, batch2, done2) = ports.batches
    done1(StoredBatch(statuses=(0,) * 3))
    # The second node refuses log 11's STORE: that append goes on alone (a new wave to
    # another node, keeping n1's copy); the others complete with n2's OK answers.
    index = [s.log_id for s in batch2.stores].index(LogId(11))
    statuses = [0, 0, 0]
    statuses[index] = int(Status.NOSPC)
    done2(StoredBatch(statuses=tuple(statuses)))
    assert sorted(a.request_id for a in ports.answers) == [100, 102]
    driver.flush()
    resent = [n for n, _, _ in ports.batches[2:]] + [n for n, _, _ in ports.stores]
    assert resent and n2 not in resent  # n2 is blacklisted for log 11
    retry = sequencers[1].appenders[next(iter(sequencers[1].appenders))]
    assert retry.wave == 2 and n1 in retry.stored_nodes
    _, store, callback = ports.stores[-1]
    callback(stored_ok(store))
    assert sorted(a.request_id for a in ports.answers) == [100, 101, 102]
    timers[0][1]()  # the wave's timer, late: nothing left to do
    assert all(not s.appenders for s in sequencers)


def test_the_wave_timeout_gives_each_appender_its_own_next_wave() -> None:
    ports, driver, sequencers, timers = setup()
    start(ports, driver, sequencers)
    ports.batches[0][2](StoredBatch(statuses=(0,) * 3))  # the other node never answers
    (due_ms, fire), = timers
    ports.now = due_ms
    fire()
    assert all(s.deadline_ms() == due_ms for s in sequencers)  # their own timers now
    for sequencer in sequencers:
        driver.apply(sequencer, sequencer.on_timer(due_ms))
    driver.flush()
    waves = {a.wave for s in sequencers for a in s.appenders.values()}
    assert waves == {2} and not ports.answers


def test_a_preempted_log_in_a_wave_ends_alone() -> None:
    ports, driver, sequencers, _ = setup()
    start(ports, driver, sequencers)
    _, batch, done = ports.batches[0]
    index = [s.log_id for s in batch.stores].index(LogId(12))
    done(StoredBatch(statuses=tuple(int(Status.PREEMPTED) if i == index else 0
                                    for i in range(3)),
                     seals=((index, 3, "other-seq"),)))
    ports.batches[1][2](StoredBatch(statuses=(0,) * 3))
    answers = {a.request_id: a for a in ports.answers}
    assert answers[102].status is Status.TIMEDOUT and "preempted" in answers[102].message
    assert answers[100].status is answers[101].status is Status.OK
    assert sequencers[2].state is SequencerState.PREEMPTED


def test_without_a_timer_port_each_appender_sends_its_own_wave() -> None:
    ports = Ports()
    driver = EffectDriver(ports, store_batch_stores_max=64)
    sequencers = [active(10 + i) for i in range(3)]
    start(ports, driver, sequencers)
    assert all(s.deadline_ms() is not None for s in sequencers)  # per-log timers
    assert all(isinstance(a, AppendReply) for a in ports.answers)
