"""Epoch recovery's core driven against real storage nodes (``StorageNode`` on real record
stores, messages through ``on_message``), with the faults of issue 16 item 1: an abandoned
attempt leaves a copy on a node outside the final recovery set, and the CLEAN to that node is
lost. Whatever f-majority a reader reaches, it must read the same thing at every LSN."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sequencer.core.effects import RecoveryProgress, WriteLastCleanEpoch
from sequencer.core.recovery import LogRecovery, Phase
from sequencer.core.sequencer import Sequencer
from shared.config import SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.read_merge import Merged, NodeAnswer, merge
from shared.status import Status
from shared.types import Epoch, Esn, Lsn, NodeId
from shared.wire.read import GetLogState, LogState
from shared.wire.recovery import Clean
from shared.wire.release import Release
from shared.wire.store import Store, Stored
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
    wait_until,
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


async def run_sequencer(nodes: dict[NodeId, StorageNode], sequencer: Sequencer,
                        effects: list[Any], until: Callable[[], bool],
                        sent: list[Any] | None = None) -> None:
    """Carry out a sequencer core's effects against the nodes (everything reachable), on a
    simulated clock, until ``until()`` holds; ``sent`` collects the messages sent."""
    now_ms = 0
    queue = list(effects)
    for _ in range(10_000):
        while queue:
            effect = queue.pop(0)
            if sent is not None and isinstance(effect, Send):
                sent.append(effect)
            if isinstance(effect, WriteLastCleanEpoch):
                queue.extend(sequencer.on_lce_written(Status.OK, Epoch(0), now_ms))
            elif isinstance(effect, Send) and isinstance(effect.message, Release):
                nodes[effect.node].on_message(SEQ2, effect.message, lambda _: None)  # one-way
            elif isinstance(effect, Send):
                reply = await request(nodes[effect.node], effect.message)
                message = effect.message
                if isinstance(message, Store) and not message.flags:
                    assert isinstance(reply, Stored)
                    queue.extend(sequencer.on_stored(effect.node, reply.lsn, reply.wave,
                                                     reply.status, reply.sealed_epoch,
                                                     reply.sealed_by, now_ms))
                else:
                    queue.extend(sequencer.on_recovery_reply(effect.node, message, reply,
                                                             now_ms))
        if until():
            return
        due_ms = sequencer.deadline_ms()
        assert due_ms is not None, "the sequencer waits for nothing, yet is not done"
        now_ms = max(now_ms, due_ms)
        queue.extend(sequencer.on_timer(now_ms))
    raise AssertionError("the sequencer never got there")


async def unsettled(node: StorageNode) -> list[int]:
    state = await request(node, GetLogState(log_id=LOG))
    assert isinstance(state, LogState)
    return [epoch for epoch, _, _ in state.unclean]


async def test_a_node_that_missed_its_clean_purges_after_the_sequencer_died(
        tmp_path: Path) -> None:
    """Issue 16 item 6: the sequencer of epoch 2 recovers epoch 1 (the faults above: A misses
    attempt 2 and its CLEAN) and dies before it could re-send the CLEAN. A restarts, still
    holding attempt 1's copy of e1n2 and reporting epoch 1 unsettled. The sequencer of epoch
    3 recovers epoch 2, then purges: it derives epoch 1's outcome from the others and CLEANs
    A. A's stray is gone for good (a restart keeps it settled), and every f-majority of the
    nodeset reads the same log."""
    config = SequencerConfig(recovery_timeout_ms=5_000)
    async with contextlib.AsyncExitStack() as exits:
        nodes = {n: await exits.enter_async_context(running_node(str(tmp_path / n),
                                                                 node_id=n))
                 for n in NODESET}
        await write_epoch_1(nodes)
        recovery, _ = await run_recovery(nodes, issue_16_faults, config)
        assert recovery.phase is Phase.DONE  # ...and its sequencer dies: nothing re-sent
        # A restarts: what it knows about epoch 1 is on its disk.
        await nodes[A].close()
        nodes[A] = await exits.enter_async_context(running_node(str(tmp_path / A),
                                                                node_id=A))
        assert await unsettled(nodes[A]) == [1]
        assert ("record", lsn(1, 2)) in view(await read_through(nodes, (A,)))

        third = Sequencer(log_id=LOG, node_id=NodeId("seq3"), config=config,
                          rng=random.Random(1))
        effects = third.on_append(1, (b"e3",), None, 0, 0)
        effects += third.on_activated(
            Status.OK, Epoch(3),
            LogMetadata(log_id=LOG, next_epoch=Epoch(4), nodeset=NODESET,
                        replication_factor=3, last_writer=NodeId("seq3"), version=3),
            LastCleanEpoch(log_id=LOG, epoch=Epoch(1), tail_lsn=lsn(1, 1), version=2), 0)
        await run_sequencer(nodes, third, effects,
                            lambda: third.releasable and third.purge is None)
        assert third.release_lsn >= lsn(3, 1)
        for node in NODESET:
            assert await unsettled(nodes[node]) in ([], [3]), node
        assert view(await read_through(nodes, (A,))) == [
            ("record", lsn(1, 1)), ("BRIDGE", lsn(1, 2))]
        await nodes[A].close()
        nodes[A] = await exits.enter_async_context(running_node(str(tmp_path / A),
                                                                node_id=A))
        assert await unsettled(nodes[A]) in ([], [3])
        views = {members: view(await read_through(nodes, members))
                 for members in itertools.combinations(NODESET, 3)}
        assert set(map(tuple, views.values())) == {
            (("record", lsn(1, 1)), ("BRIDGE", lsn(1, 2)))}, views


async def test_an_epoch_drained_by_its_sequencer_leaves_the_next_one_nothing_to_purge(
        tmp_path: Path) -> None:
    """The last RELEASE of a drained epoch settles it on every node (``drained_epoch``): the
    next sequencer's purge only asks, it digests and CLEANs nothing."""
    config = SequencerConfig(release_delay_ms=0)
    metadata = LogMetadata(log_id=LOG, next_epoch=Epoch(2), nodeset=NODESET,
                           replication_factor=3, last_writer=SEQ2, version=1)
    async with five_nodes(tmp_path) as nodes:
        first = Sequencer(log_id=LOG, node_id=SEQ2, config=config, rng=random.Random(2))
        effects = first.on_append(1, (b"a",), None, 0, 0)
        effects += first.on_activated(
            Status.OK, Epoch(1), metadata,
            LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0), version=0), 0)
        for request_id in range(2, 6):
            effects += first.on_append(request_id, (b"x%d" % request_id,), None, 0, 0)
        await run_sequencer(nodes, first, effects, lambda: not first.appenders)
        tail = first.drained_clean_tail()
        assert tail == lsn(1, 5)
        unsettled_before = {n: await unsettled(nodes[n]) for n in NODESET}
        assert any(epochs == [1] for epochs in unsettled_before.values())
        await run_sequencer(nodes, first, first.release_broadcast(final=True), lambda: True)

        def all_settled() -> bool:
            states = [nodes[node].log_state(LOG) for node in NODESET]
            return all(max(lng, state.settled.get(epoch, 0)) >= last for state in states
                       for epoch, (lng, last) in state.epoch_tails.items())

        await wait_until(all_settled)
        sent: list[Any] = []
        second = Sequencer(log_id=LOG, node_id=NodeId("seq3"), config=config,
                           rng=random.Random(3))
        effects = second.on_append(1, (b"b",), None, 0, 0)
        effects += second.on_activated(
            Status.OK, Epoch(2), metadata,
            LastCleanEpoch(log_id=LOG, epoch=Epoch(1), tail_lsn=tail, version=1), 0)
        await run_sequencer(nodes, second, effects, lambda: second.purge is None,
                            sent=sent)
        kinds = {type(s.message).__name__ for s in sent}
        assert "GetLogState" in kinds and not kinds & {"GetDigest", "Clean"}, kinds


