"""The simulated node-to-node transport, with the failure semantics of ``shared.net.PeerPool``.

A request gets at most one callback: the reply, or ``Status.CONNFAILED`` when the peer is down
(after ``connfail_delay_ms``), crashes while the request is pending, or (sometimes) sits behind
a partition. A message may also be lost without a word (then only the sender's own timeout
helps), delayed, duplicated, or, with ``reorder``, overtake earlier ones on its link; without
``reorder`` each link is FIFO like a TCP connection. A crash bumps the node's incarnation:
messages addressed to the old incarnation, and replies to a crashed sender, are dropped.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.status import Status
from shared.types import NodeId
from shared.wire.recovery import Clean, Cleaned
from tests.simulation.sim_clock import EventQueue
from tests.simulation.sim_options import SimOptions
from tests.simulation.sim_trace import Trace

ReplyFn = Callable[[Any], None]
Handler = Callable[[NodeId, Any, ReplyFn | None], None]
"""A node's inbox: (sender, message, reply function or None for a one-way message)."""
RequestCallback = Callable[[Any], None]
"""Gets the reply message, or the ``Status`` that ended the request."""

REQUESTS_PENDING_MAX = 1_000_000
"""Requests without an answer yet (lost ones stay until their peer crashes); more means a
runaway retry loop."""


@dataclass(slots=True)
class _Endpoint:
    handler: Handler
    up: bool = True
    incarnation: int = 0


@dataclass(slots=True)
class _Request:
    src: NodeId
    src_incarnation: int
    dst: NodeId
    dst_incarnation: int
    callback: RequestCallback
    done: bool = False


@dataclass(frozen=True, slots=True)
class Partition:
    side_a: frozenset[NodeId]
    side_b: frozenset[NodeId]
    until_ms: int

    def cuts(self, a: NodeId, b: NodeId) -> bool:
        return (a in self.side_a and b in self.side_b) or (b in self.side_a and a in self.side_b)


