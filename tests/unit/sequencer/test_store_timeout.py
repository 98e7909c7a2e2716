"""The first wave's store timeout follows the STOREs' real round trips, per storage node and
per STORE size (no spurious waves), and a node still writing a STORE is not sent it again."""

from __future__ import annotations

from sequencer.core.sequencer import Sequencer
from sequencer.core.store_timeout import (
    ASSUMED_WRITE_BYTES_PER_MS,
    OUTLIER_FACTOR,
    StoreLatency,
    StoreTimeout,
    size_class,
)
from shared.config import SequencerConfig
from shared.status import Status
from shared.types import Epoch, NodeId
from tests.unit.sequencer.helpers import NODES, active_sequencer, replies, stores

MIB = 1 << 20
CONFIG = SequencerConfig(store_timeout_ms_min=10, store_timeout_ms_max=60_000)


def _append_answered_after(sequencer: Sequencer, request_id: int, sent_ms: int,
                           rtt_ms: int) -> None:
    sends = stores(sequencer.on_append(request_id, (b"x" * 1024,), None, sent_ms, sent_ms))
    assert sends and all(s.message.wave == 1 for s in sends)
    done = []
    for send in sends:
        done += replies(sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK,
                                            Epoch(0), None, sent_ms + rtt_ms))
    assert [r.status for r in done] == [Status.OK]


def test_slow_but_steady_stores_get_no_second_wave() -> None:
    # RELEASEs at once: no delayed-release deadline besides the store timeout's.
    sequencer = active_sequencer(replication=3, release_delay_ms=0)
    now_ms = 1000
    for request_id in range(2, 12):
        _append_answered_after(sequencer, request_id, now_ms, 60)
        now_ms += 100
    sends = stores(sequencer.on_append(20, (b"y",), None, now_ms, now_ms))
    deadline_ms = sequencer.deadline_ms()
    assert deadline_ms is not None and deadline_ms > now_ms + 60
    # At the usual round trip nothing is sent again (a fixed 10 ms would resend everything).
    assert stores(sequencer.on_timer(now_ms + 60)) == []
    done = []
    for send in sends:
        done += replies(sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK,
                                            Epoch(0), None, now_ms + 60))
    assert [r.status for r in done] == [Status.OK]


def test_fast_stores_keep_the_configured_minimum() -> None:
    sequencer = active_sequencer(replication=3, release_delay_ms=0)
    for request_id in range(2, 12):
        _append_answered_after(sequencer, request_id, 1000 + request_id, 1)
    stores(sequencer.on_append(20, (b"y",), None, 2000, 2000))
    assert sequencer.deadline_ms() == 2000 + sequencer.config.store_timeout_ms_min


def test_silent_timeout_backs_off_the_next_first_wave() -> None:
    sequencer = active_sequencer(replication=3)
    stores(sequencer.on_append(2, (b"a",), None, 100, 100))
    # Nobody answered within 10 ms: wave 2 waits for wave 1's answers (nothing sent again).
    assert stores(sequencer.on_timer(110)) == []
    stores(sequencer.on_append(3, (b"b",), None, 111, 111))
    first_wave_ms = sequencer.store_latency.timeout_ms(NODES, 1, sequencer.config)
    assert first_wave_ms >= 20  # at least twice what was waited for nothing
    assert 111 + first_wave_ms in {deadline for deadline, _, _ in sequencer._timers}


def test_late_answers_to_an_earlier_wave_are_samples_of_that_wave() -> None:
    sequencer = active_sequencer(replication=3)
    first, *_ = stores(sequencer.on_append(2, (b"a",), None, 0, 0))
    lsn = first.message.lsn
    sequencer.on_timer(10)  # wave 2
    # The reply names wave 1: 400 ms after wave 1 went out is that STORE's round trip (the
    # late answer that shows the timeout was too short).
    sequencer.on_stored(first.node, lsn, 1, Status.OK, Epoch(0), None, 400)
    estimate = sequencer.store_latency.estimate(first.node, 1)
    assert estimate is not None and estimate.srtt_ms is not None
    assert estimate.srtt_ms > 40


