"""The per-log Sequencer core: activation, waves, gray/blacklisting, release, preemption."""

from __future__ import annotations

import random

from sequencer.core.effects import ActivateEpoch, AppendReply, FetchLogState, ReleaseAdvanced
from sequencer.core.sequencer import Sequencer, SequencerState
from shared.config import SequencerConfig
from shared.effects import Send
from shared.epoch_metadata import LastCleanEpoch
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn, lsn_to_esn
from shared.wire.release import Release
from tests.unit.sequencer.helpers import active_sequencer, metadata, replies, stores


def test_appends_wait_for_activation_then_get_lsns() -> None:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(1))
    assert sequencer.on_append(1, (b"x",), None, 5, 0) == [ActivateEpoch(LogId(1))]
    assert sequencer.on_append(2, (b"y", b"z"), None, 5, 0) == []
    assert sequencer.state is SequencerState.ACTIVATING
    lce = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(0), tail_lsn=Lsn(0), version=0)
    effects = sequencer.on_activated(Status.OK, Epoch(1), metadata(), lce, 0)
    lsns = sorted({s.message.lsn for s in stores(effects)})
    assert lsns == [compose_lsn(Epoch(1), Esn(1)), compose_lsn(Epoch(1), Esn(2))]
    batch = next(s.message for s in stores(effects) if s.message.lsn == lsns[1])
    assert batch.payloads == (b"y", b"z")
    assert len(stores(effects)) == 4  # R=2 copies of each append


def test_done_only_when_whole_current_wave_stored() -> None:
    sequencer = active_sequencer(replication=2)
    sends = stores(sequencer.on_append(5, (b"p",), None, 1, 10))
    first, second = sends
    lsn = first.message.lsn
    assert replies(sequencer.on_stored(first.node, lsn, 1, Status.OK, Epoch(0), None, 11)) == []
    done = replies(sequencer.on_stored(second.node, lsn, 1, Status.OK, Epoch(0), None, 12))
    # (Stamped no lower than the record before it: see test_record_timestamps_never_fall.)
    assert done == [AppendReply(5, Status.OK, lsn, lsn, first.message.timestamp_ms)]


def test_release_follows_reaping_and_leaves_after_the_answer() -> None:
    # The client's answer is not held back behind the copyset's RELEASE writes (readers get
    # the sequencer's own pointer, which has already moved: ReleaseAdvanced comes first).
    # With release_delay_ms 0 (the default delays it: see the next test).
    sequencer = active_sequencer(replication=1, release_delay_ms=0)
    a = stores(sequencer.on_append(2, (b"a",), None, 1, 0))[0]
    effects = sequencer.on_stored(a.node, a.message.lsn, 1, Status.OK, Epoch(0), None, 1)
    release = Send(a.node, Release(log_id=LogId(1), release_lsn=a.message.lsn))
    advanced = effects.index(ReleaseAdvanced(LogId(1), a.message.lsn))
    assert sequencer.release_lsn == a.message.lsn
    assert effects.index(replies(effects)[0]) < effects.index(release)
    assert advanced < effects.index(release)


def test_delayed_release_goes_out_when_no_store_carries_it() -> None:
    sequencer = active_sequencer(replication=1, release_delay_ms=10)
    a = stores(sequencer.on_append(2, (b"a",), None, 1, 0))[0]
    b = stores(sequencer.on_append(3, (b"b",), None, 1, 0))[0]
    effects = sequencer.on_stored(b.node, b.message.lsn, 1, Status.OK, Epoch(0), None, 1)
    assert replies(effects)[0].status is Status.OK  # acked before it is released
    assert sequencer.release_lsn == compose_lsn(Epoch(1), Esn(1))
    effects = sequencer.on_stored(a.node, a.message.lsn, 1, Status.OK, Epoch(0), None, 2)
    assert sequencer.release_lsn == b.message.lsn
    assert ReleaseAdvanced(LogId(1), b.message.lsn) in effects
    # No STORE went to the copyset within release_delay_ms: it gets an explicit RELEASE.
    assert sequencer.deadline_ms() == 2 + sequencer.config.release_delay_ms
    effects = sequencer.on_timer(2 + sequencer.config.release_delay_ms)
    assert Send(a.node, Release(log_id=LogId(1), release_lsn=b.message.lsn)) in effects


