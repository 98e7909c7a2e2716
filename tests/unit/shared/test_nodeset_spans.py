"""Each epoch range of a log is read from its own nodeset, and from where a drain moved its
copies (issue 17): ``shared.read_round.metadata_spans``."""

from __future__ import annotations

from shared.epoch_metadata import EpochNodeset, LogMetadata
from shared.read_round import beyond_spans, metadata_spans, nodes_of_epochs, span_of
from shared.types import Epoch, Esn, LogId, NodeId, compose_lsn

A, B, C, D, E = (NodeId(n) for n in "abcde")
STORAGE = (A, B, C, D, E)
META = LogMetadata(log_id=LogId(1), next_epoch=Epoch(9), nodeset=(A, B, D),
                   replication_factor=2, last_writer=A, version=8, nodeset_since=Epoch(5),
                   earlier=(EpochNodeset(Epoch(1), (A, B, C, D), 2),))


def test_one_span_per_epoch_range() -> None:
    spans = metadata_spans(META)
    assert [(s.first_epoch, s.last_epoch, s.nodeset) for s in spans] == [
        (1, 4, (A, B, C, D)), (5, 8, (A, B, D))]
    assert span_of(spans, compose_lsn(Epoch(4), Esn(7))).nodeset == (A, B, C, D)
    assert span_of(spans, compose_lsn(Epoch(5), Esn(1))).nodeset == (A, B, D)
    # Metadata from before nodesets could change: one span for every epoch.
    old = LogMetadata(log_id=LogId(1), next_epoch=Epoch(3), nodeset=(A, B),
                      replication_factor=2, last_writer=A, version=2)
    assert [(s.first_epoch, s.last_epoch) for s in metadata_spans(old)] == [(1, 2)]


def test_epochs_not_handed_out_yet_are_past_every_span() -> None:
    # Epoch 9 may take a larger nodeset (storage nodes added): an f-majority of (a, b, d)
    # could miss both copies of a record on (d, e). Its LSNs are read only with metadata
    # that covers them.
    spans = metadata_spans(META)
    assert not beyond_spans(spans, compose_lsn(Epoch(8), Esn(1_000_000)))
    assert not beyond_spans(spans, compose_lsn(Epoch(9), Esn(0)))  # the BRIDGE ending 8
    assert beyond_spans(spans, compose_lsn(Epoch(9), Esn(1)))
    assert spans[-1].until_lsn == compose_lsn(Epoch(9), Esn(0))
    grown = LogMetadata(log_id=LogId(1), next_epoch=Epoch(10), nodeset=(A, B, D, E),
                        replication_factor=2, last_writer=A, version=9,
                        nodeset_since=Epoch(9), earlier=(*META.earlier, EpochNodeset(
                            Epoch(5), (A, B, D), 2)))
    again = metadata_spans(grown)
    assert not beyond_spans(again, compose_lsn(Epoch(9), Esn(1)))
    assert span_of(again, compose_lsn(Epoch(9), Esn(1))).nodeset == (A, B, D, E)
    assert span_of(again, compose_lsn(Epoch(8), Esn(1))).nodeset == (A, B, D)


def test_a_span_that_held_a_moved_node_is_read_where_its_copies_went() -> None:
    # c was drained: its copies went to other storage nodes (possibly e), so epochs 1-4 are
    # read from every storage node but c; epochs 5+ never held c.
    spans = metadata_spans(META, frozenset({C}), STORAGE)
    assert [s.nodeset for s in spans] == [(A, B, D, E), (A, B, D)]
    # When the nodeset was every storage node, that is the nodeset without c.
    spans = metadata_spans(META, frozenset({C}), (A, B, C, D))
    assert spans[0].nodeset == (A, B, D)
    # Never below R nodes.
    assert metadata_spans(META, frozenset({A, B, C, D}), (A, B, C, D))[0].nodeset == (
        A, B, C, D)


def test_nodes_of_epochs_is_the_union_of_the_ranges_covering_them() -> None:
    spans = metadata_spans(META)
    assert nodes_of_epochs(spans, Epoch(3), Epoch(6)) == (A, B, C, D)
    assert nodes_of_epochs(spans, Epoch(5), Epoch(8)) == (A, B, D)
