"""Send one request to every storage node of a nodeset and collect the OK answers once an
f-majority has them: the pattern of every question whose answer must include at least one
copy of each record (trim, find-time, producer lookups).

It returns as soon as an f-majority answered OK and either every node answered or
``grace_ms`` passed since: a slow or paused node delays it by at most that, not by the request
timeout. ``None`` when an f-majority can no longer answer OK.

An answer that carries ``non_authoritative`` ranges (``shared.authority``: the node may have
lost copies) is returned but does not count toward the f-majority: its "I have nothing" is no
evidence. Once every node answered OK, the answers are returned whatever they vouch for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import suppress

from shared.net.read_driver import RoundTransport
from shared.read_merge import f_majority
from shared.status import Status
from shared.types import NodeId
from shared.wire.codec import Message

STORAGE_CALL_TIMEOUT_MS = 2_000
"""Bound of one request to a storage node from a node serving a client or a sequencer."""
ANSWER_GRACE_MS = 50
"""Once an f-majority answered, how long the other nodes may still add their answers."""


async def ask_nodeset(transport: RoundTransport, nodeset: tuple[NodeId, ...], replication: int,
                      message: Message, ok: Callable[[Message | Status], bool], *,
                      timeout_ms: int, grace_ms: int = ANSWER_GRACE_MS) -> list[Message] | None:
    """The answers ``ok`` accepts, once an f-majority of ``nodeset`` gave one; else None."""
    answers = await ask_nodeset_by_node(
        transport, nodeset, message, ok, needed=f_majority(len(nodeset), replication),
        timeout_ms=timeout_ms, grace_ms=grace_ms)
    return None if answers is None else list(answers.values())


async def ask_nodeset_by_node(transport: RoundTransport, nodeset: tuple[NodeId, ...],
                              message: Message, ok: Callable[[Message | Status], bool], *,
                              needed: int, timeout_ms: int,
                              grace_ms: int = ANSWER_GRACE_MS) -> dict[NodeId, Message] | None:
    """``ask_nodeset`` with the number of answers needed given, and each node's answer."""
    answers: dict[NodeId, Message] = {}
    failed = 0
    vouching = 0
    changed = asyncio.Event()

    def answer_of(node: NodeId) -> Callable[[Message | Status], None]:
        def done(reply: Message | Status) -> None:
            nonlocal failed, vouching
            if ok(reply):
                assert not isinstance(reply, Status)
                answers[node] = reply
                vouching += not getattr(reply, "non_authoritative", ())
            else:
                failed += 1
            changed.set()
        return done

    for node in nodeset:
        transport.request(node, message, answer_of(node), timeout_ms=timeout_ms)
    loop = asyncio.get_running_loop()
    grace_end_s: float | None = None
    while len(answers) + failed < len(nodeset):
        if failed and vouching + len(nodeset) - failed - len(answers) < needed:
            return None  # neither an authoritative f-majority nor every node can answer
        if grace_end_s is None and vouching >= needed:
            grace_end_s = loop.time() + grace_ms / 1000
        timeout_s = None if grace_end_s is None else grace_end_s - loop.time()
        if timeout_s is not None and timeout_s <= 0:
            break
        changed.clear()
        with suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)
    return (dict(answers) if vouching >= needed or len(answers) == len(nodeset) else None)
