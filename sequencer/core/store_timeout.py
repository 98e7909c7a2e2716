"""Store timeouts that fit the disk: per storage node and per STORE size, adapted to the
round trips the sequencer observes (pure).

A fixed ``store_timeout_ms_min`` (10 ms, LogDevice's default) suits one small record on an
idle cluster. Under load a STORE waits behind other STOREs' writes and fsyncs, and a 1 MiB
STORE takes longer than a 100 B one: with a timeout shorter than that, every wave timed out
and the whole payload went again to nodes still writing it, multiplying the bytes sent,
written and fsynced.

``StoreLatency`` is shared by every log's sequencer in one process (a node's disk is the same
whichever log writes to it): per storage node and per size class (4x apart) it keeps a
smoothed round trip and its mean deviation like TCP's retransmission timer (RFC 6298), and a
node's timeout for a STORE is ``max(srtt + 4 * rttvar, 2 * srtt)`` of that class, or of the
largest smaller class it has samples of, never shorter than a smaller class's (a bigger STORE
never gets less time). A size it has never seen also gets a transfer allowance (its bytes at
``ASSUMED_WRITE_BYTES_PER_MS``) until answers bring the estimate down. A wave that times out
with none of its recipients answering backs each of them off (the next timeout is at least
twice what was waited: LogDevice's exponential store-timeout backoff between
``store_timeout_ms_min`` and ``store_timeout_ms_max``). Samples come from every STORED OK,
measured from the send of the wave it names, so a late answer to an earlier wave (the very
one that shows the estimate was too short) counts too.

A wave waits for the slowest recipient's timeout, but at most ``OUTLIER_FACTOR`` times the
fastest one's, so that a node much slower than its peers still times out and is graylisted.
Later waves double the first wave's timeout (``Appender.store_timeout_ms``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from shared.config import SequencerConfig
from shared.types import NodeId

_GAIN_SHIFT = 3
"""srtt moves 1/8 of the way to each sample (RFC 6298's alpha)."""
_VAR_GAIN_SHIFT = 2
"""rttvar moves 1/4 of the way (RFC 6298's beta)."""
_VAR_FACTOR = 4
_SRTT_FACTOR = 2
SIZE_CLASSES = 12
"""Class k holds STOREs of at most 1 KiB * 4**k payload bytes; the last holds all larger."""
ASSUMED_WRITE_BYTES_PER_MS = 10_000
"""Before a node answered a STORE of some size class, its payload is assumed to take this
long per byte on top of smaller STOREs' timeout (10 MB/s, a slow disk: 1 MiB gets ~105 ms)."""
OUTLIER_FACTOR = 4
"""A wave waits at most this many times its fastest recipient's timeout."""
NODES_TRACKED_MAX = 4096
"""Storage nodes with an estimate; further nodes get the defaults (membership is smaller)."""
_TIMEOUTS_CACHED_MAX = 1024
"""``StoreLatency.timeout_ms`` answers kept between samples."""


def size_class(payload_bytes: int) -> int:
    if payload_bytes <= 1024:
        return 0
    return min(((payload_bytes - 1).bit_length() - 9) // 2, SIZE_CLASSES - 1)


class StoreTimeout:
    """One smoothed STORE round trip (ms) and the timeout derived from it (``rto_ms``)."""

    __slots__ = ("rto_ms", "rttvar_ms", "srtt_ms")

    def __init__(self) -> None:
        self.srtt_ms: float | None = None
        self.rttvar_ms = 0.0
        self.rto_ms = -1.0
        """The timeout, or -1 before any sample."""

    def on_sample(self, rtt_ms: int) -> None:
        sample = float(rtt_ms) if rtt_ms > 0 else 0.0
        srtt = self.srtt_ms
        if srtt is None:
            self.srtt_ms = srtt = sample
            self.rttvar_ms = sample / 2
        else:
            self.rttvar_ms += (abs(srtt - sample) - self.rttvar_ms) / (1 << _VAR_GAIN_SHIFT)
            self.srtt_ms = srtt = srtt + (sample - srtt) / (1 << _GAIN_SHIFT)
        # (``_derive``, inlined: this runs for every STORED OK.)
        rto = srtt + _VAR_FACTOR * self.rttvar_ms
        self.rto_ms = rto if rto > _SRTT_FACTOR * srtt else _SRTT_FACTOR * srtt

    def on_silent_timeout(self, waited_ms: int) -> None:
        """Waited ``waited_ms`` for nothing: the estimate was too low for the load (RFC 6298's
        back-off), so the next timeout is at least twice as long, until answers bring the
        estimate down again."""
        if self.srtt_ms is None or self.srtt_ms < waited_ms:
            self.srtt_ms = float(waited_ms)
            self._derive(self.srtt_ms)

    def _derive(self, srtt: float) -> None:
        # At a steady round trip rttvar decays to nothing and srtt + 4 * rttvar to about
        # srtt, which half the answers exceed: at least twice srtt keeps jitter from resending
        # (TCP has its 200 ms - 1 s floor for the same reason).
        self.rto_ms = max(srtt + _VAR_FACTOR * self.rttvar_ms, _SRTT_FACTOR * srtt)

    def timeout_ms(self) -> float | None:
        return None if self.rto_ms < 0 else self.rto_ms


class StoreLatency:
    """Per storage node and size class, the STORE round trips observed (see the module)."""

    __slots__ = ("_nodes", "_timeouts")

    def __init__(self) -> None:
        self._nodes: dict[NodeId, list[StoreTimeout]] = {}
        self._timeouts: dict[tuple[object, ...], int] = {}
        """``timeout_ms`` answers since the last sample: with many logs, each append's first
        wave asks for the same copysets and sizes again and again."""

    def _classes(self, node: NodeId) -> list[StoreTimeout] | None:
        classes = self._nodes.get(node)
        if classes is None and len(self._nodes) < NODES_TRACKED_MAX:
            classes = self._nodes[node] = [StoreTimeout() for _ in range(SIZE_CLASSES)]
        return classes

    def estimate(self, node: NodeId, payload_bytes: int) -> StoreTimeout | None:
        """The estimator of ``node``'s STOREs of this size (for tests and metrics)."""
        classes = self._nodes.get(node)
        return None if classes is None else classes[size_class(payload_bytes)]

    def on_sample(self, node: NodeId, payload_bytes: int, rtt_ms: int) -> None:
        """``node`` answered STORED OK ``rtt_ms`` after the STORE went out."""
        classes = self._nodes.get(node) or self._classes(node)
        self._timeouts.clear()
        if classes is not None:
            classes[0 if payload_bytes <= 1024 else size_class(payload_bytes)].on_sample(rtt_ms)

    def on_silent_timeout(self, node: NodeId, payload_bytes: int, waited_ms: int) -> None:
        classes = self._classes(node)
        self._timeouts.clear()
        if classes is not None:
            classes[size_class(payload_bytes)].on_silent_timeout(waited_ms)

    def node_timeout_ms(self, node: NodeId, payload_bytes: int, min_ms: int) -> float:
        """How long ``node`` may take for a STORE of ``payload_bytes`` (at least ``min_ms``,
        not yet bounded above)."""
        classes = self._nodes.get(node)
        if classes is None:
            return min_ms + payload_bytes // ASSUMED_WRITE_BYTES_PER_MS
        wanted = 0 if payload_bytes <= 1024 else size_class(payload_bytes)
        own = best = classes[wanted].rto_ms
        for index in range(wanted):  # never less than a smaller STORE's
            smaller = classes[index].rto_ms
            if smaller > best:
                best = smaller
        if best < min_ms:
            best = min_ms
        if own < 0:  # this size not measured yet
            best += payload_bytes // ASSUMED_WRITE_BYTES_PER_MS
        return best

    def timeout_ms(self, nodes: Iterable[NodeId], payload_bytes: int,
                   config: SequencerConfig, skip: frozenset[NodeId] = frozenset()) -> int:
        """The first wave's timeout for a STORE of ``payload_bytes`` to ``nodes`` (but those
        in ``skip``), within ``store_timeout_ms_min`` and ``store_timeout_ms_max``."""
        if type(nodes) is not tuple:
            nodes = tuple(nodes)
        key = (nodes, payload_bytes, skip, config.store_timeout_ms_min,
               config.store_timeout_ms_max)
        timeout_ms = self._timeouts.get(key)
        if timeout_ms is None:
            timeouts = self._timeouts
            if len(timeouts) >= _TIMEOUTS_CACHED_MAX:
                timeouts.clear()
            timeout_ms = timeouts[key] = self._timeout_ms(nodes, payload_bytes, config, skip)
        return timeout_ms

    def _timeout_ms(self, nodes: Iterable[NodeId], payload_bytes: int,
                    config: SequencerConfig, skip: frozenset[NodeId]) -> int:
        min_ms = config.store_timeout_ms_min
        slowest = fastest = -1.0
        for node in nodes:
            if node in skip:
                continue
            timeout = self.node_timeout_ms(node, payload_bytes, min_ms)
            if timeout > slowest:
                slowest = timeout
            if fastest < 0 or timeout < fastest:
                fastest = timeout
        if slowest < 0:
            return min_ms
        wait = min(slowest, OUTLIER_FACTOR * fastest)
        return min(max(math.ceil(wait), min_ms), config.store_timeout_ms_max)
