"""The per-epoch sliding window of in-flight appends (LogDevice's SlidingWindowSingleEpoch).

``grow`` reserves consecutive ESNs for one append (one record or an atomic batch) at the
leading edge; it fails when ``window_appends_max`` appends are between the oldest un-reaped
one and the leading edge, which the sequencer answers with SEQNOBUFS. ``retire`` may happen in
any order; ``reap`` moves the trailing edge strictly in ESN order past retired appends.
The last known good ESN (LNG) is the highest ESN such that it and every lower ESN of the epoch
are fully replicated; an append retired without full replication freezes it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shared.types import ESN_MAX, ESN_MIN, Esn


@dataclass(slots=True)
class WindowSlot:
    first_esn: Esn
    last_esn: Esn
    retired: bool = False
    fully_replicated: bool = False


class SlidingWindow:
    __slots__ = ("_capacity", "_esn_max", "_frozen", "_lng", "_next_esn", "_slots")

    def __init__(self, *, window_appends_max: int, esn_max: Esn = ESN_MAX) -> None:
        assert window_appends_max >= 1
        self._capacity = window_appends_max
        self._esn_max = esn_max
        self._slots: deque[WindowSlot] = deque()
        self._next_esn = ESN_MIN
        self._lng = Esn(0)
        self._frozen = False

    @property
    def lng(self) -> Esn:
        return self._lng

    @property
    def appends_in_flight(self) -> int:
        return len(self._slots)

    @property
    def next_esn(self) -> Esn:
        return self._next_esn

    def full(self) -> bool:
        return len(self._slots) >= self._capacity

    def esns_left(self) -> int:
        return self._esn_max - self._next_esn + 1

    def grow(self, esn_count: int) -> Esn | None:
        """Reserve ``esn_count`` consecutive ESNs; the first one, or None if the window is full
        or the epoch has too few ESNs left."""
        assert esn_count >= 1
        if self.full() or esn_count > self.esns_left():
            return None
        first = self._next_esn
        self._slots.append(WindowSlot(first, Esn(first + esn_count - 1)))
        self._next_esn = Esn(first + esn_count)
        return first

    def retire(self, first_esn: Esn, *, fully_replicated: bool) -> None:
        slot = self._find(first_esn)
        assert not slot.retired, first_esn
        slot.retired = True
        slot.fully_replicated = fully_replicated

    def reap(self) -> list[WindowSlot]:
        """Remove and return retired slots at the trailing edge, in ESN order, advancing the
        LNG past the fully replicated ones."""
        reaped: list[WindowSlot] = []
        while self._slots and self._slots[0].retired:
            slot = self._slots.popleft()
            if slot.fully_replicated and not self._frozen:
                assert slot.first_esn == self._lng + 1, (slot.first_esn, self._lng)
                self._lng = slot.last_esn
            else:
                self._frozen = True
            reaped.append(slot)
        return reaped

    def _find(self, first_esn: Esn) -> WindowSlot:
        # Appends mostly retire near the trailing edge, so a scan from the left is short.
        for slot in self._slots:
            if slot.first_esn == first_esn:
                return slot
        raise AssertionError(f"esn {first_esn} not in the window")
