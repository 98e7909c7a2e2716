"""Storage nodes added to the cluster join existing logs' nodesets at their next epoch
(issue 17): the planner tops the nodeset up to the wanted size, the sequencer takes a new
epoch when the membership grows, and the candidates respect capacities and drains."""

from __future__ import annotations

from collections import Counter

from epoch_store.core.metadata import plan_activation
from sequencer.core.effects import ActivateEpoch
from sequencer.core.nodeset_target import may_grow, nodeset_target
from sequencer.core.sequencer import SequencerState
from shared.config import ClusterConfig, NodeConfig
from shared.epoch_metadata import (
    NODESET_HISTORY_MAX,
    EpochNodeset,
    LogMetadata,
    NodesetTarget,
    ProvisionSpec,
    next_nodeset,
)
from shared.read_round import metadata_spans
from shared.status import Status
from shared.types import Epoch, LogId, NodeId
from tests.unit.sequencer.helpers import NODES, active_sequencer

A, B, C, D, E = (NodeId(n) for n in "abcde")
LOG = LogId(3)
W = NodeId("w")


def _activate(current: LogMetadata | None, target: NodesetTarget | None = None,
              retired: frozenset[NodeId] = frozenset()) -> LogMetadata:
    status, after = plan_activation(
        current, log_id=LOG, writer=W, retired=retired, target=target,
        provision=ProvisionSpec(nodeset=(A, B, C), replication_factor=2))
    assert status is Status.OK and after is not None
    return after


def test_the_epoch_taken_starts_a_larger_nodeset_with_the_old_range_kept() -> None:
    meta = _activate(_activate(None))  # epochs 1 and 2 on abc
    grown = _activate(meta, NodesetTarget(candidates=(D, C, B, A), size=4))
    assert (grown.next_epoch, grown.nodeset, grown.nodeset_since) == (4, (A, B, C, D), 3)
    assert grown.earlier == (EpochNodeset(Epoch(1), (A, B, C), 2),)
    # Readers read epochs 1-2 from abc, epoch 3 from abcd.
    assert [(s.first_epoch, s.last_epoch, s.nodeset) for s in metadata_spans(grown)] == [
        (1, 2, (A, B, C)), (3, 3, (A, B, C, D))]
    # Reached the target: later activations keep it.
    again = _activate(grown, NodesetTarget(candidates=(E, D, C, B, A), size=4))
    assert again.nodeset == (A, B, C, D) and again.nodeset_since == 3


def test_growth_takes_candidates_in_order_and_never_retired_ones() -> None:
    meta = _activate(None)
    target = NodesetTarget(candidates=(E, D, A), size=4)
    assert next_nodeset(meta, frozenset(), target) == (A, B, C, E)
    # A drained node leaves, and its place is taken by the next candidate.
    assert next_nodeset(meta, frozenset({B, E}), target) == (A, C, D)
    # Nothing to add, or a size already reached: unchanged.
    assert next_nodeset(meta, frozenset(), NodesetTarget(candidates=(A, B), size=5)) == (
        A, B, C)
    assert next_nodeset(meta, frozenset(), NodesetTarget(candidates=(D,), size=3)) == (
        A, B, C)


def test_a_drained_node_is_replaced_to_keep_r_even_with_a_smaller_nodeset_size() -> None:
    meta = LogMetadata(log_id=LOG, next_epoch=Epoch(3), nodeset=(A, B), replication_factor=2,
                       last_writer=W, version=2)
    # nodeset_size 1 (below R): b drains, c takes its place, so the log keeps R nodes.
    assert next_nodeset(meta, frozenset({B}), NodesetTarget(candidates=(C, D), size=1)) == (
        A, C)
    # Without a target the node cannot leave (fewer than R would remain).
    assert next_nodeset(meta, frozenset({B})) == (A, B)


def test_no_growth_past_the_history_limit() -> None:
    full = LogMetadata(
        log_id=LOG, next_epoch=Epoch(100), nodeset=(A, B, C), replication_factor=2,
        last_writer=W, version=5, nodeset_since=Epoch(90),
        earlier=tuple(EpochNodeset(Epoch(1 + i), (A, B), 2) for i in range(NODESET_HISTORY_MAX)))
    assert next_nodeset(full, frozenset(), NodesetTarget(candidates=(D,), size=4)) == (A, B, C)


def _cluster(capacities: dict[str, float], nodeset_size: int = 0) -> ClusterConfig:
    return ClusterConfig(
        nodes=(NodeConfig(node_id=NodeId("seq"), roles=("sequencer",)),
               *(NodeConfig(node_id=NodeId(n), roles=("storage",), storage_capacity=c)
                 for n, c in capacities.items())),
        replication_factor=2, nodeset_size=nodeset_size)


def test_the_target_skips_nodes_without_capacity_retired_or_dead() -> None:
    cluster = _cluster({"s1": 1, "s2": 1, "s3": 0, "s4": 1, "s5": 1})
    target = nodeset_target(LOG, cluster, retired=frozenset({NodeId("s4")}),
                            unavailable=frozenset({NodeId("s5")}))
    assert set(target.candidates) == {"s1", "s2"} and target.size == 2
    # nodeset_size bounds it; 0 means every storage node that may take copies.
    sized = nodeset_target(LOG, _cluster({f"s{i}": 1 for i in range(6)}, 4),
                           retired=frozenset(), unavailable=frozenset())
    assert sized.size == 4 and len(sized.candidates) == 6
    assert may_grow(4, 2, 3, 6) and not may_grow(4, 2, 4, 6) and may_grow(0, 2, 3, 4)
    assert not may_grow(0, 2, 4, 4)
    assert may_grow(1, 2, 1, 4)  # below R


def test_logs_spread_over_added_nodes_by_capacity() -> None:
    # A nodeset of 3 on s1-s3, then s4 (capacity 3) and s5 (capacity 1) are added and the
    # nodesets grow to 4: s4 is picked about three times as often as s5.
    cluster = _cluster({"s1": 1, "s2": 1, "s3": 1, "s4": 3, "s5": 1}, 4)
    picked: Counter[str] = Counter()
    for log in range(1, 2001):
        meta = LogMetadata(log_id=LogId(log), next_epoch=Epoch(2),
                           nodeset=(NodeId("s1"), NodeId("s2"), NodeId("s3")),
                           replication_factor=2, last_writer=W, version=1)
        target = nodeset_target(LogId(log), cluster, retired=frozenset(),
                                unavailable=frozenset())
        (added,) = set(next_nodeset(meta, frozenset(), target)) - set(meta.nodeset)
        picked[added] += 1
    assert 2.4 < picked["s4"] / picked["s5"] < 3.8, picked


def test_the_sequencer_moves_to_a_new_epoch_when_the_nodeset_wanted_is_larger() -> None:
    sequencer = active_sequencer(replication=2)
    grow = NodesetTarget(candidates=(*NODES, D), size=len(NODES) + 1)
    assert sequencer.on_nodes_retired(frozenset(), 10, NodesetTarget(
        candidates=NODES, size=len(NODES))) == []
    assert sequencer.state is SequencerState.ACTIVE
    effects = sequencer.on_nodes_retired(frozenset(), 10, grow)
    assert ActivateEpoch(LogId(1)) in effects
    assert sequencer.state is SequencerState.ACTIVATING
