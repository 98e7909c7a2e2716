"""Idempotent appends in the sequencer core: duplicates, retries joining in-flight appends,
STALE pairs, lookups after a new epoch, and what a failure or preemption does to them."""

from __future__ import annotations

from typing import Any

from sequencer.core.effects import FetchProducer
from sequencer.core.producers import ProducerTable, Verdict, lookup_candidates
from sequencer.core.sequencer import PendingAppend, Sequencer
from shared.limits import PRODUCER_SEQS_KEPT
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from tests.unit.sequencer.helpers import active_sequencer, replies, stores


def append(sequencer: Sequencer, request_id: int, seq: int, payloads: tuple[bytes, ...] = (b"x",),
           producer_id: str = "p1", now_ms: int = 1) -> list[Any]:
    return sequencer.on_append_group(
        [PendingAppend(request_id, payloads, None, 1000 + request_id, (producer_id, seq))], now_ms)


def store_all(sequencer: Sequencer, effects: list[Any], now_ms: int = 2) -> list[Any]:
    out: list[Any] = []
    for send in stores(effects):
        out.extend(sequencer.on_stored(send.node, send.message.lsn, send.message.wave,
                                       Status.OK, Epoch(0), None, now_ms))
    return out


def test_a_retry_gets_the_original_lsns_and_writes_nothing() -> None:
    sequencer = active_sequencer()
    sent = append(sequencer, 10, seq=1, payloads=(b"a", b"b"))
    assert {s.message.producers for s in stores(sent)} == {
        (("p1", 1, compose_lsn(Epoch(1), Esn(2)), compose_lsn(Epoch(1), Esn(3))),)}
    done = replies(store_all(sequencer, sent))
    assert [(r.request_id, r.status) for r in done] == [(10, Status.OK)]
    retry = append(sequencer, 11, seq=1, payloads=(b"a", b"b"))
    assert not stores(retry)
    (answer,) = replies(retry)
    assert (answer.request_id, answer.status, answer.first_lsn, answer.last_lsn,
            answer.timestamp_ms) == (11, Status.OK, done[0].first_lsn, done[0].last_lsn,
                                     done[0].timestamp_ms)
    # Another producer with the same number, and the next number, are new appends.
    assert stores(append(sequencer, 12, seq=1, producer_id="p2"))
    assert stores(append(sequencer, 13, seq=2))


def test_a_retry_of_an_append_in_flight_gets_its_answer() -> None:
    sequencer = active_sequencer()
    sent = append(sequencer, 10, seq=7)
    assert append(sequencer, 11, seq=7) == []  # joined, nothing sent
    answers = replies(store_all(sequencer, sent))
    assert sorted(r.request_id for r in answers) == [10, 11]
    assert len({(r.status, r.first_lsn, r.last_lsn) for r in answers}) == 1


def test_retries_in_one_group_share_one_write() -> None:
    sequencer = active_sequencer()
    group = [PendingAppend(i, (b"x",), None, 1000, ("p1", 3)) for i in (20, 21, 22)]
    sent = sequencer.on_append_group(group, 1)
    assert all(len(s.message.payloads) == 1 for s in stores(sent))
    answers = replies(store_all(sequencer, sent))
    assert sorted(r.request_id for r in answers) == [20, 21, 22]
    assert len({r.first_lsn for r in answers}) == 1


def test_pairs_older_than_the_remembered_window_are_stale() -> None:
    sequencer = active_sequencer()
    for seq in range(1, PRODUCER_SEQS_KEPT + 3):
        store_all(sequencer, append(sequencer, 100 + seq, seq=seq))
    (stale,) = replies(append(sequencer, 500, seq=2))
    assert stale.status is Status.STALE
    oldest_kept = 3
    (dup,) = replies(append(sequencer, 501, seq=oldest_kept))
    assert dup.status is Status.OK
    # A skipped number above the window's start was never written: it is a new append.
    assert stores(append(sequencer, 502, seq=PRODUCER_SEQS_KEPT + 10))


def test_a_failed_original_fails_its_retries_too() -> None:
    sequencer = active_sequencer(window_appends_max=2)
    assert stores(append(sequencer, 10, seq=1, producer_id="other"))
    assert stores(append(sequencer, 11, seq=1, producer_id="other2"))
    refused = append(sequencer, 12, seq=5)  # window full: nothing written
    assert [r.status for r in replies(refused)] == [Status.SEQNOBUFS]
    # Nothing is in flight for the pair: its retry is a new append (refused again here).
    assert [r.status for r in replies(append(sequencer, 13, seq=5))] == [Status.SEQNOBUFS]


