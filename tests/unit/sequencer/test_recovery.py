"""Epoch recovery core: LogDevice's ``RecoveryTest.MutationsWithImmutableConsensus`` as a test
vector (digest precedence, plugs, bridges, what readers see afterwards), preemption, node loss
and restart."""

from __future__ import annotations

from typing import Any

import pytest

from sequencer.core.effects import RecoveryProgress, WriteLastCleanEpoch
from sequencer.core.recovery import LogRecovery, Phase
from shared.config import SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch
from shared.read_merge import NodeAnswer, merge
from shared.status import Status
from shared.types import ESN_MAX, Epoch, Esn, LogId, Lsn, NodeId, compose_lsn, lsn_to_esn
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest, Seal, Sealed
from shared.wire.store import RECOVERY_HOLE, RecordFlags, Store, Stored, recovery_wave

LOG = LogId(1)
N1, N2, N3 = NodeId("N1"), NodeId("N2"), NodeId("N3")
SEQ = NodeId("N0")
REC = int(RecordFlags.WRITTEN_BY_RECOVERY)
HOLE = int(RecordFlags.WRITTEN_BY_RECOVERY | RecordFlags.HOLE)
BRIDGE = HOLE | int(RecordFlags.BRIDGE)
Copy = tuple[int, int]  # (flags, wave or seal epoch)


def lsn(epoch: int, esn: int) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def x(wave: int = 1) -> Copy:
    return (0, wave)


def xr(seal: int) -> Copy:
    return (REC, recovery_wave(seal, 1))


def o(seal: int) -> Copy:
    return (HOLE, recovery_wave(seal, 1))


# The table of RecoveryTest.MutationsWithImmutableConsensus: (epoch, esn) -> copy, per node.
# Epoch 1's last known good is ESN 1 (stored with (1,2)); epoch 2 has none.
DISKS: dict[NodeId, dict[tuple[int, int], Copy]] = {
    N1: {(1, 1): x(), (1, 2): x(), (1, 4): o(2), (2, 2): xr(4), (2, 4): xr(2), (2, 5): o(7),
         (2, 6): xr(3), (2, 7): x(3), (2, 8): x(1)},
    N2: {(1, 1): x(), (1, 2): o(3), (2, 3): xr(5), (2, 4): xr(2), (2, 5): o(7), (2, 6): xr(4),
         (2, 7): x(3), (2, 8): x(2)},
    N3: {(1, 1): x(), (1, 3): x(), (2, 2): x(), (2, 3): o(3), (2, 4): xr(2), (2, 5): o(7),
         (2, 6): o(6), (2, 7): x(3), (2, 8): x(3)},
}
LNG = {1: 1, 2: 0}


def payload(epoch: int, esn: int) -> bytes:
    return b"%d.%d" % (epoch, esn)


def sealed(node: NodeId, seal: Seal) -> Sealed:
    tails = []
    for epoch in (1, 2):
        esns = [esn for (e, esn) in DISKS[node] if e == epoch]
        if esns:
            tails.append((epoch, LNG[epoch] if node != N3 or epoch == 2 else 0, max(esns)))
    return Sealed(status=Status.OK, log_id=LOG, seal_epoch=seal.seal_epoch, sealed_epoch=Epoch(0),
                  sealed_by=None, tails=tuple(tails))


def digest(node: NodeId, request: GetDigest) -> Digest:
    entries = tuple(
        (esn, flags, wave, 0, None, b"" if flags & RecordFlags.HOLE else payload(epoch, esn),
         None)
        for (epoch, esn), (flags, wave) in sorted(DISKS[node].items())
        if epoch == request.epoch and esn >= request.from_esn)
    return Digest(status=Status.OK, log_id=LOG, epoch=request.epoch, entries=entries,
                  next_esn=ESN_MAX + 1)


