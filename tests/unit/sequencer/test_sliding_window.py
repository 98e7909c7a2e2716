"""SlidingWindow against a simple model: bounded appends, reap in ESN order, LNG rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sequencer.core.sliding_window import SlidingWindow
from shared.types import Esn


def test_full_window_refuses_and_reserves_nothing() -> None:
    window = SlidingWindow(window_appends_max=2)
    assert window.grow(1) == 1
    assert window.grow(3) == 2
    assert window.grow(1) is None
    assert window.next_esn == 5


def test_retire_out_of_order_reaps_in_order() -> None:
    window = SlidingWindow(window_appends_max=4)
    first, second, third = window.grow(1), window.grow(2), window.grow(1)
    assert (first, second, third) == (1, 2, 4)
    window.retire(Esn(4), fully_replicated=True)
    window.retire(Esn(2), fully_replicated=True)
    assert window.reap() == []
    assert window.lng == 0
    window.retire(Esn(1), fully_replicated=True)
    assert [s.first_esn for s in window.reap()] == [1, 2, 4]
    assert window.lng == 4


def test_unreplicated_retire_freezes_lng() -> None:
    window = SlidingWindow(window_appends_max=4)
    window.grow(1)
    window.grow(1)
    window.retire(Esn(1), fully_replicated=False)
    window.retire(Esn(2), fully_replicated=True)
    window.reap()
    assert window.lng == 0


def test_esn_exhaustion() -> None:
    window = SlidingWindow(window_appends_max=10, esn_max=Esn(3))
    assert window.grow(2) == 1
    assert window.grow(2) is None
    assert window.grow(1) == 3
    assert window.esns_left() == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["grow", "retire"]), st.integers(1, 5),
                          st.integers(0, 50)), max_size=80),
       st.integers(1, 6))
def test_matches_model(ops: list[tuple[str, int, int]], capacity: int) -> None:
    window = SlidingWindow(window_appends_max=capacity)
    model: list[list[int]] = []  # [first, last, retired]
    next_esn, lng = 1, 0
    for op, count, pick in ops:
        if op == "grow":
            got = window.grow(count)
            if len(model) >= capacity:
                assert got is None
            else:
                assert got == next_esn
                model.append([next_esn, next_esn + count - 1, 0])
                next_esn += count
        else:
            live = [slot for slot in model if not slot[2]]
            if not live:
                continue
            slot = live[pick % len(live)]
            slot[2] = 1
            window.retire(Esn(slot[0]), fully_replicated=True)
            reaped = window.reap()
            expected = []
            while model and model[0][2]:
                expected.append(model.pop(0))
            assert [s.first_esn for s in reaped] == [e[0] for e in expected]
            if expected:
                lng = expected[-1][1]
        assert window.lng == lng
        assert window.appends_in_flight == len(model)
