"""The asyncio driver of the gossip failure detector, embedded in every node.

It ticks the pure core every ``gossip_interval_ms``, feeds it the GOSSIP messages the node's
transport receives, sends what the core asks for, and publishes the view (node -> ALIVE,
SUSPECT or DEAD) to subscribers whenever a state changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from gossip.core.failure_detector import FailureDetector, NodeState
from shared.clock import Clock
from shared.config import GossipConfig
from shared.effects import Send
from shared.ports import Rng
from shared.types import NodeId
from shared.wire.gossip import Gossip

log = logging.getLogger(__name__)

FAREWELL_TICKS = 2
"""Gossip rounds a gracefully stopping node sends after announcing it, before it closes."""

ViewListener = Callable[[dict[NodeId, NodeState]], None]


class GossipTransport(Protocol):
    def send(self, node: NodeId, message: Gossip) -> bool:
        """One-way, best effort."""
        ...


class GossipRuntime:
    def __init__(
        self,
        *,
        node_id: NodeId,
        nodes: tuple[NodeId, ...],
        config: GossipConfig,
        transport: GossipTransport,
        clock: Clock,
        rng: Rng,
    ) -> None:
        self.config = config
        self.transport = transport
        self.clock = clock
        self.core = FailureDetector(node_id=node_id, nodes=nodes, config=config, rng=rng,
                                    instance_id=max(clock.wall_ms(), 1), now_ms=clock.now_ms())
        self._listeners: list[ViewListener] = []
        self._published_version = -1
        self._task: asyncio.Task[None] | None = None
        self.gossips_dropped = 0
        self._ticks_count = 0
        self._ticked = asyncio.Event()
        self._failover_tick: int | None = None
        """The tick count when graceful shutdown began."""

    # ---- queries -------------------------------------------------------------------------

    def view(self) -> dict[NodeId, NodeState]:
        return self.core.view()

    def state(self, node: NodeId) -> NodeState | None:
        return self.core.state(node)

    def alive(self, node: NodeId) -> bool:
        return self.core.state(node) is NodeState.ALIVE

    def subscribe(self, listener: ViewListener) -> None:
        """``listener(view)`` now and after every state change."""
        self._listeners.append(listener)
        listener(self.core.view())

    def add_nodes(self, nodes: tuple[NodeId, ...]) -> None:
        """Members added to the configuration while running (see services.membership)."""
        for node in nodes:
            self.core.add_node(node)
        self._publish()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._tick_loop())

    def begin_failover(self) -> None:
        """Graceful shutdown has begun: peers are told at once, and gossip goes on for at most
        ``failover_duration_ms`` (while the node's roles drain) so that stragglers learn it."""
        if self.core.failing_over:
            return
        self._send(self.core.begin_failover(self.clock.wall_ms()))
        self._failover_tick = self._ticks_count
        loop = asyncio.get_running_loop()
        loop.call_later(self.config.failover_duration_ms / 1000, self._stop_ticking)

    async def farewell(self) -> None:
        """Before a graceful shutdown closes the transport: let ``FAREWELL_TICKS`` gossip rounds
        carry the announcement (a node with nothing to drain would otherwise close its
        connections before the first one was even written, and its peers would wait for the
        failure threshold instead). Bounded by ``failover_duration_ms``."""
        if self._failover_tick is None or self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.failover_duration_ms / 1000):
                while (self._ticks_count < self._failover_tick + FAREWELL_TICKS
                       and self._task is not None and not self._task.done()):
                    self._ticked.clear()
                    await self._ticked.wait()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _stop_ticking(self) -> None:
        if self._task is not None:
            self._task.cancel()

    # ---- inputs --------------------------------------------------------------------------

    def on_message(self, message: Gossip) -> None:
        if not self.core.on_gossip(message, self.clock.now_ms(), self.clock.wall_ms()):
            self.gossips_dropped += 1
        self._publish()

    async def _tick_loop(self) -> None:
        interval_s = self.config.gossip_interval_ms / 1000
        while True:
            try:
                self._send(self.core.on_tick(self.clock.now_ms(), self.clock.wall_ms()))
                self._publish()
                self._ticks_count += 1
                self._ticked.set()
            except Exception:
                # The detector must keep running: a dead tick loop would freeze the view.
                log.exception("gossip tick failed")
            await asyncio.sleep(interval_s)

    def _send(self, effects: list[Send]) -> None:
        for effect in effects:
            self.transport.send(effect.node, effect.message)

    def _publish(self) -> None:
        if self.core.version == self._published_version:
            return
        self._published_version = self.core.version
        view = self.core.view()
        log.info("gossip view of %s: %s", self.core.node_id,
                 ", ".join(f"{n}={s.value}" for n, s in sorted(view.items())))
        for listener in self._listeners:
            listener(view)
