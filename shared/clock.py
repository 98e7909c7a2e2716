"""Time as cores see it: an injected ``Clock``. Only drivers use the real one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def wall_ms(self) -> int: ...


class SystemClock:
    """Monotonic milliseconds for deadlines, wall-clock milliseconds for record timestamps."""

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000
