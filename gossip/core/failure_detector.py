"""The gossip failure detector's pure core (LogDevice's FailureDetector, digest §6.3).

Every node keeps, per configured node, a heartbeat counter (gossip intervals since someone last
heard from that node) and the node's instance id (its start time in wall-clock ms, so a restart
increases it). Each tick it ages every other node's counter, resets its own, and sends its
whole view to one random peer; receivers keep the freshest counter per instance. A node whose
counter passes the threshold, or which announced a graceful shutdown, is DEAD; a node seen
again, or restarted, is SUSPECT for ``suspect_duration_ms`` and then ALIVE.

The core takes messages plus ``now_ms`` (monotonic, for timers) and ``wall_ms`` (for instance
ids and skew), and returns ``Send`` effects; randomness comes from an injected ``Rng``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.config import GossipConfig
from shared.effects import Send
from shared.ports import Rng
from shared.types import NodeId, node_id_valid
from shared.wire.gossip import Gossip

HEARTBEAT_MAX = 1_000_000
"""Counters saturate here; far above any threshold, small enough for any wire integer."""
GOSSIP_NODES_MAX = 10_000
"""Longest node list a gossip may carry; longer ones are malformed."""


class NodeState(StrEnum):
    ALIVE = "ALIVE"
    SUSPECT = "SUSPECT"
    DEAD = "DEAD"


@dataclass(slots=True)
class _Entry:
    heartbeat: int
    instance_id: int
    failover: bool
    state: NodeState
    suspect_since_ms: int = 0
    restarted: bool = False
    """A new instance replaced one we knew: pass through SUSPECT even if never DEAD."""


def gossip_valid(message: Gossip) -> bool:
    """The codec checks field types but not tuple elements: gossip is untrusted input."""
    count = len(message.node_ids)
    if count > GOSSIP_NODES_MAX or not (
        len(message.heartbeats) == len(message.instance_ids) == len(message.failover) == count
    ):
        return False
    return (
        all(type(n) is str and node_id_valid(n) for n in message.node_ids)
        and all(type(h) is int and h >= 0 for h in message.heartbeats)
        and all(type(i) is int and i >= 0 for i in message.instance_ids)
        and all(type(f) is bool for f in message.failover)
        and message.instance_id > 0
    )


class FailureDetector:
    """One node's view of the cluster. Call ``on_tick`` every ``gossip_interval_ms`` (more
    often is harmless) and ``on_gossip`` for every GOSSIP received."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        nodes: tuple[NodeId, ...],
        config: GossipConfig,
        rng: Rng,
        instance_id: int,
        now_ms: int,
    ) -> None:
        assert node_id in nodes and instance_id > 0
        self.node_id = node_id
        self.config = config
        self.rng = rng
        self.instance_id = instance_id
        self._started_ms = now_ms
        self._last_increment_ms = now_ms
        self._last_tick_ms = now_ms
        self.gossips_received = 0
        self.failing_over = False
        self._self_suspect_until_ms: int | None = None
        """Set when this node learns it restarted or stalled: peers see it SUSPECT until then,
        so it must not claim its logs before they do."""
        self.version = 0
        """Increases whenever a node's state changes; drivers compare it to publish views."""
        # A starting node assumes every node ALIVE and counts the silence of each from its
        # own start: the cluster routes as configured, and a node nobody hears of goes DEAD
        # after the threshold like one that stopped. Instance id 0 means "never heard of";
        # such entries carry no news and are never merged.
        self._entries: dict[NodeId, _Entry] = {
            n: _Entry(heartbeat=0, instance_id=0, failover=False, state=NodeState.ALIVE)
            for n in nodes
        }
        me = self._entries[node_id]
        me.heartbeat, me.instance_id = 0, instance_id

    # ---- queries -------------------------------------------------------------------------

    def stable(self, now_ms: int) -> bool:
        return (self.gossips_received >= self.config.min_gossips_for_stable_state
                or now_ms - self._started_ms >= self.config.startup_wait_ms)

    def state(self, node: NodeId) -> NodeState | None:
        entry = self._entries.get(node)
        return entry.state if entry is not None else None

    def view(self) -> dict[NodeId, NodeState]:
        return {n: e.state for n, e in self._entries.items()}

    def heartbeat(self, node: NodeId) -> int | None:
        entry = self._entries.get(node)
        return entry.heartbeat if entry is not None else None

    # ---- membership ----------------------------------------------------------------------

    def add_node(self, node: NodeId) -> bool:
        """A node joined the configuration: it starts ALIVE and never heard of, like every
        node at start-up, so it goes DEAD after the threshold if it stays silent. False if it
        was already a member."""
        if node in self._entries:
            return False
        self._entries[node] = _Entry(heartbeat=0, instance_id=0, failover=False,
                                     state=NodeState.ALIVE)
        self.version += 1
        return True

    # ---- inputs --------------------------------------------------------------------------

    def on_tick(self, now_ms: int, wall_ms: int) -> list[Send]:
        """Age the view, update states, gossip to one random peer."""
        interval_ms = self.config.gossip_interval_ms
        stalled = now_ms - self._last_tick_ms > self.config.gossip_threshold_intervals * interval_ms
        self._last_tick_ms = now_ms
        if stalled and not self.failing_over:
            # This process did not run for longer than the threshold (SIGSTOP, a long pause):
            # peers have declared it DEAD and will see it SUSPECT when it gossips again.
            self._suspect_self(now_ms)
        if now_ms - self._last_increment_ms >= interval_ms:
            self._last_increment_ms = now_ms
            for node, entry in self._entries.items():
                if node != self.node_id:
                    entry.heartbeat = min(entry.heartbeat + 1, HEARTBEAT_MAX)
        me = self._entries[self.node_id]
        me.heartbeat, me.instance_id, me.failover = 0, self.instance_id, self.failing_over
        self._detect_failures(now_ms)
        peers = [n for n in self._entries if n != self.node_id]
        if not peers:
            return []
        target = peers[min(int(self.rng.random() * len(peers)), len(peers) - 1)]
        return [Send(target, self._message(wall_ms))]

    def on_gossip(self, message: Gossip, now_ms: int, wall_ms: int) -> bool:
        """Merge a peer's view; False when the gossip was dropped (malformed, skewed, from an
        old instance of its sender, or from a node not in the configuration)."""
        skew_ms = self.config.gossip_time_skew_ms
        if not gossip_valid(message) or abs(wall_ms - message.sent_wall_ms) > skew_ms:
            return False
        sender = self._entries.get(message.sender)
        if sender is None or message.sender == self.node_id:
            return False
        if message.instance_id < sender.instance_id or message.instance_id > wall_ms + skew_ms:
            return False
        self.gossips_received += 1
        for node, heartbeat, instance_id, failover in zip(
            message.node_ids, message.heartbeats, message.instance_ids, message.failover,
            strict=True,
        ):
            entry = self._entries.get(node)
            if entry is None or instance_id == 0:
                continue
            if node == self.node_id:
                if 0 < instance_id < self.instance_id and self._self_suspect_until_ms is None:
                    # Peers knew an earlier instance of this node: it restarted, and they hold
                    # it SUSPECT for a while; so does it.
                    self._suspect_self(now_ms)
                continue
            if instance_id > entry.instance_id:
                entry.restarted = entry.instance_id != 0
                entry.heartbeat = min(heartbeat, HEARTBEAT_MAX)
                entry.instance_id, entry.failover = instance_id, failover
            elif instance_id == entry.instance_id:
                entry.heartbeat = min(entry.heartbeat, heartbeat)
                entry.failover = entry.failover or failover
        if self.stable(now_ms):
            self._detect_failures(now_ms)
        return True

    def begin_failover(self, wall_ms: int) -> list[Send]:
        """Graceful shutdown: tell every peer at once that this instance is going away, so
        they route around it now instead of after the threshold. Keep ticking afterwards for
        ``failover_duration_ms`` so that peers that missed this learn it by gossip."""
        self.failing_over = True
        self._entries[self.node_id].failover = True
        message = self._message(wall_ms)
        return [Send(n, message) for n in self._entries if n != self.node_id]

    # ---- internals -----------------------------------------------------------------------

    def _suspect_self(self, now_ms: int) -> None:
        self._self_suspect_until_ms = now_ms + self.config.suspect_duration_ms
        self._set_state(self._entries[self.node_id], NodeState.SUSPECT)

    def _message(self, wall_ms: int) -> Gossip:
        entries = self._entries
        return Gossip(
            sender=self.node_id, instance_id=self.instance_id, sent_wall_ms=wall_ms,
            node_ids=tuple(entries),
            heartbeats=tuple(e.heartbeat for e in entries.values()),
            instance_ids=tuple(e.instance_id for e in entries.values()),
            failover=tuple(e.failover for e in entries.values()),
        )

    def _set_state(self, entry: _Entry, state: NodeState) -> None:
        if entry.state is not state:
            entry.state = state
            self.version += 1

    def _detect_failures(self, now_ms: int) -> None:
        if not self.stable(now_ms):
            return
        threshold = self.config.gossip_threshold_intervals
        suspect_ms = self.config.suspect_duration_ms
        for node, entry in self._entries.items():
            if node == self.node_id:
                # A node never declares itself DEAD; it may hold itself SUSPECT.
                until = self._self_suspect_until_ms
                if until is not None and now_ms >= until:
                    self._set_state(entry, NodeState.ALIVE)
                continue
            if entry.heartbeat > threshold or entry.failover:
                self._set_state(entry, NodeState.DEAD)
                entry.restarted = False
                continue
            if entry.state is NodeState.DEAD or entry.restarted:
                entry.restarted = False
                entry.suspect_since_ms = now_ms
                self._set_state(entry, NodeState.SUSPECT)
            if entry.state is NodeState.SUSPECT and now_ms - entry.suspect_since_ms >= suspect_ms:
                self._set_state(entry, NodeState.ALIVE)
