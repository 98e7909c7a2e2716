"""``shared.authority``: validation of received ranges (fuzzed), and where an f-majority of
authoritative answers stops."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.authority import RANGES_MAX, checked, clipped, covers, normalized, vouched_until
from shared.types import LSN_MAX

_values = st.recursive(
    st.none() | st.integers(min_value=-2, max_value=LSN_MAX + 2) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12)


@given(_values)
def test_checked_accepts_only_ascending_disjoint_pairs(value: Any) -> None:
    result = checked(value)
    if result is None:
        return
    assert result is value
    previous = 0
    for lo, hi in result:
        assert type(lo) is int and type(hi) is int and previous < lo <= hi <= LSN_MAX
        previous = hi


@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 20)), max_size=8),
       st.integers(1, 120), st.integers(0, 30))
def test_normalized_and_clipped_keep_exactly_the_covered_lsns(
        pairs: list[tuple[int, int]], lo: int, width: int) -> None:
    ranges = [(a, a + d) for a, d in pairs]
    inside = clipped(normalized(ranges), lo, lo + width)
    assert checked(inside) == inside
    for lsn in range(lo, lo + width + 1):
        assert covers(inside, lsn) == any(a <= lsn <= b for a, b in ranges)


def test_clipped_never_says_less_than_it_was_given() -> None:
    many = tuple((2 * i + 1, 2 * i + 1) for i in range(RANGES_MAX + 10))
    kept = clipped(many, 1, LSN_MAX)
    assert len(kept) == RANGES_MAX and kept[-1][1] == many[-1][1]


def test_vouched_until() -> None:
    whole = (1, LSN_MAX)
    assert vouched_until([(), (), ()], 10, 20, 3) == 20
    assert vouched_until([((15, 30),), (), ()], 10, 20, 3) == 14
    assert vouched_until([((15, 16),), (), (), ()], 10, 20, 3) == 20
    assert vouched_until([(whole,), (), ()], 10, 20, 3) == 9
    assert vouched_until([((12, 13),), ((14, 14),), (), ()], 10, 20, 3) == 20
    assert vouched_until([((12, 14),), ((14, 14),), (), ()], 10, 20, 3) == 13