def test_delayed_release_rides_on_the_next_store() -> None:
    sequencer = active_sequencer(replication=3, release_delay_ms=10)
    first = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    for send in first:
        sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0), None, 1)
    released = sequencer.release_lsn
    assert released == first[0].message.lsn
    following = stores(sequencer.on_append(3, (b"b",), None, 1, 2))
    assert {s.message.release_lsn for s in following} == {released}
    # Every copyset node got the pointer with that STORE: nothing else is owed.
    late = sequencer.on_timer(100)
    assert not [e for e in late if type(e) is Send and type(e.message) is Release]


def test_full_window_answers_seqnobufs_and_sends_nothing() -> None:
    sequencer = active_sequencer(window_appends_max=2)
    assert stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    assert stores(sequencer.on_append(3, (b"b",), None, 1, 0))
    effects = sequencer.on_append(4, (b"c",), None, 1, 0)
    assert effects == [AppendReply(4, Status.SEQNOBUFS, message="window full")]


def test_timeout_doubles_and_graylists_first_outstanding() -> None:
    nodes = tuple(NodeId(n) for n in "abcdefgh")
    sequencer = active_sequencer(replication=2, graylist_nodeset_fraction_max=0.5)
    sequencer.metadata = metadata(2, nodes)
    from sequencer.core.nodeset_state import NodesetState
    sequencer.nodeset = NodesetState(nodes, sequencer.config)
    first, second = stores(sequencer.on_append(2, (b"a",), None, 1, 100))
    assert sequencer.deadline_ms() == 110  # wave 1: 10 ms
    sequencer.on_stored(first.node, first.message.lsn, 1, Status.OK, Epoch(0), None, 101)
    wave2 = stores(sequencer.on_timer(110))
    assert {s.message.wave for s in wave2} == {2}
    assert sequencer.deadline_ms() == 130  # wave 2: 20 ms
    assert second.node in sequencer.nodeset.graylisted(110)
    assert second.node not in {s.node for s in wave2}


def test_a_quarter_of_a_four_node_nodeset_may_be_graylisted() -> None:
    # LogDevice's limit is a fraction of the nodeset: with 4 nodes and 0.25 (the default) one
    # node is within it. Clearing the list at the limit instead of past it meant a slow node
    # of a 4-node nodeset was never avoided.
    from sequencer.core.nodeset_state import NodesetState
    nodes = tuple(NodeId(n) for n in "abcd")
    state = NodesetState(nodes, SequencerConfig())
    state.graylist(nodes[3], 0)
    assert state.graylisted(1) == {nodes[3]}
    rng = random.Random(3)
    assert all(nodes[3] not in (state.pick_copyset(2, rng, 1) or nodes) for _ in range(50))
    state.graylist(nodes[2], 2)  # two of four is past a quarter: the list is cleared
    assert state.graylisted(3) == set()


def test_no_graylist_when_every_recipient_timed_out() -> None:
    sequencer = active_sequencer(replication=2)
    stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    assert sequencer.nodeset is not None
    stores(sequencer.on_timer(10))
    assert sequencer.nodeset.graylisted(10) == set()


def test_error_reply_blacklists_and_sends_new_wave_at_once() -> None:
    sequencer = active_sequencer(replication=2)
    first, _ = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    effects = sequencer.on_stored(first.node, first.message.lsn, 1, Status.NOSPC, Epoch(0),
                                  None, 1)
    wave2 = stores(effects)
    assert wave2 and all(s.message.wave == 2 and s.node != first.node for s in wave2)
    assert sequencer.nodeset is not None
    assert first.node in sequencer.nodeset.blacklisted(1)
    assert first.node in sequencer.nodeset.blacklisted(60_000)
    assert first.node not in sequencer.nodeset.blacklisted(60_002)


def test_preempted_appends_end_with_unknown_outcome_then_reactivate() -> None:
    sequencer = active_sequencer(replication=2)
    first, _ = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    effects = sequencer.on_stored(first.node, first.message.lsn, 1, Status.PREEMPTED,
                                  Epoch(3), NodeId("other"), 1)
    assert [r.status for r in replies(effects)] == [Status.TIMEDOUT]
    assert sequencer.state is SequencerState.PREEMPTED
    assert sequencer.sealed_by == "other"
    assert ActivateEpoch(LogId(1)) in sequencer.on_append(3, (b"b",), None, 1, 2)


