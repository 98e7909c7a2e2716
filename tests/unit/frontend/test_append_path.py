"""The front end's append path (``FrontEnd.append_nowait``, ``on_append_message``): callbacks
instead of Tasks, the local sequencer's callback entry, forwarding over ``PeerPool.request``,
``no_forward`` redirects naming the owner's HTTP and data addresses, and the one set of
append checks for binary clients and forwarded appends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from epoch_store.backends.memory import MemoryEpochStore
from frontend.outcomes import AppendOutcome
from frontend.service import FrontEnd
from shared.config import ClusterConfig, NodeConfig, ProcessConfig, TransportConfig
from shared.net import PeerPool, ReplyFn, Server, start_server
from shared.routing import sequencer_for
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import Message

SEQ1, SEQ2 = NodeId("seq1"), NodeId("seq2")


@dataclass
class Result:
    status: Status
    first_lsn: Lsn
    last_lsn: Lsn
    timestamp_ms: int
    message: str


@dataclass
class FakeSequencer:
    """Answers every append with the next LSN, from a later loop iteration."""

    calls: list[tuple[LogId, tuple[bytes, ...]]] = field(default_factory=list)

    def append_nowait(self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
                      producer: tuple[str, int] | None, done: Callable[[Any], None], *,
                      compression: int = 0, records: int = 0) -> None:
        self.calls.append((log_id, payloads))
        lsn = Lsn(len(self.calls))
        asyncio.get_running_loop().call_soon(done, Result(Status.OK, lsn, lsn, 5, ""))

    async def append(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the front end must use append_nowait")

    def is_active(self, log_id: LogId) -> bool:
        return False

    def release_lsn(self, log_id: LogId) -> Lsn:
        return Lsn(0)

    def epoch(self, log_id: LogId) -> Epoch:
        return Epoch(0)

    async def wait_release_above(self, log_id: LogId, lsn: Lsn, timeout_s: float) -> None:
        return None


@dataclass
class Seq2:
    """seq2's data port: answers forwarded APPENDs."""

    received: list[Append] = field(default_factory=list)

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        assert isinstance(message, Append)
        self.received.append(message)
        reply(Appended(status=Status.OK, log_id=message.log_id, first_lsn=Lsn(77),
                       last_lsn=Lsn(77), timestamp_ms=1, sequencer_node=SEQ2, message=""))


@dataclass
class Node:
    front: FrontEnd
    sequencer: FakeSequencer
    seq2: Seq2
    server: Server


def log_owned_by(owner: NodeId) -> LogId:
    return next(LogId(i) for i in range(1, 1000)
                if sequencer_for(LogId(i), [(SEQ1, 1.0), (SEQ2, 1.0)]) == owner)


@pytest.fixture
async def node(tmp_path: Any) -> AsyncIterator[Node]:
    seq2 = Seq2()
    server = await start_server("127.0.0.1", 0, node_id=SEQ2, cluster_fingerprint="fp",
                                handler=seq2, config=TransportConfig())
    cluster = ClusterConfig(cluster_name="c", replication_factor=1, nodes=(
        NodeConfig(node_id=SEQ1, roles=("sequencer",), http_port=9000, data_port=9001),
        NodeConfig(node_id=SEQ2, roles=("sequencer",), http_port=9002, data_port=server.port),
        NodeConfig(node_id=NodeId("st1"), roles=("storage",), http_port=9004, data_port=9005)))
    config = ProcessConfig(node_id=SEQ1, cluster=cluster, data_dir=str(tmp_path))
    pool = PeerPool(node_id=SEQ1, cluster_fingerprint="fp", config=TransportConfig(),
                    addresses=lambda n: ("127.0.0.1", server.port) if n == SEQ2 else None)
    sequencer = FakeSequencer()
    front = FrontEnd(config=config, pool=pool, sequencer=sequencer,
                     epoch_store=MemoryEpochStore())
    yield Node(front, sequencer, seq2, server)
    await pool.close()
    await server.close()


