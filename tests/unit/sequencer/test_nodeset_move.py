"""A sequencer moves its log off a draining storage node (issue 17): the epoch finishes like
an exhausted one (appends in flight complete, new ones wait) and a new epoch is taken; the
recovery of earlier epochs reaches every node of their nodesets."""

from __future__ import annotations

import random

from sequencer.core.effects import ActivateEpoch
from sequencer.core.sequencer import Sequencer, SequencerState
from shared.config import SequencerConfig
from shared.epoch_metadata import EpochNodeset, LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from tests.unit.sequencer.helpers import NODES, active_sequencer, replies, stores

C = NodeId("c")


def test_an_idle_epoch_moves_at_once() -> None:
    sequencer = active_sequencer(replication=2)
    effects = sequencer.on_nodes_retired(frozenset({C}), 10)
    assert ActivateEpoch(LogId(1)) in effects
    assert sequencer.state is SequencerState.ACTIVATING


def test_appends_in_flight_complete_before_the_move() -> None:
    sequencer = active_sequencer(replication=2)
    sent = stores(sequencer.on_append(7, (b"x",), None, 1000, 5))
    assert len(sent) == 2
    assert sequencer.on_nodes_retired(frozenset({C}), 10) == []
    # An append arriving now waits for the new epoch (no LSN in the finishing one).
    assert sequencer.on_append(8, (b"y",), None, 1000, 11) == []
    effects = []
    for send in sent:
        effects += sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0),
                                       None, 12)
    assert [(r.request_id, r.status) for r in replies(effects)] == [(7, Status.OK)]
    assert ActivateEpoch(LogId(1)) in effects


def test_nothing_when_the_node_cannot_leave() -> None:
    sequencer = active_sequencer(replication=3)  # three nodes, R=3: none may leave
    assert sequencer.on_nodes_retired(frozenset({C}), 10) == []
    assert sequencer.on_nodes_retired(frozenset({NodeId("zz")}), 10) == []
    assert sequencer.state is SequencerState.ACTIVE


def test_recovery_seals_the_nodesets_of_the_epochs_it_recovers() -> None:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(1))
    assert sequencer.on_append(1, (b"a",), None, 0, 0) == [ActivateEpoch(LogId(1))]
    wide = (*NODES, NodeId("d"))
    metadata = LogMetadata(log_id=LogId(1), next_epoch=Epoch(6), nodeset=NODES,
                           replication_factor=2, last_writer=NodeId("seq"), version=5,
                           nodeset_since=Epoch(5), earlier=(EpochNodeset(Epoch(1), wide, 2),))
    lce = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(3), tail_lsn=Lsn(0), version=1)
    sequencer.on_activated(Status.OK, Epoch(5), metadata, lce, 0)
    assert sequencer.recovery is not None
    assert set(sequencer.recovery.nodeset) == set(wide)
    # Once d's copies were moved (drained), the epochs are read from every other node.
    sequencer.moved_nodes = frozenset({NodeId("d")})
    sequencer.storage_nodes = wide
    assert set(sequencer._earlier_epochs_nodes(metadata, Epoch(4), Epoch(5))) == set(NODES)
