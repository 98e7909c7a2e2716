"""Runs one ``ReadRound`` over a ``PeerPool``: READ to every node of the span, replies fed to
the round as they come, until the round decides (f-majority plus the speculative delay, a
moved release, or too few nodes left). Shared by the node's HTTP reads and the client reader.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Protocol

from shared.net.types import RequestCallback
from shared.read_round import ReadRound, RoundResult
from shared.status import Status
from shared.types import NodeId
from shared.wire.codec import Message


class RoundTransport(Protocol):
    """What a round needs of ``shared.net.PeerPool``."""

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None: ...


async def run_round(pool: RoundTransport, read_round: ReadRound,
                    timeout_ms: int) -> RoundResult:
    """The round's result. Every request ends within ``timeout_ms`` plus the READ's wait, so
    this returns within that bound too (after the last node was asked)."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def now_ms() -> int:
        return int(loop.time() * 1000)

    def answer(node: NodeId) -> RequestCallback:
        def done(reply: Message | Status) -> None:
            read_round.on_reply(node, reply, now_ms())
            changed.set()
        return done

    while True:
        for node in read_round.to_ask(now_ms()):
            pool.request(node, read_round.request, answer(node),
                         timeout_ms=timeout_ms + read_round.request.wait_ms)
        result = read_round.result(now_ms())
        if result is not None:
            return result
        changed.clear()
        wake = read_round.wake_ms()
        delay_s = None if wake is None else max(wake - now_ms(), 0) / 1000
        with suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), delay_s)
