"""The purge core (issue 16 item 6): which CLEAN each node that reports unsettled epochs gets,
how an outcome the sequencer does not know is derived from the other nodes, retries, and the
end of the purge."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sequencer.core.purge import (
    PURGE_EPOCHS_PER_ANSWER_MAX,
    PurgeCoordinator,
    unsettled_from_wire,
)
from shared.config import SequencerConfig
from shared.effects import Send
from shared.status import Status
from shared.types import EPOCH_MAX, ESN_MAX, Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.read import GetLogState, LogState
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest
from shared.wire.store import RECOVERY_BRIDGE, RECOVERY_HOLE, RecordFlags, recovery_wave

LOG = LogId(1)
N1, N2, N3, N4 = (NodeId(f"N{i}") for i in range(1, 5))
REC = int(RecordFlags.WRITTEN_BY_RECOVERY)
DECIDED = recovery_wave(4, 2)


def state(node_unclean: tuple[tuple[int, int, int], ...]) -> LogState:
    return LogState(status=Status.OK, log_id=LOG, release_lsn=Lsn(0), sealed_epoch=Epoch(4),
                    last_lsn=Lsn(0), unclean=node_unclean)


def digest(epoch: int, entries: tuple[tuple[int, int, int], ...]) -> Digest:
    return Digest(status=Status.OK, log_id=LOG, epoch=Epoch(epoch),
                  entries=tuple((esn, flags, wave, 0, None, b"", None)
                                for esn, flags, wave in entries), next_esn=ESN_MAX + 1)


def cleaned(epoch: int) -> Cleaned:
    return Cleaned(status=Status.OK, log_id=LOG, epoch=Epoch(epoch), sealed_epoch=Epoch(4),
                   sealed_by=NodeId("seq"))


def sends(effects: list[Any]) -> dict[tuple[NodeId, type], list[Any]]:
    found: dict[tuple[NodeId, type], list[Any]] = {}
    for effect in effects:
        assert isinstance(effect, Send)
        found.setdefault((effect.node, type(effect.message)), []).append(effect.message)
    return found


def test_nodes_get_the_known_outcome_or_one_derived_from_an_f_majority_of_the_others() -> None:
    config = SequencerConfig(recovery_retry_ms=100)
    known = Clean(log_id=LOG, epoch=Epoch(3), seal_epoch=Epoch(4), sealed_by=NodeId("seq"),
                  bridge_esn=Esn(2), holes=(), attempt=2)
    purge = PurgeCoordinator(log_id=LOG, node_id=NodeId("seq"), epoch=Epoch(5),
                             nodeset=(N1, N2, N3, N4), replication=2, config=config,
                             known={Epoch(3): known})
    asks = sends(purge.start())
    assert sorted(node for node, kind in asks if kind is GetLogState) == [N1, N2, N3, N4]

    # N1 holds unsettled copies of epochs 3 and 4 (and of our own epoch 5, not its business).
    out = sends(purge.on_reply(N1, asks[(N1, GetLogState)][0],
                               state(((3, 0, 4), (4, 2, 9), (5, 0, 1))), 0))
    assert out[(N1, Clean)] == [known]
    digests = {node: msgs[0] for (node, kind), msgs in out.items() if kind is GetDigest}
    assert sorted(digests) == [N2, N3, N4]  # never N1 itself: its copies are in question
    assert all(d.epoch == 4 and d.from_esn == 3 for d in digests.values())
    # N2 needs epoch 3 too: the same CLEAN goes to it, and each confirms on its own.
    out = sends(purge.on_reply(N2, asks[(N2, GetLogState)][0], state(((3, 0, 2),)), 0))
    assert out[(N2, Clean)] == [known]
    assert purge.on_reply(N3, asks[(N3, GetLogState)][0], Status.TIMEDOUT, 0) == []
    assert purge.deadline_ms() == 100
    assert purge.on_reply(N4, asks[(N4, GetLogState)][0], state(()), 0) == []

    # Epoch 4 over N1's range 3..9 from N2, N3, N4 (the f-majority of 4 - 2 + 1 = 3): 3 is
    # a record, 4 re-replicated by recovery, 5 plugged, 6 held by nobody, the bridge at 7;
    # N4's sequencer copy at 8 is a stray after the bridge.
    assert purge.on_reply(N2, digests[N2], digest(4, (
        (3, 0, 1), (4, REC, DECIDED), (5, int(RECOVERY_HOLE), DECIDED),
        (7, int(RECOVERY_BRIDGE), DECIDED))), 1) == []
    assert purge.on_reply(N3, digests[N3], digest(4, ((3, 0, 1), (7, int(RECOVERY_BRIDGE),
                                                                  DECIDED))), 1) == []
    out = sends(purge.on_reply(N4, digests[N4], digest(4, ((8, 0, 1),)), 1))
    [derived] = out[(N1, Clean)]
    assert (derived.epoch, derived.bridge_esn, derived.holes) == (4, 7, ((5, 6),))
    assert (derived.seal_epoch, derived.attempt) == (4, 2)  # the decision's precedence

    # Confirmations: each node is asked once more, and is done when nothing new is left.
    assert purge.on_reply(N1, known, cleaned(3), 2) == []
    [again] = sends(purge.on_reply(N1, derived, cleaned(4), 2))[(N1, GetLogState)]
    assert purge.on_reply(N1, again, state(((5, 0, 1),)), 3) == []
    [again] = sends(purge.on_reply(N2, known, cleaned(3), 2))[(N2, GetLogState)]
    assert purge.on_reply(N2, again, state(((3, 0, 2),)), 3) == []  # cleaned once: enough
    assert not purge.finished
    [retry] = sends(purge.on_timer(100))[(N3, GetLogState)]
    assert purge.on_reply(N3, retry, state(()), 100) == []
    assert purge.finished and purge.cleans_sent == 3


def test_a_digest_refused_as_preempted_stops_the_purge() -> None:
    purge = PurgeCoordinator(log_id=LOG, node_id=NodeId("seq"), epoch=Epoch(5),
                             nodeset=(N1, N2, N3), replication=2, config=SequencerConfig())
    asks = sends(purge.start())
    out = sends(purge.on_reply(N1, asks[(N1, GetLogState)][0], state(((2, 0, 3),)), 0))
    request = out[(N2, GetDigest)][0]
    refused = Digest(status=Status.PREEMPTED, log_id=LOG, epoch=Epoch(2), entries=(),
                     next_esn=1, sealed_epoch=Epoch(6), sealed_by=NodeId("newer"))
    assert purge.on_reply(N2, request, refused, 1) == []
    assert purge.finished and purge.deadline_ms() is None


def test_a_digest_from_a_node_that_may_have_lost_copies_does_not_count() -> None:
    purge = PurgeCoordinator(log_id=LOG, node_id=NodeId("seq"), epoch=Epoch(5),
                             nodeset=(N1, N2, N3), replication=2, config=SequencerConfig())
    asks = sends(purge.start())
    out = sends(purge.on_reply(N1, asks[(N1, GetLogState)][0], state(((2, 0, 3),)), 0))
    damaged = dataclasses.replace(digest(2, ()), non_authoritative=((1 << 33, (1 << 33) + 9),))
    # N2 may have lost copies of epoch 2: its "nothing" proves nothing, so N1's copies are
    # not plugged on the word of N3 alone (the f-majority is 3 - 2 + 1 = 2).
    assert purge.on_reply(N2, out[(N2, GetDigest)][0], damaged, 1) == []
    assert purge.on_reply(N3, out[(N3, GetDigest)][0], digest(2, ((1, 0, 1),)), 1) == []
    assert not purge.finished and purge.cleans_sent == 0


def test_without_a_bridge_the_epoch_ends_after_its_last_record_unless_copies_follow() -> None:
    """No bridge in N1's range 1..4 (an epoch drained, or ended by an abandoned recovery):
    the end is where a reader of the others sees it, right after the last record, unless
    some node holds a copy past the range (then an ESN nobody holds is a hole)."""
    for after, expected in (((), (3, ())), (((9, 0, 1),), (0, ((3, 4),)))):
        purge = PurgeCoordinator(log_id=LOG, node_id=NodeId("seq"), epoch=Epoch(5),
                                 nodeset=(N1, N2, N3), replication=2, config=SequencerConfig())
        asks = sends(purge.start())
        out = sends(purge.on_reply(N1, asks[(N1, GetLogState)][0], state(((2, 0, 4),)), 0))
        assert purge.on_reply(N2, out[(N2, GetDigest)][0],
                              digest(2, ((1, 0, 1), (2, 0, 1), *after)), 1) == []
        result = sends(purge.on_reply(N3, out[(N3, GetDigest)][0],
                                      digest(2, ((2, 0, 1),)), 1))
        [clean] = result[(N1, Clean)]
        assert (clean.bridge_esn, clean.holes) == expected


@given(st.recursive(st.none() | st.integers(min_value=-2**65, max_value=2**65) | st.text(),
                    lambda inner: st.lists(inner, max_size=5).map(tuple), max_leaves=30))
def test_any_unclean_field_from_the_wire_gives_well_formed_epochs(unclean: Any) -> None:
    for epoch, lng, last in unsettled_from_wire(unclean):
        assert 0 < epoch <= EPOCH_MAX and 0 <= lng < last <= ESN_MAX


def test_a_node_lists_a_bounded_number_of_epochs_per_answer() -> None:
    many = tuple((e, 0, 1) for e in range(1, 10_000))
    assert len(unsettled_from_wire(many)) == PURGE_EPOCHS_PER_ANSWER_MAX


@given(st.lists(st.recursive(st.none() | st.integers(min_value=-2**65, max_value=2**65)
                             | st.binary(max_size=4),
                             lambda inner: st.lists(inner, max_size=7).map(tuple),
                             max_leaves=20), max_size=6).map(tuple),
       st.integers(min_value=-5, max_value=2**33))
def test_any_digest_entries_from_the_wire_are_survived(entries: Any, next_esn: int) -> None:
    purge = PurgeCoordinator(log_id=LOG, node_id=NodeId("seq"), epoch=Epoch(5),
                             nodeset=(N1, N2, N3), replication=2, config=SequencerConfig())
    asks = sends(purge.start())
    out = sends(purge.on_reply(N1, asks[(N1, GetLogState)][0], state(((2, 0, 3),)), 0))
    reply = Digest(status=Status.OK, log_id=LOG, epoch=Epoch(2), entries=entries,
                   next_esn=next_esn)
    purge.on_reply(N2, out[(N2, GetDigest)][0], reply, 1)
    purge.on_reply(N3, out[(N3, GetDigest)][0], reply, 1)
