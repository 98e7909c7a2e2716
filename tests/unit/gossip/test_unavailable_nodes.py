"""Copyset selection skips storage nodes the failure detector reports DEAD (passed in through
the sequencer core), unless too few others remain."""

from __future__ import annotations

import random

from sequencer.core.nodeset_state import NodesetState
from sequencer.core.sequencer import Sequencer
from shared.config import SequencerConfig
from shared.types import LogId, NodeId

NODESET = tuple(NodeId(f"st{i}") for i in range(1, 6))


def test_dead_nodes_are_never_picked_while_enough_others_remain() -> None:
    state = NodesetState(NODESET, SequencerConfig())
    state.unavailable = frozenset({NodeId("st2"), NodeId("st4")})
    rng = random.Random(3)
    for _ in range(200):
        copyset = state.pick_copyset(3, rng, now_ms=0)
        assert copyset is not None and len(set(copyset)) == 3
        assert not set(copyset) & state.unavailable


def test_dead_nodes_are_used_when_nothing_else_is_left() -> None:
    state = NodesetState(NODESET, SequencerConfig())
    state.unavailable = frozenset(NODESET[:3])
    copyset = state.pick_copyset(3, random.Random(1), now_ms=0)
    assert copyset is not None and len(set(copyset)) == 3


def test_sequencer_passes_the_set_to_its_nodeset_state() -> None:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("s1"), config=SequencerConfig(),
                          rng=random.Random(1))
    dead = frozenset({NodeId("st1")})
    sequencer.set_unavailable_nodes(dead)
    sequencer.nodeset = NodesetState(NODESET, SequencerConfig())
    sequencer.set_unavailable_nodes(dead)
    assert sequencer.nodeset.unavailable == dead
