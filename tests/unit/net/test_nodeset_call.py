"""``ask_nodeset``: answers of nodes that may have lost copies (``non_authoritative``) are
returned but do not count toward the f-majority; with every node's answer in, they do."""

from __future__ import annotations

import asyncio

from shared.net.nodeset_call import ask_nodeset
from shared.net.types import RequestCallback
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.codec import Message
from shared.wire.trim import FindTime, FoundTime

NODES = tuple(NodeId(f"n{i}") for i in range(1, 6))  # R=3: an f-majority is 3
ASK = FindTime(log_id=LogId(1), timestamp_ms=0)


class Answers:
    """Each node answers at once, or never (``None``: a stopped node)."""

    def __init__(self, replies: dict[NodeId, Message | Status | None]) -> None:
        self.replies = replies

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None:
        reply = self.replies[node]
        if reply is not None:
            asyncio.get_running_loop().call_soon(callback, reply)


def found(lsn: int, *, unsure: bool = False) -> FoundTime:
    return FoundTime(status=Status.OK, log_id=LogId(1), lsn=Lsn(lsn),
                     non_authoritative=((1, 2**64 - 1),) if unsure else ())


def ok(reply: Message | Status) -> bool:
    return type(reply) is FoundTime and reply.status is Status.OK


async def test_an_unsure_answer_needs_one_more_node() -> None:
    replies: dict[NodeId, Message | Status | None] = {
        NODES[0]: found(0, unsure=True), NODES[1]: found(9), NODES[2]: found(7),
        NODES[3]: Status.CONNFAILED, NODES[4]: Status.CONNFAILED}
    assert await ask_nodeset(Answers(replies), NODES, 3, ASK, ok, timeout_ms=100) is None
    replies[NODES[4]] = found(5)
    answers = await ask_nodeset(Answers(replies), NODES, 3, ASK, ok, timeout_ms=100,
                                grace_ms=0)
    assert answers is not None and sorted(a.lsn for a in answers  # type: ignore[union-attr]
                                          ) == [0, 5, 7, 9]


async def test_every_node_answering_is_enough_whatever_it_vouches_for() -> None:
    replies: dict[NodeId, Message | Status | None] = {
        node: found(3, unsure=index < 3) for index, node in enumerate(NODES)}
    answers = await ask_nodeset(Answers(replies), NODES, 3, ASK, ok, timeout_ms=100)
    assert answers is not None and len(answers) == 5
