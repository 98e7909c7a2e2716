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
