"""A small deterministic simulation of the gossip failure detector: N pure cores on simulated
time, a network with per-link loss and delay, partitions, one-way (asymmetric) link cuts,
crashes and restarts (a restart is a new core with a new instance id)."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from gossip.core.failure_detector import FailureDetector, NodeState
from shared.config import GossipConfig
from shared.types import NodeId
from shared.wire.gossip import Gossip

WALL_EPOCH_MS = 1_700_000_000_000
"""Simulated wall clock = WALL_EPOCH_MS + simulated time, the same on every node."""


@dataclass(order=True)
class _Event:
    at_ms: int
    seq: int
    kind: str = field(compare=False)
    node: NodeId = field(compare=False)
    message: Gossip | None = field(compare=False, default=None)


class GossipSim:
    def __init__(self, nodes: int, config: GossipConfig, *, seed: int, loss: float = 0.0,
                 delay_ms_max: int = 5) -> None:
        self.ids = tuple(NodeId(f"n{i}") for i in range(nodes))
        self.config = config
        self.rng = random.Random(seed)
        self.loss = loss
        self.delay_ms_max = delay_ms_max
        self.now_ms = 0
        self.cores: dict[NodeId, FailureDetector] = {}
        self.up: set[NodeId] = set()
        self.cut: set[tuple[NodeId, NodeId]] = set()
        """Directed links (sender, receiver) that drop everything."""
        self._events: list[_Event] = []
        self._seq = 0
        for node in self.ids:
            self.start(node)

    # ---- faults --------------------------------------------------------------------------

    def start(self, node: NodeId) -> None:
        self.cores[node] = FailureDetector(
            node_id=node, nodes=self.ids, config=self.config, rng=random.Random(self.rng.random()),
            instance_id=WALL_EPOCH_MS + self.now_ms + 1, now_ms=self.now_ms)
        self.up.add(node)
        # Nodes do not tick in lockstep.
        self._push(self.now_ms + self.rng.randrange(self.config.gossip_interval_ms), "tick", node)

    def crash(self, node: NodeId) -> None:
        self.up.discard(node)

    def partition(self, *groups: set[NodeId]) -> None:
        for a in groups:
            for b in groups:
                if a is not b:
                    self.cut.update((x, y) for x in a for y in b)

    def cut_one_way(self, sender: NodeId, receiver: NodeId) -> None:
        self.cut.add((sender, receiver))

    def heal(self) -> None:
        self.cut.clear()

    # ---- running -------------------------------------------------------------------------

    def run_for(self, duration_ms: int) -> None:
        end_ms = self.now_ms + duration_ms
        while self._events and self._events[0].at_ms <= end_ms:
            event = heapq.heappop(self._events)
            self.now_ms = event.at_ms
            core = self.cores[event.node]
            if event.node not in self.up:
                continue
            wall_ms = WALL_EPOCH_MS + self.now_ms
            if event.kind == "tick":
                for send in core.on_tick(self.now_ms, wall_ms):
                    self._deliver(event.node, send.node, send.message)
                self._push(self.now_ms + self.config.gossip_interval_ms, "tick", event.node)
            else:
                assert event.message is not None
                core.on_gossip(event.message, self.now_ms, wall_ms)
        self.now_ms = end_ms

    def run_until(self, predicate: object, timeout_ms: int, step_ms: int = 10) -> int:
        """Simulated ms until ``predicate()`` holds; raises if it does not within timeout."""
        start_ms = self.now_ms
        while not predicate():  # type: ignore[operator]
            if self.now_ms - start_ms >= timeout_ms:
                raise AssertionError(f"not within {timeout_ms} simulated ms")
            self.run_for(step_ms)
        return self.now_ms - start_ms

    # ---- views ---------------------------------------------------------------------------

    def state_everywhere(self, node: NodeId, state: NodeState) -> bool:
        """Every running node other than ``node`` sees it in ``state``."""
        return all(self.cores[o].state(node) is state for o in self.up if o != node)

    def all_alive(self) -> bool:
        return all(self.cores[o].view() == dict.fromkeys(self.ids, NodeState.ALIVE)
                   for o in self.up)

    # ---- internals -----------------------------------------------------------------------

    def _deliver(self, sender: NodeId, receiver: NodeId, message: Gossip) -> None:
        if (sender, receiver) in self.cut or self.rng.random() < self.loss:
            return
        self._push(self.now_ms + 1 + self.rng.randrange(self.delay_ms_max), "gossip", receiver,
                   message)

    def _push(self, at_ms: int, kind: str, node: NodeId, message: Gossip | None = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Event(at_ms, self._seq, kind, node, message))