def test_unclean_previous_epoch_releases_nothing_new_until_recovered() -> None:
    sequencer = active_sequencer(replication=1, lce_epoch=0, epoch=3)
    assert not sequencer.releasable and sequencer.recovery is not None
    assert sequencer.release_lsn == 0
    send = stores(sequencer.on_append(2, (b"a",), None, 1, 0))[0]
    effects = sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0), None, 1)
    assert replies(effects)[0].status is Status.OK
    assert sequencer.release_lsn == 0
    # What earlier sequencers released is learned from the storage nodes, never beyond them.
    sequencer.on_release_hint(compose_lsn(Epoch(1), Esn(7)))
    assert sequencer.release_lsn == compose_lsn(Epoch(1), Esn(7))
    assert sequencer.on_release_hint(compose_lsn(Epoch(3), Esn(1))) == []
    assert sequencer.release_lsn == compose_lsn(Epoch(1), Esn(7))


def test_unclean_activation_asks_storage_for_release() -> None:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(1))
    sequencer.on_append(1, (b"x",), None, 5, 0)
    lce = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(1), tail_lsn=Lsn(9), version=1)
    effects = sequencer.on_activated(Status.OK, Epoch(5), metadata(), lce, 0)
    assert FetchLogState(LogId(1), metadata().nodeset) in effects


def test_failed_activation_fails_queued_appends_as_nothing_written() -> None:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(1))
    sequencer.on_append(1, (b"x",), None, 5, 0)
    effects = sequencer.on_activated(Status.CONNFAILED, Epoch(0), None, None, 0)
    assert [r.status for r in replies(effects)] == [Status.NOSEQUENCER]
    assert sequencer.state is SequencerState.UNAVAILABLE


def test_esn_exhaustion_moves_to_a_new_epoch() -> None:
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(1), esn_max=Esn(2))
    sequencer.on_append(1, (b"x", b"y"), None, 5, 0)
    lce = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(0), tail_lsn=Lsn(0), version=0)
    sequencer.on_activated(Status.OK, Epoch(1), metadata(), lce, 0)
    # The batch x, y is still in flight: the epoch drains first (see the tests below).
    assert sequencer.on_append(2, (b"z",), None, 5, 0) == []
    assert ActivateEpoch(LogId(1)) in sequencer.on_timer(
        SequencerConfig().epoch_drain_timeout_ms)


def test_drained_epoch_reports_clean_tail() -> None:
    sequencer = active_sequencer(replication=1)
    assert sequencer.drained_clean_tail() == compose_lsn(Epoch(1), Esn(1))
    stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    assert sequencer.drained_clean_tail() is None


def test_only_the_final_broadcast_of_a_drained_epoch_lets_nodes_settle_it() -> None:
    sequencer = active_sequencer(replication=1)
    drained = [e.message for e in sequencer.release_broadcast(final=True)]
    assert drained and all(m.drained_epoch == 1 and m.release_lsn == compose_lsn(
        Epoch(1), Esn(1)) for m in drained)
    assert all(e.message.drained_epoch == 0 for e in sequencer.release_broadcast())
    stores(sequencer.on_append(2, (b"a",), None, 1, 0))  # in flight: not drained any more
    assert all(e.message.drained_epoch == 0 for e in sequencer.release_broadcast(final=True))


def test_late_ok_from_an_earlier_wave_counts_and_is_not_resent() -> None:
    sequencer = active_sequencer(replication=3)
    first, second, third = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    lsn = first.message.lsn
    sequencer.on_stored(first.node, lsn, 1, Status.OK, Epoch(0), None, 1)
    # The other two are still working on wave 1: wave 2 waits for those answers (no
    # payload goes again).
    assert stores(sequencer.on_timer(10)) == []
    wave3 = stores(sequencer.on_timer(30))
    # Wave 2 timed out too: the nodes without a copy get the payload again.
    assert {s.node for s in wave3} == {second.node, third.node}
    assert {s.message.wave for s in wave3} == {3}
    sequencer.on_stored(second.node, lsn, 1, Status.OK, Epoch(0), None, 32)  # late, wave 1
    done = replies(sequencer.on_stored(third.node, lsn, 3, Status.OK, Epoch(0), None, 33))
    assert [r.status for r in done] == [Status.OK]


