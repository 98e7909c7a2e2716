"""The first wave's store timeout follows the STOREs' real round trips (no spurious waves)."""

from __future__ import annotations

from sequencer.core.sequencer import Sequencer
from sequencer.core.store_timeout import StoreTimeout
from shared.config import SequencerConfig
from shared.status import Status
from shared.types import Epoch
from tests.unit.sequencer.helpers import active_sequencer, replies, stores


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
    wave2 = stores(sequencer.on_timer(110))  # nobody answered within 10 ms
    assert {s.message.wave for s in wave2} == {2}
    stores(sequencer.on_append(3, (b"b",), None, 111, 111))
    first_wave_ms = sequencer.store_timeout.first_wave_ms()
    assert first_wave_ms > 10
    assert 111 + first_wave_ms in {deadline for deadline, _, _ in sequencer._timers}


def test_answers_to_an_earlier_wave_are_not_samples() -> None:
    sequencer = active_sequencer(replication=3)
    first, *_ = stores(sequencer.on_append(2, (b"a",), None, 0, 0))
    lsn = first.message.lsn
    sequencer.on_timer(10)  # wave 2 (backs the estimate off to 10 ms)
    before = sequencer.store_timeout.srtt_ms
    # A wave-1 answer 5 s after wave 1 went out says nothing about wave 2's round trip.
    sequencer.on_stored(first.node, lsn, 1, Status.OK, Epoch(0), None, 5000)
    assert sequencer.store_timeout.srtt_ms == before


def test_estimate_stays_within_the_configured_bounds() -> None:
    config = SequencerConfig(store_timeout_ms_min=10, store_timeout_ms_max=500)
    timeout = StoreTimeout(config)
    assert timeout.first_wave_ms() == 10
    for _ in range(20):
        timeout.on_sample(10_000)
    assert timeout.first_wave_ms() == 500
    for _ in range(200):
        timeout.on_sample(0)
    assert timeout.first_wave_ms() == 10
    timeout.on_silent_timeout(40)
    assert 40 < timeout.first_wave_ms() <= 500


def test_steady_round_trips_leave_room_for_jitter() -> None:
    """With a constant round trip the deviation decays to zero: a slightly slower answer
    must still not count as lost."""
    timeout = StoreTimeout(SequencerConfig(store_timeout_ms_min=10))
    for _ in range(500):
        timeout.on_sample(60)
    assert timeout.first_wave_ms() >= 120
