"""Epoch recovery's core driven against real storage nodes (``StorageNode`` on real record
stores, messages through ``on_message``), with the faults of issue 16 item 1: an abandoned
attempt leaves a copy on a node outside the final recovery set, and the CLEAN to that node is
lost. Whatever f-majority a reader reaches, it must read the same thing at every LSN."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sequencer.core.effects import RecoveryProgress, WriteLastCleanEpoch
from sequencer.core.recovery import LogRecovery, Phase
from shared.config import SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch
from shared.read_merge import Merged, NodeAnswer, merge
from shared.status import Status
from shared.types import Epoch, Esn, Lsn, NodeId
from shared.wire.recovery import Clean
from shared.wire.store import Store
from storage_node.runtime import StorageNode
from tests.unit.storage_node.helpers import (
    LOG,
    lsn,
    make_read,
    make_store,
    read,
    request,
    running_node,
    store,
)

A, B, C, D, E = (NodeId(n) for n in "ABCDE")
NODESET = (A, B, C, D, E)
SEQ2 = NodeId("seq2")
RELEASE = lsn(2, 0)
Reachable = Callable[[LogRecovery, NodeId, Any], bool]


@contextlib.asynccontextmanager
async def five_nodes(root: Path) -> AsyncIterator[dict[NodeId, StorageNode]]:
    async with contextlib.AsyncExitStack() as stack:
        nodes = {n: await stack.enter_async_context(running_node(str(root / n), node_id=n))
                 for n in NODESET}
        yield nodes


async def write_epoch_1(nodes: dict[NodeId, StorageNode]) -> None:
    """e1n1 acknowledged on A, B, C; e1n2 (last known good 1) reached only A."""
    for node in (A, B, C):
        assert (await store(nodes[node], make_store(lsn(1, 1), (b"r1",)))).status is Status.OK
    second = dataclasses.replace(make_store(lsn(1, 2), (b"r2",)), last_known_good=Esn(1))
    assert (await store(nodes[A], second)).status is Status.OK


async def run_recovery(nodes: dict[NodeId, StorageNode], reachable: Reachable,
                       config: SequencerConfig) -> tuple[LogRecovery, list[Send]]:
    """Drive the recovery of epoch 1 (sealed by the sequencer of epoch 2) to its end, on a
    simulated clock; a message to a node ``reachable`` refuses fails with CONNFAILED (a
    request) or is lost (a CLEAN not waited for). Returns the recovery and the lost sends."""
    recovery = LogRecovery(log_id=LOG, node_id=SEQ2, seal_epoch=Epoch(1),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0),
                                              version=0),
                           nodeset=NODESET, replication=3, config=config)
    now_ms = 0
    lost: list[Send] = []
    queue: list[Any] = recovery.start(now_ms)
    while not recovery.finished:
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, RecoveryProgress):
                continue
            if isinstance(effect, WriteLastCleanEpoch):
                queue.extend(recovery.on_lce_written(Status.OK, Epoch(0), now_ms))
                continue
            assert isinstance(effect, Send)
            if not reachable(recovery, effect.node, effect.message):
                lost.append(effect)
                reply: Any = Status.CONNFAILED
            else:
                reply = await request(nodes[effect.node], effect.message)
            queue.extend(recovery.on_reply(effect.node, effect.message, reply, now_ms))
        due_ms = recovery.deadline_ms()
        if due_ms is None:
            break
        assert due_ms < 10 * config.recovery_timeout_ms, "recovery does not end"
        now_ms = max(now_ms, due_ms)
        queue.extend(recovery.on_timer(now_ms))
    return recovery, lost


def issue_16_faults(recovery: LogRecovery, node: NodeId, message: Any) -> bool:
    """Attempt 1 reaches A, B, D, but its STOREs reach only A (so it stalls: the recovery set
    is exactly the f-majority it needs); attempt 2 reaches B, C, E only."""
    if recovery.attempt == 1:
        return node == A if isinstance(message, Store) else node in (A, B, D)
    return node in (B, C, E)


async def read_through(nodes: dict[NodeId, StorageNode], members: tuple[NodeId, ...]) -> Merged:
    answers = []
    for node in members:
        reply = await read(nodes[node], make_read(lsn(1, 1), release_lsn=RELEASE))
        assert reply.status is Status.OK
        answers.append(NodeAnswer(records=reply.records, next_lsn=reply.next_lsn,
                                  release_lsn=reply.release_lsn, markers=reply.markers,
                                  trim_lsn=reply.trim_lsn))
    return merge(answers, lsn(1, 1), RELEASE, 100, 1 << 20)


def view(merged: Merged) -> list[tuple[str, int]]:
    return sorted([("record", r[0]) for r in merged.records]
                  + [(g.kind, g.lo) for g in merged.gaps], key=lambda item: item[1])


async def test_a_purge_never_demotes_the_decision_below_an_abandoned_attempt(
        tmp_path: Path) -> None:
    """Issue 16 item 1, nodeset A..E, R=3: attempt 1 re-replicates e1n2 to A only and stalls;
    attempt 2 (B, C, E) bridges at e1n2; the CLEAN to A is lost. A keeps attempt 1's copy of
    e1n2. The purge of B, C and E must not rewrite their bridge below attempt 2, or a reader
    through {A, B, D} reads a record at e1n2 where one through {B, C, E} reads a BRIDGE."""
    config = SequencerConfig(recovery_timeout_ms=5_000)
    async with five_nodes(tmp_path) as nodes:
        await write_epoch_1(nodes)
        recovery, lost = await run_recovery(nodes, issue_16_faults, config)
        assert recovery.phase is Phase.DONE and recovery.attempt == 2
        outcome = recovery.outcomes[Epoch(1)]
        assert (outcome.bridge_esn, outcome.holes) == (2, [])
        assert any(s.node == A and isinstance(s.message, Clean) for s in lost)
        # A still holds attempt 1's copy of e1n2 (it missed attempt 2 and its CLEAN).
        a_view = view(await read_through(nodes, (A,)))
        assert ("record", lsn(1, 2)) in a_view
        first, second = (await read_through(nodes, (A, B, D)),
                         await read_through(nodes, (B, C, E)))
        assert view(first) == view(second) == [("record", lsn(1, 1)), ("BRIDGE", lsn(1, 2))]
