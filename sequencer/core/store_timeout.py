"""The first wave's store timeout, adapted to how long STOREs really take (pure).

A fixed ``store_timeout_ms_min`` (10 ms, LogDevice's default) suits one small record on an
idle cluster. A batched writer keeps many 256 KiB STOREs queued behind each other's fsyncs, so
their round trip is tens to hundreds of ms: with a fixed 10 ms every wave timed out and went
out again to the same nodes, doubling (or worse) the bytes sent, written and fsynced, and
leaving dead copies for compaction to clean up. Like TCP's retransmission timer (RFC 6298),
the estimate is a smoothed round trip plus four mean deviations (at least twice the smoothed
round trip), fed only by answers to the wave they belong to, and never below
``store_timeout_ms_min`` nor above ``store_timeout_ms_max``. Later waves still double it
(``Appender.store_timeout_ms``).

The samples are pooled over every node of the log: a node much slower than the others still
times out and gets graylisted.
"""

from __future__ import annotations

from shared.config import SequencerConfig

_GAIN_SHIFT = 3
"""srtt moves 1/8 of the way to each sample (RFC 6298's alpha)."""
_VAR_GAIN_SHIFT = 2
"""rttvar moves 1/4 of the way (RFC 6298's beta)."""
_VAR_FACTOR = 4
_SRTT_FACTOR = 2


class StoreTimeout:
    """Smoothed STORE round trip (ms) and the first wave's timeout derived from it."""

    __slots__ = ("_max_ms", "_min_ms", "rttvar_ms", "srtt_ms")

    def __init__(self, config: SequencerConfig) -> None:
        self._min_ms = config.store_timeout_ms_min
        self._max_ms = config.store_timeout_ms_max
        self.srtt_ms: float | None = None
        self.rttvar_ms = 0.0

    def on_sample(self, rtt_ms: int) -> None:
        """One STORED OK of the wave it answers, ``rtt_ms`` after that wave went out."""
        sample = float(max(rtt_ms, 0))
        srtt = self.srtt_ms
        if srtt is None:
            self.srtt_ms = sample
            self.rttvar_ms = sample / 2
            return
        self.rttvar_ms += (abs(srtt - sample) - self.rttvar_ms) / (1 << _VAR_GAIN_SHIFT)
        self.srtt_ms = srtt + (sample - srtt) / (1 << _GAIN_SHIFT)

    def on_silent_timeout(self, timeout_ms: int) -> None:
        """A wave timed out with none of its recipients answering: the estimate was too low
        for the load (RFC 6298's back-off), so the next first waves wait at least as long as
        this one did, until answers bring the estimate down again."""
        if self.srtt_ms is None or self.srtt_ms < timeout_ms:
            self.srtt_ms = float(timeout_ms)

    def first_wave_ms(self) -> int:
        """The first wave's timeout."""
        if self.srtt_ms is None:
            return self._min_ms
        # At a steady round trip rttvar decays to nothing and srtt + 4 * rttvar to about
        # srtt, which half the answers exceed: at least twice srtt keeps jitter from resending
        # (TCP has its 200 ms - 1 s floor for the same reason).
        srtt = self.srtt_ms
        estimate = int(max(srtt + _VAR_FACTOR * self.rttvar_ms, _SRTT_FACTOR * srtt)) + 1
        return min(max(estimate, self._min_ms), self._max_ms)