def seed_4489_faults(recovery: LogRecovery, node: NodeId, message: Any) -> bool:
    """Attempt 1 seals A, B, C (D and E do not answer) and CLEANs them; E, outside its
    recovery set, gets its one CLEAN, and C's CLEAN is lost, so attempt 1 never ends. Attempt
    2 reaches C, D, E only."""
    if recovery.attempt == 1:
        if isinstance(message, Clean):
            return node in (A, B, E)
        return node in (A, B, C)
    return node in (C, D, E)


async def test_a_clean_past_the_bridge_is_no_last_known_good_for_the_next_attempt(
        tmp_path: Path) -> None:
    """Simulation seed 4489, nodeset A..E, R=3: e1n1 acked on A, B, C; e1n2 and e1n3 (last
    known good 1) reached only E. Attempt 1 bridges at e1n2; E purges its strays under the
    CLEAN (the bridge at e1n2, a hole at e1n3, past the bridge) and is settled up to ESN 3.
    The CLEAN to C is lost, so attempt 2 runs, with C, D, E. E's settled mark is no
    last-known-good ESN: taken as one, attempt 2 would digest nothing, bridge at e1n4 and
    write e1n3 (a hole only E holds) as the epoch's last record in the clean epoch's tail."""
    config = SequencerConfig(recovery_timeout_ms=5_000)
    async with five_nodes(tmp_path) as nodes:
        for node in (A, B, C):
            assert (await store(nodes[node], make_store(lsn(1, 1), (b"r1",)))).status is (
                Status.OK)
        for esn in (2, 3):
            stray = dataclasses.replace(make_store(lsn(1, esn), (b"stray",)),
                                        last_known_good=Esn(1))
            assert (await store(nodes[E], stray)).status is Status.OK
        recovery, lost = await run_recovery(nodes, seed_4489_faults, config)
        assert any(s.node == C and isinstance(s.message, Clean) for s in lost)
        assert recovery.phase is Phase.DONE and recovery.attempt == 2
        outcome = recovery.outcomes[Epoch(1)]
        assert (outcome.lng, outcome.bridge_esn, outcome.last_record_esn) == (1, 2, 1)
        assert recovery.tail_lsn == lsn(1, 1)
        # E was settled by attempt 1's CLEAN, and reports the last-known-good ESN its STOREs
        # carried all the same.
        assert await unsettled(nodes[E]) == []
        assert nodes[E].log_state(LOG).epoch_tails[Epoch(1)] == (1, 3)
        views = {members: view(await read_through(nodes, members))
                 for members in itertools.combinations(NODESET, 3)}
        assert set(map(tuple, views.values())) == {
            (("record", lsn(1, 1)), ("BRIDGE", lsn(1, 2)))}, views