def run_recovery(disks: dict[NodeId, dict[tuple[int, int], Copy]]) -> tuple[
        LogRecovery, list[Store], list[Clean]]:
    """Drive a recovery against nodes that answer everything at once from ``disks``, apply
    its mutations to them, and return what it sent."""
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(7),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0),
                                              version=0),
                           nodeset=(N1, N2, N3), replication=3, config=SequencerConfig())
    stores: list[Store] = []
    cleans: list[Clean] = []
    queue: list[Any] = recovery.start(0)
    while queue:
        effect = queue.pop(0)
        if isinstance(effect, RecoveryProgress):
            continue
        if isinstance(effect, WriteLastCleanEpoch):
            assert effect.epoch == 7
            queue.extend(recovery.on_lce_written(Status.OK, Epoch(0), 0))
            continue
        assert isinstance(effect, Send)
        node, message = effect.node, effect.message
        reply: Any
        if isinstance(message, Seal):
            reply = sealed(node, message)
        elif isinstance(message, GetDigest):
            reply = digest(node, message)
        elif isinstance(message, Store):
            stores.append(message)
            for index in range(len(message.payloads)):
                esn = lsn_to_esn(message.lsn) + index
                disks[node][(message.lsn >> 32, esn)] = (message.flags, message.wave)
            reply = Stored(log_id=LOG, lsn=message.lsn, wave=message.wave, status=Status.OK,
                           sealed_epoch=Epoch(0), sealed_by=None)
        else:
            assert isinstance(message, Clean)
            cleans.append(message)
            reply = Cleaned(status=Status.OK, log_id=LOG, epoch=message.epoch,
                            sealed_epoch=Epoch(7), sealed_by=SEQ)
        queue.extend(recovery.on_reply(node, message, reply, 0))
    return recovery, stores, cleans


def test_mutations_with_immutable_consensus() -> None:
    disks = {node: dict(copies) for node, copies in DISKS.items()}
    recovery, stores, cleans = run_recovery(disks)
    assert recovery.phase is Phase.DONE
    outcome1, outcome2 = recovery.outcomes[Epoch(1)], recovery.outcomes[Epoch(2)]
    # LogDevice's expected digests: records, plugs and bridge per epoch.
    assert (outcome1.holes, outcome1.bridge_esn, outcome1.last_record_esn) == ([(2, 2)], 4, 3)
    assert (outcome2.holes, outcome2.bridge_esn, outcome2.last_record_esn) == (
        [(1, 1), (5, 6)], 9, 8)
    assert recovery.tail_lsn == lsn(2, 8)
    # Nothing at or below epoch 1's last known good is touched; every mutated ESN ends up
    # identical on all three nodes (R=3), written by recovery with seal epoch 7.
    assert all(s.wave == recovery_wave(7, 1) and s.flags & RecordFlags.WRITTEN_BY_RECOVERY
               for s in stores)
    assert not any(s.lsn == lsn(1, 1) for s in stores)
    expected = {(1, 2): HOLE, (1, 3): REC, (1, 4): BRIDGE, (2, 1): HOLE, (2, 2): REC,
                (2, 3): REC, (2, 4): REC, (2, 5): HOLE, (2, 6): HOLE, (2, 7): REC,
                (2, 8): REC, (2, 9): BRIDGE}
    for key, flags in expected.items():
        assert {node: disks[node].get(key) for node in disks} == {
            node: (flags, recovery_wave(7, 1)) for node in disks}, key
    # Every node hears each epoch's outcome; epochs 3..6, never written, get a bridge at ESN 1.
    assert {(c.epoch, c.bridge_esn, c.holes) for c in cleans} == {
        (1, 4, ((2, 2),)), (2, 9, ((1, 1), (5, 6))), *((e, 1, ()) for e in range(3, 8))}
    assert len(cleans) == 3 * 7
    # What readers see afterwards (the test's expected records and gaps).
    answers = [NodeAnswer(
        records=tuple((lsn(e, esn), 0, None, payload(e, esn))
                      for (e, esn), (flags, _) in sorted(copies.items())
                      if not flags & RecordFlags.HOLE),
        markers=tuple((lsn(e, esn), lsn(e, esn), flags, wave)
                      for (e, esn), (flags, wave) in sorted(copies.items()) if flags),
        next_lsn=lsn(2, 2234), release_lsn=lsn(2, 2233)) for copies in disks.values()]
    merged = merge(answers, lsn(1, 1), lsn(2, 2233), 1000, 1 << 20)
    assert [r[0] for r in merged.records] == [
        lsn(1, 1), lsn(1, 3), lsn(2, 2), lsn(2, 3), lsn(2, 4), lsn(2, 7), lsn(2, 8)]
    assert [(g.kind, g.lo, g.hi) for g in merged.gaps] == [
        ("HOLE", lsn(1, 2), lsn(1, 2)),
        ("BRIDGE", lsn(1, 4), lsn(2, 0)),
        ("HOLE", lsn(2, 1), lsn(2, 1)),
        ("HOLE", lsn(2, 5), lsn(2, 6)),
        ("BRIDGE", lsn(2, 9), lsn(2, 2233)),
    ]
    # A second recovery over the result changes nothing (immutable consensus).
    again = {node: dict(copies) for node, copies in disks.items()}
    run_recovery(again)
    assert {n: {k: v for k, v in c.items() if k in expected} for n, c in again.items()} == {
        n: {k: (f, recovery_wave(7, 1)) for k, f in expected.items()} for n in disks}