def test_estimate_stays_within_the_configured_bounds() -> None:
    config = SequencerConfig(store_timeout_ms_min=10, store_timeout_ms_max=500)
    latency = StoreLatency()
    node = NodeId("a")
    assert latency.timeout_ms([node], 100, config) == 10
    for _ in range(20):
        latency.on_sample(node, 100, 10_000)
    assert latency.timeout_ms([node], 100, config) == 500
    for _ in range(200):
        latency.on_sample(node, 100, 0)
    assert latency.timeout_ms([node], 100, config) == 10
    latency.on_silent_timeout(node, 100, 40)
    assert 40 < latency.timeout_ms([node], 100, config) <= 500


def test_steady_round_trips_leave_room_for_jitter() -> None:
    """With a constant round trip the deviation decays to zero: a slightly slower answer
    must still not count as lost."""
    timeout = StoreTimeout()
    for _ in range(500):
        timeout.on_sample(60)
    assert (timeout.timeout_ms() or 0) >= 120


def test_size_classes_are_four_times_apart() -> None:
    assert [size_class(n) for n in (1, 1024, 1025, 4096, 4097, 256 << 10, MIB, MIB + 1)] == [
        0, 0, 1, 1, 2, 4, 5, 6]
    assert size_class(1 << 62) == 11


def test_a_big_store_gets_more_time_than_small_ones_before_it_was_measured() -> None:
    latency = StoreLatency()
    node = NodeId("a")
    for _ in range(50):
        latency.on_sample(node, 100, 2)
    small = latency.timeout_ms([node], 100, CONFIG)
    assert small == 10
    # No 1 MiB STORE answered yet: its transfer at the assumed slow disk rate is added.
    assert latency.timeout_ms([node], MIB, CONFIG) >= small + MIB // ASSUMED_WRITE_BYTES_PER_MS
    # Once measured, 1 MiB STOREs follow their own round trips; small ones keep theirs.
    for _ in range(50):
        latency.on_sample(node, MIB, 40)
    assert 80 <= latency.timeout_ms([node], MIB, CONFIG) < 100
    assert latency.timeout_ms([node], 100, CONFIG) == small
    # A size in between never gets less time than a smaller one that was measured.
    assert latency.timeout_ms([node], 256 << 10, CONFIG) >= small


def test_each_node_has_its_own_estimate_and_an_outlier_still_times_out() -> None:
    latency = StoreLatency()
    fast, slow, unknown = NodeId("a"), NodeId("b"), NodeId("c")
    for _ in range(50):
        latency.on_sample(fast, 100, 20)
        latency.on_sample(slow, 100, 60)
    assert 40 <= latency.timeout_ms([fast], 100, CONFIG) < 60
    assert latency.timeout_ms([fast, slow], 100, CONFIG) >= 120  # waits for the slower
    for _ in range(50):
        latency.on_sample(slow, 100, 5_000)
    # ... but not for one many times slower than its peers: it times out and is graylisted.
    assert latency.timeout_ms([fast, slow], 100, CONFIG) <= OUTLIER_FACTOR * 60
    assert latency.timeout_ms([unknown], 100, CONFIG) == 10


def test_logs_of_one_process_share_what_they_learned_about_the_nodes() -> None:
    """A sequencer of a log that never wrote 1 MiB records gives its first 1 MiB STORE the
    time another log's 1 MiB STOREs took on the same nodes (a fresh log used to start from
    the 10 ms minimum, and its first big records were all written twice)."""
    shared = StoreLatency()
    busy = active_sequencer(replication=3, release_delay_ms=0, store_latency=shared)
    now_ms = 1000
    for request_id in range(2, 12):
        sends = stores(busy.on_append(request_id, (b"x" * MIB,), None, now_ms, now_ms))
        for send in sends:
            busy.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0), None,
                           now_ms + 150)
        now_ms += 200
    fresh = active_sequencer(replication=3, release_delay_ms=0, store_latency=shared)
    sends = stores(fresh.on_append(2, (b"y" * MIB,), None, now_ms, now_ms))
    assert len(sends) == 3
    assert stores(fresh.on_timer(now_ms + 150)) == []  # no second wave at the usual time
    assert sends[0].message.timeout_ms >= 300


