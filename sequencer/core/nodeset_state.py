"""Which storage nodes of a log's nodeset an appender may use now, and copyset selection.

Blacklisting (a node answered with an error) and graylisting (a node did not answer in time)
both make a node unavailable until a deadline. The gray list is cleared when it exceeds
``graylist_nodeset_fraction_max`` of the nodeset, or when no copyset can be picked without
its members (LogDevice's NodeSetState).
"""

from __future__ import annotations

from shared.config import SequencerConfig
from shared.ports import Rng
from shared.status import Status
from shared.types import NodeId


class NodesetState:
    __slots__ = ("_blacklist_until_ms", "_config", "_graylist_until_ms", "_weights", "nodeset",
                 "unavailable")

    def __init__(
        self,
        nodeset: tuple[NodeId, ...],
        config: SequencerConfig,
        weights: dict[NodeId, float] | None = None,
    ) -> None:
        assert nodeset
        self.nodeset = nodeset
        self._config = config
        self._weights = weights or {}
        self._blacklist_until_ms: dict[NodeId, int] = {}
        self._graylist_until_ms: dict[NodeId, int] = {}
        self.unavailable: frozenset[NodeId] = frozenset()
        """Nodes the failure detector reports DEAD; set by the driver through the sequencer."""

    def blacklist(self, node: NodeId, status: Status, now_ms: int) -> None:
        config = self._config
        duration_ms = {
            Status.NOSPC: config.blacklist_nospc_ms,
            Status.DISABLED: config.blacklist_disabled_ms,
            Status.OVERLOADED: config.blacklist_overloaded_ms,
        }.get(status, config.blacklist_error_ms)
        self._blacklist_until_ms[node] = now_ms + duration_ms

    def graylist(self, node: NodeId, now_ms: int) -> None:
        self._expire(now_ms)
        self._graylist_until_ms[node] = now_ms + self._config.graylist_duration_ms
        threshold = self._config.graylist_nodeset_fraction_max * len(self.nodeset)
        # Past the fraction, not at it: with 4 nodes and 0.25 one node may be graylisted.
        if len(self._graylist_until_ms) > threshold:
            self._graylist_until_ms.clear()

    def blacklisted(self, now_ms: int) -> set[NodeId]:
        self._expire(now_ms)
        return set(self._blacklist_until_ms)

    def graylisted(self, now_ms: int) -> set[NodeId]:
        self._expire(now_ms)
        return set(self._graylist_until_ms)

    def clean(self) -> bool:
        """Nothing black- or graylisted: a copyset any other clean state of the same nodeset
        would pick from the same nodes (``sequencer.core.shared_wave``)."""
        return not (self._blacklist_until_ms or self._graylist_until_ms)

    def pick_copyset(
        self,
        replication: int,
        rng: Rng,
        now_ms: int,
        preferred: frozenset[NodeId] = frozenset(),
    ) -> tuple[NodeId, ...] | None:
        """``replication`` distinct available nodes, drawn in proportion to storage capacity,
        taking available ``preferred`` nodes (those already holding a copy) first; None when
        not enough nodes are available. Nodes in ``unavailable`` (DEAD to the failure
        detector) are skipped unless too few others remain: gossip views can be wrong, and a
        store that times out costs less than refusing the append."""
        if not (self._blacklist_until_ms or self._graylist_until_ms or self.unavailable
                or preferred) and len(self.nodeset) >= replication:
            # Every node usable (the common case): what the general path below picks, with
            # the same draws, without its lists (one pick per appender).
            return self._weighted_sample(list(self.nodeset), replication, rng)
        self._expire(now_ms)
        candidates = [n for n in self.nodeset if n not in self._blacklist_until_ms]
        if self.unavailable:
            alive = [n for n in candidates if n not in self.unavailable]
            if len(alive) >= replication:
                candidates = alive
        usable = [n for n in candidates if n not in self._graylist_until_ms]
        if len(usable) < replication:
            self._graylist_until_ms.clear()
            usable = candidates
        if len(usable) < replication:
            return None
        kept = [n for n in usable if n in preferred][:replication]
        rest = [n for n in usable if n not in preferred]
        return tuple(kept) + self._weighted_sample(rest, replication - len(kept), rng)

    def _weighted_sample(
        self, nodes: list[NodeId], count: int, rng: Rng
    ) -> tuple[NodeId, ...]:
        if count == 0:
            return ()
        if count == len(nodes):
            # Every node is needed; rotate so that "first outstanding" varies between appends.
            start = int(rng.random() * len(nodes))
            return tuple(nodes[start:] + nodes[:start])
        pool = list(nodes)
        chosen: list[NodeId] = []
        for _ in range(count):
            weights = [max(self._weights.get(n, 1.0), 0.0) for n in pool]
            total = sum(weights)
            if total <= 0.0:
                index = int(rng.random() * len(pool))
            else:
                point = rng.random() * total
                index = len(pool) - 1
                for i, weight in enumerate(weights):
                    point -= weight
                    if point < 0.0:
                        index = i
                        break
            chosen.append(pool.pop(index))
        return tuple(chosen)

    def _expire(self, now_ms: int) -> None:
        for table in (self._blacklist_until_ms, self._graylist_until_ms):
            if table:
                for node in [n for n, until in table.items() if until <= now_ms]:
                    del table[node]