def test_a_higher_seal_preempts_recovery() -> None:
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(4),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(2), tail_lsn=Lsn(0),
                                              version=1),
                           nodeset=(N1, N2, N3), replication=2, config=SequencerConfig())
    seals = [e for e in recovery.start(0) if isinstance(e, Send)]
    assert [s.message.from_epoch for s in seals] == [3, 3, 3]
    reply = Sealed(status=Status.PREEMPTED, log_id=LOG, seal_epoch=Epoch(4),
                   sealed_epoch=Epoch(5), sealed_by=NodeId("s9"), tails=())
    recovery.on_reply(N1, seals[0].message, reply, 1)
    assert recovery.phase is Phase.PREEMPTED
    assert recovery.preempted_by == (5, "s9")


def test_a_node_failing_mid_digest_is_retried_and_stale_replies_are_ignored() -> None:
    config = SequencerConfig(recovery_grace_ms=10)
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(1),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0),
                                              version=0),
                           nodeset=(N1, N2, N3, NodeId("N4")), replication=2, config=config)
    seals = {e.node: e.message for e in recovery.start(0) if isinstance(e, Send)}
    tails = ((1, 0, 2),)
    for node in (N1, N2, N3):  # N4 never answers
        assert recovery.on_reply(node, seals[node], Sealed(
            status=Status.OK, log_id=LOG, seal_epoch=Epoch(1), sealed_epoch=Epoch(0),
            sealed_by=None, tails=tails), 1) == []
    effects = recovery.on_timer(11)  # grace over: digest from N1..N3
    assert recovery.phase is Phase.DIGESTING
    digests = {e.node: e.message for e in effects if isinstance(e, Send)}
    assert sorted(digests) == [N1, N2, N3]
    # A late SEALED from an earlier phase is stale.
    assert recovery.on_reply(NodeId("N4"), seals[NodeId("N4")], Status.TIMEDOUT, 12) == []
    recovery.on_reply(N1, digests[N1], Digest(status=Status.OK, log_id=LOG, epoch=Epoch(1),
                      entries=((1, 0, 1, 5, None, b"a", None),), next_esn=ESN_MAX + 1), 12)
    recovery.on_reply(N2, digests[N2], Digest(status=Status.OK, log_id=LOG, epoch=Epoch(1),
                      entries=(), next_esn=ESN_MAX + 1), 12)
    # Without N3 only two members would remain, fewer than the f-majority of 4 - 2 + 1 = 3
    # nodes that recovery needs: it retries N3 instead of going on without it.
    assert recovery.on_reply(N3, digests[N3], Status.CONNFAILED, 12) == []
    assert recovery.phase is Phase.DIGESTING
    retry = [e for e in recovery.on_timer(12 + config.recovery_retry_ms) if isinstance(e, Send)]
    assert [(e.node, type(e.message)) for e in retry] == [(N3, GetDigest)]
    effects = recovery.on_reply(N3, retry[0].message, Digest(
        status=Status.OK, log_id=LOG, epoch=Epoch(1), entries=(), next_esn=ESN_MAX + 1), 600)
    assert recovery.phase is Phase.MUTATING
    stores = [e for e in effects if isinstance(e, Send)]
    # ESN 1 (held by N1 only) goes to R=2 nodes; ESN 2, which N1..N3 do not hold although N4
    # had reported it, follows the last record: the bridge.
    assert sorted((lsn_to_esn(s.message.lsn), s.message.flags) for s in stores) == sorted(
        [(1, REC), (1, REC), (2, BRIDGE), (2, BRIDGE)])
    assert {s.node for s in stores if lsn_to_esn(s.message.lsn) == 1} >= {N1}


