"""The read merge: records deduplicated in order, gaps only where an f-majority says so."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.read_merge import Gap, NodeAnswer, f_majority, merge
from shared.types import Epoch, Esn, Lsn, compose_lsn


def lsn(epoch: int, esn: int) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def rec(epoch: int, esn: int) -> tuple[int, int, None, bytes]:
    return (lsn(epoch, esn), 0, None, b"%d.%d" % (epoch, esn))


def answer(*records: tuple[int, int, None, bytes], next_lsn: Lsn) -> NodeAnswer:
    return NodeAnswer(records=records, next_lsn=next_lsn, release_lsn=Lsn(next_lsn - 1))


def test_copies_deduplicated_and_epochs_bridged() -> None:
    a = answer(rec(1, 1), rec(1, 2), rec(2, 1), next_lsn=lsn(2, 2))
    b = answer(rec(1, 2), rec(2, 1), next_lsn=lsn(2, 2))
    merged = merge([a, b], Lsn(1), lsn(2, 1), 100, 1 << 20)
    assert [r[0] for r in merged.records] == [lsn(1, 1), lsn(1, 2), lsn(2, 1)]
    assert merged.gaps == [Gap("BRIDGE", Lsn(1), lsn(1, 0)),
                           Gap("BRIDGE", lsn(1, 3), lsn(2, 0))]
    assert merged.next_lsn == lsn(2, 2)


def test_stops_at_the_least_advanced_node() -> None:
    a = answer(rec(1, 1), rec(1, 2), rec(1, 3), next_lsn=lsn(1, 4))
    b = answer(rec(1, 1), next_lsn=lsn(1, 2))
    merged = merge([a, b], lsn(1, 1), lsn(1, 3), 100, 1 << 20)
    assert [r[0] for r in merged.records] == [lsn(1, 1)]
    assert merged.next_lsn == lsn(1, 2)


def test_released_lsns_no_node_holds_are_dataloss_not_a_stall() -> None:
    a = answer(rec(1, 1), next_lsn=lsn(1, 6))
    b = answer(rec(1, 1), next_lsn=lsn(1, 6))
    merged = merge([a, b], lsn(1, 1), lsn(1, 5), 100, 1 << 20)
    assert merged.gaps == [Gap("DATALOSS", lsn(1, 2), lsn(1, 5))]
    assert merged.next_lsn == lsn(1, 6)


def test_nothing_found_up_to_a_later_epoch_is_bridged() -> None:
    a = answer(next_lsn=lsn(3, 1))
    merged = merge([a], lsn(2, 5), lsn(3, 0), 100, 1 << 20)
    assert merged.gaps == [Gap("BRIDGE", lsn(2, 5), lsn(3, 0))]
    assert merged.next_lsn == lsn(3, 1)


def test_limits_cut_between_records_and_keep_coverage() -> None:
    a = answer(rec(1, 1), rec(1, 2), rec(1, 3), next_lsn=lsn(1, 4))
    merged = merge([a], Lsn(1), lsn(1, 3), 2, 1 << 20)
    assert [r[0] for r in merged.records] == [lsn(1, 1), lsn(1, 2)]
    assert merged.next_lsn == lsn(1, 3)
    merged = merge([a], Lsn(1), lsn(1, 3), 100, 1)
    assert [r[0] for r in merged.records] == [lsn(1, 1)]


def test_f_majority() -> None:
    assert f_majority(3, 3) == 1
    assert f_majority(3, 2) == 2
    assert f_majority(5, 2) == 4


@settings(max_examples=300, deadline=None)
@given(st.sets(st.tuples(st.integers(1, 3), st.integers(1, 8)), max_size=20),
       st.integers(1, 3), st.integers(1, 8), st.integers(1, 30))
def test_coverage_rule_holds(held: set[tuple[int, int]], from_epoch: int, from_esn: int,
                             records_max: int) -> None:
    release = lsn(3, 8)
    records = tuple(rec(e, n) for e, n in sorted(held))
    from_lsn = lsn(from_epoch, from_esn)
    merged = merge([answer(*records, next_lsn=Lsn(release + 1))], from_lsn, release,
                   records_max, 1 << 20)
    spans = sorted([(r[0], r[0]) for r in merged.records] + [(g.lo, g.hi) for g in merged.gaps])
    cursor = from_lsn
    for lo, hi in spans:
        assert lo == cursor and hi >= lo
        cursor = Lsn(hi + 1)
    assert cursor == merged.next_lsn and merged.next_lsn - 1 <= release


def test_trim_point_becomes_one_trim_gap_even_if_a_node_missed_it() -> None:
    trimmed = NodeAnswer(records=(rec(1, 3), rec(1, 4)), next_lsn=lsn(1, 5),
                         release_lsn=lsn(1, 4), trim_lsn=lsn(1, 2))
    missed = answer(rec(1, 1), rec(1, 2), rec(1, 3), rec(1, 4), next_lsn=lsn(1, 5))
    merged = merge([missed, trimmed], lsn(1, 1), lsn(1, 4), 100, 1 << 20)
    assert merged.gaps == [Gap("TRIM", lsn(1, 1), lsn(1, 2))]
    assert [r[0] for r in merged.records] == [lsn(1, 3), lsn(1, 4)]
    # Reading from inside the trimmed range, or past it.
    assert merge([trimmed], lsn(1, 2), lsn(1, 4), 100, 1 << 20).gaps == [
        Gap("TRIM", lsn(1, 2), lsn(1, 2))]
    assert merge([trimmed], lsn(1, 4), lsn(1, 4), 100, 1 << 20).gaps == []


def test_a_read_starting_past_a_bridge_never_gets_the_stray_copies_behind_it() -> None:
    """Chaos seed 1 (long run): recovery bridged epoch 15 at n1115 on st1-st3; st4 missed the
    CLEAN and kept a stray copy at e15n1116. A producer lookup checked that candidate with a
    read from e15n1116 and, seeing no bridge (it lies below the read), was served the stray:
    the retry was acknowledged at LSNs every reader gets as a BRIDGE gap. Nodes now add the
    bridge below a READ's start to their answer."""
    bridge = (lsn(15, 1115), lsn(15, 1115), 7, 16 << 8)
    stray = answer(rec(15, 1116), rec(17, 1), next_lsn=lsn(17, 2))
    bridged = NodeAnswer(records=(rec(17, 1),), next_lsn=lsn(17, 2), release_lsn=lsn(17, 1),
                         markers=(bridge,))
    merged = merge([stray, bridged], lsn(15, 1116), lsn(17, 1), 100, 1 << 20)
    assert [r[0] for r in merged.records] == [lsn(17, 1)]
    assert merged.gaps == [Gap("BRIDGE", lsn(15, 1116), lsn(17, 0))]
    # Without the bridge marker (as before) the stray was served.
    plain = NodeAnswer(records=(rec(17, 1),), next_lsn=lsn(17, 2), release_lsn=lsn(17, 1))
    before = merge([stray, plain], lsn(15, 1116), lsn(17, 1), 100, 1 << 20)
    assert lsn(15, 1116) in [r[0] for r in before.records]


def test_a_stale_bridge_below_the_read_ends_nothing_a_later_recovery_outranks() -> None:
    # An abandoned recovery attempt left a bridge at e15n5 on one node; the next attempt
    # decided records through e15n9 (copies written by recovery, attempt 2) and bridged at 10.
    stale = (lsn(15, 5), lsn(15, 5), 7, 16 << 8 | 1)
    kept = NodeAnswer(records=(rec(15, 7),), next_lsn=lsn(15, 8), release_lsn=lsn(17, 0),
                      markers=((lsn(15, 7), lsn(15, 7), 1, 16 << 8 | 2),))
    old = NodeAnswer(records=(), next_lsn=lsn(17, 1), release_lsn=lsn(17, 0), markers=(stale,))
    merged = merge([kept, old], lsn(15, 7), lsn(17, 0), 100, 1 << 20)
    assert [r[0] for r in merged.records] == [lsn(15, 7)]
    assert merged.gaps == []
