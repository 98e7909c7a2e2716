"""The sequencer's shared effect glue (``sequencer.handlers.EffectDriver``) against
recording ports: where each effect goes, and that answers for a dropped core are ignored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sequencer.core.effects import (
    AppendReply,
    FetchProducer,
    RecoveryProgress,
    ReleaseAdvanced,
    WriteLastCleanEpoch,
)
from sequencer.core.sequencer import Sequencer
from sequencer.handlers import EffectDriver
from shared.status import Status
from shared.types import NodeId
from shared.wire.store import Store, Stored
from tests.unit.sequencer.helpers import active_sequencer


class RecordingPorts:
    def __init__(self) -> None:
        self.stores: list[tuple[NodeId, Store, Callable[[Any], None]]] = []
        self.sent: list[tuple[NodeId, Any]] = []
        self.answers: list[AppendReply] = []
        self.applied_count = 0
        self.flushes_scheduled = 0

    def now_ms(self) -> int:
        return 0

    def send(self, node: NodeId, message: Any) -> None:
        self.sent.append((node, message))

    def send_store(self, node: NodeId, store: Store, callback: Callable[[Any], None]) -> None:
        self.stores.append((node, store, callback))

    def send_store_batch(self, node: NodeId, batch: Any, callback: Callable[[Any], None]) -> None:
        self.sent.append((node, batch))

    def schedule_flush(self) -> None:
        self.flushes_scheduled += 1

    def request(self, node: NodeId, message: Any, callback: Callable[[Any], None], *,
                timeout_ms: int | None = None) -> None:
        self.sent.append((node, message))

    def answer(self, sequencer: Sequencer, reply: AppendReply) -> None:
        self.answers.append(reply)

    def release_advanced(self, sequencer: Sequencer, effect: ReleaseAdvanced) -> None:
        pass

    def activate(self, sequencer: Sequencer) -> None:
        pass

    def fetch_producer(self, sequencer: Sequencer, effect: FetchProducer) -> None:
        pass

    def write_lce(self, sequencer: Sequencer, effect: WriteLastCleanEpoch) -> None:
        pass

    def recovery_progress(self, sequencer: Sequencer, effect: RecoveryProgress) -> None:
        pass

    def applied(self, sequencer: Sequencer) -> None:
        self.applied_count += 1


def stored_ok(store: Store) -> Stored:
    return Stored(log_id=store.log_id, lsn=store.lsn, wave=store.wave, status=Status.OK,
                  sealed_epoch=0, sealed_by=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("live", [True, False])
def test_stored_replies_reach_the_core_only_while_it_is_live(live: bool) -> None:
    sequencer = active_sequencer(replication=2)
    ports = RecordingPorts()
    driver = EffectDriver(ports, live=lambda s: live)
    driver.apply(sequencer, sequencer.on_append(9, (b"p",), None, 0, 0))
    assert not ports.stores and ports.flushes_scheduled == 1  # staged for this moment
    driver.flush()
    assert len(ports.stores) == 2 and ports.applied_count == 1
    for _, store, callback in ports.stores:
        callback(stored_ok(store))
    assert [a.request_id for a in ports.answers] == ([9] if live else [])
    assert [a.status for a in ports.answers] == ([Status.OK] if live else [])


def test_answers_go_straight_to_the_waiters_when_given() -> None:
    sequencer = active_sequencer(replication=2)
    ports = RecordingPorts()
    got: list[AppendReply] = []
    waiters: dict[int, Callable[[Any], None]] = {9: got.append}
    driver = EffectDriver(ports, waiters=waiters, deliver=lambda done, reply: done(reply))
    driver.apply(sequencer, sequencer.on_append(9, (b"p",), None, 0, 0))
    driver.flush()
    for _, store, callback in ports.stores:
        callback(stored_ok(store))
    assert [r.request_id for r in got] == [9] and not ports.answers and not waiters


def test_failed_store_is_handed_to_the_core_as_its_status() -> None:
    sequencer = active_sequencer(replication=2)
    ports = RecordingPorts()
    driver = EffectDriver(ports)
    driver.apply(sequencer, sequencer.on_append(9, (b"p",), None, 0, 0))
    driver.flush()
    _, _, callback = ports.stores[0]
    callback(Status.CONNFAILED)  # the core tries another node: a new STORE goes out
    driver.flush()
    assert len(ports.stores) >= 3 and not ports.answers


def test_unknown_effect_is_a_bug() -> None:
    with pytest.raises(AssertionError, match="unknown effect"):
        EffectDriver(RecordingPorts()).apply(active_sequencer(), [object()])