def test_grouped_appends_share_one_appender_with_own_lsns() -> None:
    from sequencer.core.sequencer import PendingAppend

    sequencer = active_sequencer(replication=2)
    group = [PendingAppend(7, (b"a",), None, 1), PendingAppend(8, (b"b", b"c"), None, 1),
             PendingAppend(9, (b"d",), None, 1)]
    sends = stores(sequencer.on_append_group(group, 0))
    assert len(sends) == 2  # one STORE per copyset node for all three appends
    assert sends[0].message.payloads == (b"a", b"b", b"c", b"d")
    lsn = sends[0].message.lsn
    effects = [r for s in sends for r in replies(
        sequencer.on_stored(s.node, lsn, 1, Status.OK, Epoch(0), None, 1))]
    assert [(r.request_id, r.first_lsn - lsn, r.last_lsn - lsn) for r in effects] == [
        (7, 0, 0), (8, 1, 2), (9, 3, 3)]


def test_grouped_appends_in_full_window_all_get_seqnobufs() -> None:
    from sequencer.core.sequencer import PendingAppend

    sequencer = active_sequencer(window_appends_max=2)
    stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    stores(sequencer.on_append(3, (b"b",), None, 1, 0))
    group = [PendingAppend(7, (b"x",), None, 1), PendingAppend(8, (b"y",), None, 1)]
    effects = sequencer.on_append_group(group, 0)
    assert [(r.request_id, r.status) for r in replies(effects)] == [
        (7, Status.SEQNOBUFS), (8, Status.SEQNOBUFS)]
    assert stores(effects) == []


def test_exhausted_epoch_drains_its_appends_before_the_next_epoch() -> None:
    sequencer = active_sequencer(replication=1, esn_max=Esn(3))  # e1n1 is taken
    first = stores(sequencer.on_append(2, (b"a",), None, 1, 0))  # e1n2, stays in flight
    assert [lsn_to_esn(s.message.lsn) for s in first] == [2]
    # e1n3 is the last ESN; a batch of two no longer fits: it waits, nothing is aborted.
    assert sequencer.on_append(3, (b"b", b"c"), None, 1, 1) == []
    assert sequencer.state is SequencerState.ACTIVE and sequencer.deadline_ms() is not None
    done = sequencer.on_stored(first[0].node, first[0].message.lsn, 1, Status.OK, Epoch(0),
                               None, 2)
    assert [(r.request_id, r.status) for r in replies(done)] == [(2, Status.OK)]
    assert ActivateEpoch(LogId(1)) in done  # drained: on to the next epoch
    assert sequencer.release_lsn == compose_lsn(Epoch(1), Esn(2))


def test_exhausted_epoch_gives_up_after_the_drain_timeout() -> None:
    sequencer = active_sequencer(replication=1, esn_max=Esn(2), epoch_drain_timeout_ms=50)
    stuck = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    assert stuck and sequencer.on_append(3, (b"b",), None, 1, 1) == []
    effects = sequencer.on_timer(51)
    assert [(r.request_id, r.status) for r in replies(effects)] == [(2, Status.TIMEDOUT)]
    assert ActivateEpoch(LogId(1)) in effects


def test_preemption_while_draining_sends_the_waiting_appends_to_a_new_epoch() -> None:
    sequencer = active_sequencer(replication=1, esn_max=Esn(2))
    inflight = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    assert sequencer.on_append(3, (b"b",), None, 1, 1) == []  # waits for the drain
    effects = sequencer.on_stored(inflight[0].node, inflight[0].message.lsn, 1,
                                  Status.PREEMPTED, Epoch(2), NodeId("other"), 2)
    assert [(r.request_id, r.status) for r in replies(effects)] == [(2, Status.TIMEDOUT)]
    assert ActivateEpoch(LogId(1)) in effects  # request 3 is not stranded
    assert sequencer.state is SequencerState.ACTIVATING