def test_a_node_still_writing_is_not_sent_the_payload_again() -> None:
    sequencer = active_sequencer(replication=3)
    wave1 = stores(sequencer.on_append(2, (b"p" * 4096,), None, 0, 0))
    lsn = wave1[0].message.lsn
    a, b, c = (s.node for s in wave1)
    sequencer.on_stored(a, lsn, 1, Status.OK, Epoch(0), None, 5)
    # b and c are still working on wave 1 when it times out: wave 2 sends nothing and waits.
    assert stores(sequencer.on_timer(100)) == []
    assert sequencer.appenders[next(iter(sequencer.appenders))].wave == 2
    sequencer.on_stored(b, lsn, 1, Status.OK, Epoch(0), None, 120)
    done = replies(sequencer.on_stored(c, lsn, 1, Status.OK, Epoch(0), None, 130))
    assert [r.status for r in done] == [Status.OK]


def test_an_error_of_the_awaited_store_counts_for_the_wave_that_waits() -> None:
    sequencer = active_sequencer(replication=2)
    wave1 = stores(sequencer.on_append(2, (b"p",), None, 0, 0))
    lsn = wave1[0].message.lsn
    a, b = (s.node for s in wave1)
    (c,) = set(NODES) - {a, b}
    sequencer.on_stored(a, lsn, 1, Status.OK, Epoch(0), None, 1)
    assert stores(sequencer.on_timer(100)) == []  # wave 2 waits for b's wave-1 answer
    # b fails its wave-1 STORE: that is wave 2's failure, and a new wave goes out at once.
    wave3 = stores(sequencer.on_stored(b, lsn, 1, Status.OVERLOADED, Epoch(0), None, 101))
    assert [(s.node, s.message.wave) for s in wave3] == [(c, 3)]
    done = replies(sequencer.on_stored(c, lsn, 3, Status.OK, Epoch(0), None, 102))
    assert [r.status for r in done] == [Status.OK]


def test_a_lost_store_is_sent_again_after_one_waiting_wave() -> None:
    sequencer = active_sequencer(replication=3)
    wave1 = stores(sequencer.on_append(2, (b"p",), None, 0, 0))
    lsn = wave1[0].message.lsn
    a, b, c = (s.node for s in wave1)
    sequencer.on_stored(a, lsn, 1, Status.OK, Epoch(0), None, 1)
    sequencer.on_stored(b, lsn, 1, Status.OK, Epoch(0), None, 1)
    assert stores(sequencer.on_timer(100)) == []
    deadline_ms = sequencer.deadline_ms()
    assert deadline_ms is not None
    # c's STORE was lost: the wave after the one that waited sends it again.
    wave3 = stores(sequencer.on_timer(deadline_ms))
    assert [(s.node, s.message.wave) for s in wave3] == [(c, 3)]
    done = replies(sequencer.on_stored(c, lsn, 3, Status.OK, Epoch(0), None, deadline_ms + 1))
    assert [r.status for r in done] == [Status.OK]


def test_a_node_that_never_answers_is_waited_for_once_not_every_other_wave() -> None:
    # No graylisting (fraction 0 clears it at once), so only the appender's own rule keeps a
    # hung node from being preferred as "still working" again after it was sent the payload
    # once more; before the rule it was deferred on every even wave, for ever.
    sequencer = active_sequencer(replication=2, graylist_nodeset_fraction_max=0.0)
    wave = stores(sequencer.on_append(2, (b"p",), None, 0, 0))
    lsn = wave[0].message.lsn
    answering, hung = (s.node for s in wave)
    # The third node is DEAD to the failure detector: every wave's copyset is these two.
    sequencer.set_unavailable_nodes(frozenset(NODES) - {answering, hung})
    sequencer.on_stored(answering, lsn, 1, Status.OK, Epoch(0), None, 1)
    waited = 0
    for _ in range(8):
        deadline_ms = sequencer.deadline_ms()
        assert deadline_ms is not None
        sent = stores(sequencer.on_timer(deadline_ms))
        assert {s.node for s in sent} <= {hung}
        waited += not sent  # a wave that only waits for the hung node's earlier STORE
    assert waited == 1