def test_recovery_that_times_out_starts_over_with_a_new_seal_round() -> None:
    config = SequencerConfig(recovery_timeout_ms=1_000)
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(1),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0),
                                              version=0),
                           nodeset=(N1, N2, N3), replication=2, config=config)
    first = [e.message for e in recovery.start(0) if isinstance(e, Send)]
    assert recovery.deadline_ms() == 1_000
    again = [e for e in recovery.on_timer(1_000) if isinstance(e, Send)]
    assert recovery.attempt == 2 and [type(e.message) for e in again] == [Seal] * 3
    # Answers to the first round's SEALs no longer count.
    assert recovery.on_reply(N1, first[0], Sealed(
        status=Status.OK, log_id=LOG, seal_epoch=Epoch(1), sealed_epoch=Epoch(0),
        sealed_by=None, tails=()), 1_001) == []


def drive(nodes: tuple[NodeId, ...], answer: Any, until_ms: int = 600_000) -> LogRecovery:
    """Run a recovery of epoch 1 (sealed at 2) against nodes answering with ``answer(node,
    message)``, firing its timers, until it finishes or ``until_ms``."""
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(2),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(0), tail_lsn=Lsn(0),
                                              version=0),
                           nodeset=nodes, replication=2, config=SequencerConfig())
    now_ms = 0
    queue: list[Any] = recovery.start(now_ms)
    while now_ms < until_ms and not recovery.finished:
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, WriteLastCleanEpoch):
                queue.extend(recovery.on_lce_written(Status.OK, Epoch(0), now_ms))
            elif isinstance(effect, Send):
                reply = answer(effect.node, effect.message)
                queue.extend(recovery.on_reply(effect.node, effect.message, reply, now_ms))
        due_ms = recovery.deadline_ms()
        if due_ms is None:
            break
        now_ms = max(now_ms, due_ms)
        queue.extend(recovery.on_timer(now_ms))
    return recovery


