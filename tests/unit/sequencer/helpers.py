"""Builders shared by the sequencer core tests."""

from __future__ import annotations

import random
from typing import Any

from sequencer.core.effects import ActivateEpoch, AppendReply
from sequencer.core.sequencer import Sequencer
from sequencer.core.store_timeout import StoreLatency
from shared.config import SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import ESN_MAX, Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.store import Store

NODES = (NodeId("a"), NodeId("b"), NodeId("c"))


def metadata(replication: int = 2, nodeset: tuple[NodeId, ...] = NODES) -> LogMetadata:
    return LogMetadata(log_id=LogId(1), next_epoch=Epoch(2), nodeset=nodeset,
                       replication_factor=replication, last_writer=NodeId("seq"), version=1)


def active_sequencer(
    *, replication: int = 2, lce_epoch: int = 0, epoch: int = 1, esn_max: Esn = ESN_MAX,
    store_latency: StoreLatency | None = None, **config: Any
) -> Sequencer:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"),
                          config=SequencerConfig(**config), rng=random.Random(7),
                          esn_max=esn_max, store_latency=store_latency)
    effects = sequencer.on_append(1, (b"first",), None, 1000, 0)
    assert effects == [ActivateEpoch(LogId(1))]
    lce = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(lce_epoch), tail_lsn=Lsn(0), version=0)
    sends = sequencer.on_activated(Status.OK, Epoch(epoch), metadata(replication), lce, 0)
    # Complete the queued first append so tests start from a clean window.
    for send in stores(sends):
        sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0), None, 0)
    sequencer.on_timer(0)
    # Settle the RELEASE owed for it, so that tests start with no deadline pending.
    due_ms = sequencer.deadline_ms()
    if due_ms is not None:
        sequencer.on_timer(due_ms)
    # Over an unclean epoch, recovery runs (and has timers) until its nodes answer.
    assert sequencer.deadline_ms() is None or sequencer.recovery is not None
    return sequencer


def stores(effects: list[Any]) -> list[Send]:
    return [e for e in effects if type(e) is Send and type(e.message) is Store]


def replies(effects: list[Any]) -> list[AppendReply]:
    return [e for e in effects if type(e) is AppendReply]
