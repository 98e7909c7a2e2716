"""Simulated time: an integer-millisecond clock and the one event queue that advances it.

Events are plain callbacks ordered by ``(time_ms, seq)``: ``seq`` is a global counter, so two
events due at the same millisecond run in the order they were scheduled and a run depends on
nothing but the seed. Nothing here reads the real clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

Event = Callable[[], None]

EVENTS_QUEUED_MAX = 1_000_000
"""A run that queues more events than this has a runaway feedback loop (a bug to report)."""


class SimClock:
    """Milliseconds since the start of the run; only the event queue moves it forward."""

    def __init__(self) -> None:
        self._now_ms = 0

    def now_ms(self) -> int:
        return self._now_ms

    def wall_ms(self) -> int:
        # Record timestamps only need to be deterministic, not realistic.
        return 1_700_000_000_000 + self._now_ms

    def advance_to(self, time_ms: int) -> None:
        assert time_ms >= self._now_ms, (time_ms, self._now_ms)
        self._now_ms = time_ms


class EventQueue:
    """Heap of ``(time_ms, seq, event)``; ``run_next`` pops one event and moves the clock."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._heap: list[tuple[int, int, Event]] = []
        self._seq = 0
        self.events_run_count = 0

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, time_ms: int, event: Event) -> None:
        assert time_ms >= self.clock.now_ms(), (time_ms, self.clock.now_ms())
        assert len(self._heap) < EVENTS_QUEUED_MAX, "event queue overflow: runaway loop"
        self._seq += 1
        heapq.heappush(self._heap, (time_ms, self._seq, event))

    def after(self, delay_ms: int, event: Event) -> None:
        assert delay_ms >= 0, delay_ms
        self.at(self.clock.now_ms() + delay_ms, event)

    def next_time_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run_next(self) -> bool:
        """Run the earliest event; False when the queue is empty."""
        if not self._heap:
            return False
        time_ms, _, event = heapq.heappop(self._heap)
        self.clock.advance_to(time_ms)
        self.events_run_count += 1
        event()
        return True