class SimNetwork:
    def __init__(self, queue: EventQueue, rng: random.Random, options: SimOptions,
                 trace: Trace) -> None:
        self._queue = queue
        self._rng = rng
        self._trace = trace
        self.loss_ratio = options.loss_ratio
        self.duplicate_ratio = options.duplicate_ratio
        self.reorder = options.reorder
        self.delay_ms_min = options.delay_ms_min
        self.delay_ms_max = options.delay_ms_max
        self.connfail_delay_ms = options.connfail_delay_ms
        self.partition_connfail_ratio = options.partition_connfail_ratio
        self._nodes: dict[NodeId, _Endpoint] = {}
        self._pending: dict[int, _Request] = {}
        self._next_request_id = 1
        self._link_last_ms: dict[tuple[NodeId, NodeId], int] = {}
        self.partitions: list[Partition] = []
        self.loss_ratio_of: dict[type, float] = (
            {Clean: options.clean_loss_ratio, Cleaned: options.clean_loss_ratio}
            if options.clean_loss_ratio else {})
        """Message types lost at their own odds (on top of ``loss_ratio``)."""
        self.stalled_until_ms: dict[NodeId, int] = {}
        """Nodes that handle and send nothing until then (their connections stay up)."""
        self._held: dict[NodeId, list[Callable[[], None]]] = {}
        """Deliveries to or from a stalled node, in order, until it resumes."""
        self.messages_sent_count = 0
        self.messages_lost_count = 0
        self.lost_by_type: Counter[str] = Counter()
        """Messages lost at their type's own odds (``loss_ratio_of``)."""

    # ---- membership and faults ----------------------------------------------------------

    def add_node(self, node: NodeId, handler: Handler) -> None:
        assert node not in self._nodes, node
        self._nodes[node] = _Endpoint(handler)

    def is_up(self, node: NodeId) -> bool:
        return self._nodes[node].up

    def incarnation(self, node: NodeId) -> int:
        return self._nodes[node].incarnation

    def crash(self, node: NodeId) -> None:
        """The node's connections break: what it had pending is dropped, requests waiting on
        it fail with CONNFAILED, and nothing sent to this incarnation is ever delivered."""
        endpoint = self._nodes[node]
        endpoint.up = False
        endpoint.incarnation += 1
        for request_id, request in list(self._pending.items()):
            if request.src == node:
                request.done = True
                del self._pending[request_id]
            elif request.dst == node and not request.done:
                self._fail_later(request_id, Status.CONNFAILED)

    def restart(self, node: NodeId) -> None:
        self._nodes[node].up = True

    def partition(self, side_a: frozenset[NodeId], side_b: frozenset[NodeId],
                  until_ms: int) -> None:
        self.partitions.append(Partition(side_a, side_b, until_ms))

    def cut(self, a: NodeId, b: NodeId) -> bool:
        now_ms = self._queue.clock.now_ms()
        if self.partitions and self.partitions[0].until_ms <= now_ms:
            self.partitions = [p for p in self.partitions if p.until_ms > now_ms]
        return any(p.cuts(a, b) for p in self.partitions)

    def stall(self, node: NodeId, until_ms: int) -> None:
        """``node`` neither handles nor sends anything before ``until_ms``; what reaches it
        meanwhile waits, in order, as in its socket buffers."""
        until_ms = max(until_ms, self.stalled_until_ms.get(node, 0))
        self.stalled_until_ms[node] = until_ms
        self._queue.at(until_ms, lambda: self._resume(node, until_ms))

    def _hold_if_stalled(self, node: NodeId, deliver: Callable[[], None]) -> bool:
        """A message reaching a stalled node waits until it resumes (True)."""
        if node not in self.stalled_until_ms:
            return False
        self._held.setdefault(node, []).append(deliver)
        return True

    def _resume(self, node: NodeId, until_ms: int | None = None) -> None:
        if until_ms is not None and self.stalled_until_ms.get(node) != until_ms:
            return  # stalled again for longer, or healed
        self.stalled_until_ms.pop(node, None)
        at_ms = self._queue.clock.now_ms() + 1
        for deliver in self._held.pop(node, []):
            self._queue.at(at_ms, deliver)

    def stalled(self, node: NodeId, now_ms: int) -> bool:
        return self.stalled_until_ms.get(node, 0) > now_ms

    def heal(self) -> None:
        """No more loss, duplication, stalls or partitions (delays and reordering stay)."""
        self.partitions = []
        self.loss_ratio = 0.0
        self.duplicate_ratio = 0.0
        self.loss_ratio_of = {}
        for node in list(self.stalled_until_ms):
            self._resume(node)

    # ---- messages -----------------------------------------------------------------------

    def send(self, src: NodeId, dst: NodeId, message: Any) -> None:
        """One-way; silently dropped if the peer is down or cut off."""
        if not self._nodes[dst].up or self.cut(src, dst):
            return
        dst_incarnation = self._nodes[dst].incarnation

        def deliver() -> None:
            if self._hold_if_stalled(dst, deliver):
                return
            endpoint = self._nodes[dst]
            if endpoint.up and endpoint.incarnation == dst_incarnation and not self.cut(src, dst):
                endpoint.handler(src, message, None)

        self._transmit(src, dst, deliver, message)

    def request(self, src: NodeId, dst: NodeId, message: Any,
                callback: RequestCallback, *, timeout_ms: int | None = None) -> None:
        """``timeout_ms``: the request fails with TIMEDOUT if no reply came by then, as
        ``PeerPool.request`` does with one."""
        request_id = self._next_request_id
        self._next_request_id += 1
        target = self._nodes[dst]
        request = _Request(src, self._nodes[src].incarnation, dst, target.incarnation, callback)
        assert len(self._pending) < REQUESTS_PENDING_MAX, "runaway requests"
        self._pending[request_id] = request
        if timeout_ms is not None:
            self._fail_later(request_id, Status.TIMEDOUT, timeout_ms)
        if not target.up:
            self._fail_later(request_id, Status.CONNFAILED)
            return
        if self.cut(src, dst):
            if self._rng.random() < self.partition_connfail_ratio:
                self._fail_later(request_id, Status.CONNFAILED)
            return  # otherwise it hangs, as on a half-open connection

        def deliver() -> None:
            if self._hold_if_stalled(dst, deliver):
                return
            endpoint = self._nodes[dst]
            if (not endpoint.up or endpoint.incarnation != request.dst_incarnation
                    or self.cut(src, dst)):
                return
            endpoint.handler(src, message, lambda reply: self._reply(request_id, reply))

        self._transmit(src, dst, deliver, message)

    def _reply(self, request_id: int, reply: Any) -> None:
        request = self._pending.get(request_id)
        if request is None or request.done:
            return
        responder = self._nodes[request.dst]
        if not responder.up or responder.incarnation != request.dst_incarnation:
            return

        def deliver() -> None:
            if request.done or self.cut(request.src, request.dst):
                return
            if self._nodes[request.src].incarnation != request.src_incarnation:
                return
            request.done = True
            self._pending.pop(request_id, None)
            request.callback(reply)

        self._transmit(request.dst, request.src, deliver, reply)

    def _fail_later(self, request_id: int, status: Status, after_ms: int | None = None) -> None:
        def fail() -> None:
            request = self._pending.pop(request_id, None)
            if request is None or request.done:
                return
            request.done = True
            if self._nodes[request.src].incarnation == request.src_incarnation:
                request.callback(status)

        self._queue.after(self.connfail_delay_ms if after_ms is None else after_ms, fail)

    def _transmit(self, src: NodeId, dst: NodeId, deliver: Callable[[], None],
                  message: Any) -> None:
        self.messages_sent_count += 1
        rng = self._rng
        if self.loss_ratio and rng.random() < self.loss_ratio:
            self.messages_lost_count += 1
            return
        if self.loss_ratio_of:
            ratio = self.loss_ratio_of.get(type(message))
            if ratio and rng.random() < ratio:
                self.messages_lost_count += 1
                self.lost_by_type[type(message).__name__] += 1
                self._trace.log(self._queue.clock.now_ms(),
                                f"lost {type(message).__name__} {src}->{dst}")
                return
        now_ms = self._queue.clock.now_ms()
        at_ms = now_ms + rng.randint(self.delay_ms_min, self.delay_ms_max)
        if src in self.stalled_until_ms:
            # A stalled sender sends once it resumes (a stalled receiver reads then: the
            # delivery waits, ``_hold_if_stalled``).
            self._held.setdefault(src, []).append(deliver)
            return
        if not self.reorder:
            link = (src, dst)
            at_ms = max(at_ms, self._link_last_ms.get(link, 0))
            self._link_last_ms[link] = at_ms
        self._queue.at(at_ms, deliver)
        if self.duplicate_ratio and rng.random() < self.duplicate_ratio:
            self._queue.at(at_ms + rng.randint(0, self.delay_ms_max), deliver)