def test_compressed_batch_gets_one_lsn_per_record_in_its_own_store() -> None:
    from sequencer.core.sequencer import PendingAppend

    sequencer = active_sequencer(replication=2)
    group = [PendingAppend(7, (b"a",), None, 1),
             PendingAppend(8, (b"blob",), None, 1, compression=1, records=50),
             PendingAppend(9, (b"b",), None, 1), PendingAppend(10, (b"c",), None, 1),
             PendingAppend(11, (b"blob2",), None, 1, producer=("p", 1), compression=2,
                           records=3)]
    effects = sequencer.on_append_group(group, 0)
    sends = stores(effects)
    # Blobs are never merged: plain run, blob, plain run, blob; each to 2 nodes.
    messages = [s.message for s in sends[::2]]
    assert [(m.payloads, m.compression, m.records) for m in messages] == [
        ((b"a",), 0, 0), ((b"blob",), 1, 50), ((b"b", b"c"), 0, 0), ((b"blob2",), 2, 3)]
    first = messages[0].lsn
    assert [m.lsn - first for m in messages] == [0, 1, 51, 53]
    assert [m.last_lsn - first for m in messages] == [0, 50, 52, 55]
    assert messages[3].producers == (("p", 1, first + 53, first + 55),)
    answers = []
    for send in sends:
        answers += replies(sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK,
                                               Epoch(0), None, 1))
    assert sorted((r.request_id, r.first_lsn - first, r.last_lsn - first)
                  for r in answers) == [(7, 0, 0), (8, 1, 50), (9, 51, 51), (10, 52, 52),
                                        (11, 53, 55)]
    assert sequencer.release_lsn == first + 55


def test_record_timestamps_never_fall_along_lsns() -> None:
    # An append that waited (activation, a producer lookup) keeps its arrival time; a record
    # after one stamped later must not get it, or age retention could trim the younger
    # record below it early (issue 16 item 10).
    sequencer = active_sequencer(replication=2)
    first = stores(sequencer.on_append(1, (b"late",), None, 2_000, 0))
    second = stores(sequencer.on_append(2, (b"waited",), None, 1_500, 0))
    assert first[0].message.lsn < second[0].message.lsn
    assert [s.message.timestamp_ms for s in first + second] == [2_000] * 4
    third = stores(sequencer.on_append(3, (b"later",), None, 2_500, 0))
    assert third[0].message.timestamp_ms == 2_500


def test_a_tail_can_activate_a_log_with_no_append() -> None:
    # A reader asked for the tail of a log whose last epoch is not clean: the sequencer
    # activates (and recovers) with nothing queued, and only once.
    sequencer = Sequencer(log_id=LogId(1), node_id=NodeId("seq"), config=SequencerConfig(),
                          rng=random.Random(7))
    assert sequencer.on_activate_request(0) == [ActivateEpoch(LogId(1))]
    assert sequencer.on_activate_request(1) == []  # already activating
    lce = LastCleanEpoch(log_id=LogId(1), epoch=Epoch(1), tail_lsn=Lsn(0), version=0)
    sequencer.on_activated(Status.OK, Epoch(2), metadata(2), lce, 2)
    assert sequencer.state is SequencerState.ACTIVE and not sequencer.appenders
    assert sequencer.on_activate_request(3) == []


def test_inflight_tail_covers_appends_not_yet_released() -> None:
    """Rebuilding's plan waits until the release pointer reaches this tail: it must cover
    every LSN handed out, acknowledged or not (``storage_node.core.rebuild``)."""
    sequencer = active_sequencer(replication=1, release_delay_ms=0)
    # The helper's first append is done: nothing in flight.
    assert sequencer.inflight_tail() == sequencer.release_lsn == compose_lsn(Epoch(1), Esn(1))
    a = stores(sequencer.on_append(2, (b"a",), None, 1, 0))[0]
    b = stores(sequencer.on_append(3, (b"b", b"c"), None, 1, 0))[0]
    assert sequencer.inflight_tail() == b.message.last_lsn > sequencer.release_lsn
    sequencer.on_stored(a.node, a.message.lsn, 1, Status.OK, Epoch(0), None, 1)
    assert sequencer.release_lsn == a.message.lsn < sequencer.inflight_tail()
    sequencer.on_stored(b.node, b.message.lsn, 1, Status.OK, Epoch(0), None, 2)
    assert sequencer.inflight_tail() == sequencer.release_lsn == b.message.last_lsn