def test_after_a_new_epoch_a_producer_is_looked_up_before_its_appends() -> None:
    sequencer = active_sequencer(epoch=3, lce_epoch=2)
    effects = append(sequencer, 10, seq=4)
    assert effects == [FetchProducer(LogId(1), Epoch(3), "p1")]
    assert append(sequencer, 11, seq=5) == []  # waits behind the lookup
    old = compose_lsn(Epoch(2), Esn(9))
    effects = sequencer.on_producer_fetched(Epoch(3), "p1", [(4, old, old, 77)], 5)
    answers = replies(effects)
    assert [(r.request_id, r.status, r.first_lsn) for r in answers] == [(10, Status.OK, old)]
    assert stores(effects)  # seq 5 is new
    # Another producer needs its own lookup; a failed one refuses its appends (nothing written).
    assert append(sequencer, 12, seq=1, producer_id="p2") == [
        FetchProducer(LogId(1), Epoch(3), "p2")]
    failed = replies(sequencer.on_producer_fetched(Epoch(3), "p2", None, 6))
    assert [(r.request_id, r.status) for r in failed] == [(12, Status.NOTREADY)]
    # A stale lookup answer (an epoch ago) changes nothing.
    assert sequencer.on_producer_fetched(Epoch(2), "p1", [], 7) == []


def test_in_a_first_epoch_no_lookup_is_needed() -> None:
    sequencer = active_sequencer(epoch=1)
    assert stores(append(sequencer, 10, seq=1))


def test_preemption_refuses_appends_waiting_for_a_lookup() -> None:
    sequencer = active_sequencer(epoch=3, lce_epoch=2)
    assert append(sequencer, 10, seq=1, producer_id="waiting") == [
        FetchProducer(LogId(1), Epoch(3), "waiting")]
    sent = stores(sequencer.on_append(11, (b"plain",), None, 5, 1))
    effects = sequencer.on_stored(sent[0].node, sent[0].message.lsn, 1, Status.PREEMPTED,
                                  Epoch(4), NodeId("other"), 2)
    statuses = {r.request_id: r.status for r in replies(effects)}
    assert statuses == {10: Status.NOTREADY, 11: Status.TIMEDOUT}
    # The lookup's late answer finds nothing waiting.
    assert sequencer.on_producer_fetched(Epoch(3), "waiting", [], 3) == []


def test_preempted_epoch_answers_joined_retries_unknown() -> None:
    sequencer = active_sequencer()
    sent = stores(append(sequencer, 10, seq=1))
    append(sequencer, 11, seq=1)  # joins
    append(sequencer, 12, seq=9, producer_id="p2")
    effects = sequencer.on_stored(sent[0].node, sent[0].message.lsn, 1, Status.PREEMPTED,
                                  Epoch(2), NodeId("other"), 3)
    statuses = {r.request_id: r.status for r in replies(effects)}
    assert statuses[10] is Status.TIMEDOUT and statuses[11] is Status.TIMEDOUT
    assert len(sequencer.producers) == 0


def test_table_stays_within_its_bound() -> None:
    table: ProducerTable[int] = ProducerTable(producers_max=2)
    table.complete = True
    assert table.admit("a", 1, 1).verdict is Verdict.NEW
    assert table.admit("b", 1, 2).verdict is Verdict.NEW
    # Both have appends in flight: no room for a third.
    assert table.admit("c", 1, 3).verdict is Verdict.BUSY
    table.completed("a", 1, Lsn(5), Lsn(5), 0)
    # "a" was dropped; from now on the table may miss a producer's appends, so even one it
    # never saw is looked up.
    assert table.admit("c", 1, 3).verdict is Verdict.LOOKUP
    assert not table.complete
    # "a" is now unknown, and the table no longer holds everything: it must be looked up.
    assert table.admit("a", 1, 4).verdict is Verdict.BUSY  # b and c are busy
    table.completed("b", 1, Lsn(6), Lsn(6), 0)
    assert table.admit("a", 1, 4).verdict is Verdict.LOOKUP


def test_lookup_candidates_keep_the_latest_pairs_and_every_range() -> None:
    answers = [((1, 10, 10, 0), (2, 11, 12, 0)), ((2, 11, 12, 0),),
               ((2, 30, 31, 0), (3, 13, 13, 0))]
    merged = lookup_candidates(answers, seqs_kept=2)
    assert merged == {2: [(2, 11, 12, 0), (2, 30, 31, 0)], 3: [(3, 13, 13, 0)]}