async def outcome_of(start: Callable[[Callable[[AppendOutcome], None]], None]
                     ) -> AppendOutcome:
    future: asyncio.Future[AppendOutcome] = asyncio.get_running_loop().create_future()
    start(future.set_result)
    async with asyncio.timeout(5):
        return await future


async def test_an_owned_log_runs_on_the_local_sequencer_without_a_task(node: Node) -> None:
    log = log_owned_by(SEQ1)
    tasks = len(asyncio.all_tasks())
    future: asyncio.Future[AppendOutcome] = asyncio.get_running_loop().create_future()
    node.front.append_nowait(log, (b"a",), None, done=future.set_result)
    assert len(asyncio.all_tasks()) == tasks
    outcome = await future
    assert (outcome.status, outcome.first_lsn, outcome.sequencer_node) == (Status.OK, 1, SEQ1)
    assert node.sequencer.calls == [(log, (b"a",))]


async def test_local_done_gets_the_local_sequencers_answer_as_it_is(node: Node) -> None:
    """The HTTP edge's hot path: no ``AppendOutcome`` per append; ``done`` is for the rest."""
    answer: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    outcomes: list[AppendOutcome] = []
    node.front.append_nowait(log_owned_by(SEQ1), (b"a",), None, no_forward=True,
                             done=outcomes.append, local_done=answer.set_result)
    other = await outcome_of(lambda done: node.front.append_nowait(
        log_owned_by(SEQ2), (b"b",), None, no_forward=True, done=done,
        local_done=answer.set_result))
    async with asyncio.timeout(5):
        local = await answer
    assert type(local) is Result and (local.status, local.first_lsn) == (Status.OK, 1)
    assert outcomes == []
    assert other.status is Status.NOSEQUENCER and other.sequencer_node == SEQ2


async def test_no_forward_names_the_owners_http_and_data_addresses(node: Node) -> None:
    log = log_owned_by(SEQ2)
    outcome = await outcome_of(lambda done: node.front.append_nowait(
        log, (b"a",), None, no_forward=True, done=done))
    assert outcome.status is Status.NOSEQUENCER and outcome.sequencer_node == SEQ2
    assert outcome.redirect_http == "127.0.0.1:9002"
    assert outcome.redirect_data == f"127.0.0.1:{node.server.port}"
    assert node.sequencer.calls == [] and node.seq2.received == []  # nothing written


async def test_other_logs_are_forwarded_with_one_more_hop(node: Node) -> None:
    log = log_owned_by(SEQ2)
    outcome = await outcome_of(lambda done: node.front.append_nowait(
        log, (b"a",), "k", producer=("p", 3), done=done))
    assert (outcome.status, outcome.first_lsn, outcome.sequencer_node) == (Status.OK, 77, SEQ2)
    [sent] = node.seq2.received
    assert (sent.hops, sent.key, sent.producer_id, sent.producer_seq) == (1, "k", "p", 3)


async def test_client_appends_are_checked_and_redirected_like_http_ones(node: Node) -> None:
    answers: list[Message] = []
    bad = [Append(log_id=LogId(0), payloads=(b"a",), key=None, hops=0),
           Append(log_id=LogId(1), payloads=(), key=None, hops=0),
           Append(log_id=LogId(1), payloads=(b"a",), key="k" * 5000, hops=0),
           Append(log_id=LogId(1), payloads=(b"a",), key=None, hops=0, producer_id="")]
    for message in bad:
        node.front.on_append_message(message, answers.append)
    assert [a.status for a in answers] == [Status.INVALID_PARAM] * 4  # type: ignore[union-attr]
    redirected: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    node.front.on_append_message(Append(log_id=log_owned_by(SEQ2), payloads=(b"a",), key=None,
                                        hops=0, no_forward=True), redirected.set_result)
    answer = await redirected
    assert isinstance(answer, Appended) and answer.status is Status.NOSEQUENCER
    assert answer.redirect_data == f"127.0.0.1:{node.server.port}"
    assert node.sequencer.calls == [] and node.seq2.received == []