@pytest.mark.parametrize("failure", [Status.DISABLED, Status.NOSPC, Status.CHECKSUM_MISMATCH])
def test_a_member_that_cannot_serve_recovery_is_left_out(failure: Status) -> None:
    nodes = tuple(NodeId(f"N{i}") for i in range(1, 6))
    bad = nodes[4]

    def answer(node: NodeId, message: Any) -> Any:
        if isinstance(message, Seal):
            return Sealed(status=Status.OK, log_id=LOG, seal_epoch=message.seal_epoch,
                          sealed_epoch=Epoch(0), sealed_by=None, tails=((1, 0, 3),))
        if isinstance(message, GetDigest):
            if node == bad and failure is Status.CHECKSUM_MISMATCH:
                return Digest(status=failure, log_id=LOG, epoch=message.epoch, entries=(),
                              next_esn=message.from_esn)
            entries = tuple((esn, 0, 1, 0, None, b"p%d" % esn, None) for esn in (1, 2, 3)
                            if node in nodes[:2])
            return Digest(status=Status.OK, log_id=LOG, epoch=message.epoch, entries=entries,
                          next_esn=ESN_MAX + 1)
        if isinstance(message, Store):
            status = failure if node == bad else Status.OK
            return Stored(log_id=LOG, lsn=message.lsn, wave=message.wave, status=status,
                          sealed_epoch=Epoch(0), sealed_by=None)
        return Cleaned(status=Status.OK, log_id=LOG, epoch=message.epoch,
                       sealed_epoch=Epoch(2), sealed_by=SEQ)

    # Four healthy nodes are the f-majority (5 - 2 + 1) and can hold R=2 copies.
    recovery = drive(nodes, answer)
    assert recovery.phase is Phase.DONE and recovery.attempt == 1
    assert recovery.outcomes[Epoch(1)].last_record_esn == 3


def test_a_late_write_of_an_abandoned_attempt_never_ties_with_the_newer_decision() -> None:
    k = lsn(3, 4)
    plug = NodeAnswer(records=(), next_lsn=Lsn(k + 1), release_lsn=Lsn(k + 1),
                      markers=((k, k, int(RECOVERY_HOLE), recovery_wave(5, 2)),))
    late = NodeAnswer(records=((k, 0, None, b"attempt 1"),), next_lsn=Lsn(k + 1),
                      release_lsn=Lsn(k + 1), markers=((k, k, REC, recovery_wave(5, 1)),))
    for answers in ([plug, late], [late, plug]):
        merged = merge(answers, k, k, 10, 1 << 20)
        assert (merged.records, [(g.kind, g.lo) for g in merged.gaps]) == ([], [("HOLE", k)])
    # A restarted attempt writes with its own, higher precedence.
    recovery = LogRecovery(log_id=LOG, node_id=SEQ, seal_epoch=Epoch(5),
                           lce=LastCleanEpoch(log_id=LOG, epoch=Epoch(4), tail_lsn=Lsn(0),
                                              version=1),
                           nodeset=(N1, N2, N3), replication=2, config=SequencerConfig(),
                           attempts_before=3)
    recovery.start(0)
    assert recovery.attempt == 4


def test_re_replicated_records_keep_their_producer_tags() -> None:
    # Records e1n1..e1n2 (one idempotent batch) are on one node only: recovery copies them to
    # R nodes, and the copies must carry the tag, or a later producer lookup could miss them.
    nodes = (N1, N2, N3)
    tag = ("prod", 4, lsn(1, 1), lsn(1, 2))
    written: list[Store] = []

    def answer(node: NodeId, message: Any) -> Any:
        if isinstance(message, Seal):
            return Sealed(status=Status.OK, log_id=LOG, seal_epoch=message.seal_epoch,
                          sealed_epoch=Epoch(0), sealed_by=None,
                          tails=((1, 0, 2),) if node == N1 else ())
        if isinstance(message, GetDigest):
            entries = tuple((esn, 0, 1, 0, None, b"p%d" % esn, tag) for esn in (1, 2)
                            if node == N1)
            return Digest(status=Status.OK, log_id=LOG, epoch=message.epoch, entries=entries,
                          next_esn=ESN_MAX + 1)
        if isinstance(message, Store):
            written.append(message)
            return Stored(log_id=LOG, lsn=message.lsn, wave=message.wave, status=Status.OK,
                          sealed_epoch=Epoch(0), sealed_by=None)
        return Cleaned(status=Status.OK, log_id=LOG, epoch=message.epoch,
                       sealed_epoch=Epoch(2), sealed_by=SEQ)

    recovery = drive(nodes, answer)
    assert recovery.phase is Phase.DONE
    records = [s for s in written if not s.flags & RecordFlags.HOLE]
    assert records and all(s.producers == (tag,) and s.validate() is Status.OK
                           for s in records)
