"""The pure cross-log STORE batcher: per-node chunks in staging order within their limits,
RELEASEs coalesced per log, and a chunk's answer split back into one per STORE; and the
core's owed RELEASEs leaving early with a batch."""

from __future__ import annotations

from sequencer.core.store_batcher import StoreBatcher, chunk_answers
from shared.effects import Send
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.release import Release
from shared.wire.store import Store, payloads_checksum
from shared.wire.store_batch import ReleaseBatch, StoredBatch
from tests.unit.sequencer.helpers import active_sequencer, stores

N1, N2 = NodeId("n1"), NodeId("n2")


def store(log_id: int, size: int = 10) -> Store:
    payloads = (b"x" * size,)
    return Store(log_id=LogId(log_id), lsn=Lsn((1 << 32) + 1), wave=1, sequencer_node="s",
                 copyset=(N1, N2), timestamp_ms=0, last_known_good=0, release_lsn=0,
                 timeout_ms=10, key=None, payloads=payloads, checksum=payloads_checksum(payloads))


def test_stores_go_per_node_in_staging_order() -> None:
    batcher: StoreBatcher[str] = StoreBatcher()
    assert not batcher
    assert batcher.add(N1, store(1), "a") is True  # the first: the driver schedules a take
    assert batcher.add(N2, store(1), "a") is False
    assert batcher.add(N1, store(2), "b") is False
    assert batcher
    chunks = batcher.take()
    assert [(node, [(owner, s.log_id) for owner, s in chunk]) for node, chunk in chunks] == [
        (N1, [("a", 1), ("b", 2)]), (N2, [("a", 1)])]
    assert not batcher and batcher.take() == []
    assert batcher.add(N1, store(3), "c") is True


def test_chunks_keep_within_their_limits_and_big_stores_go_alone() -> None:
    batcher: StoreBatcher[int] = StoreBatcher(stores_max=3, bytes_max=1000)
    sizes = [10, 10, 10, 10, 2000, 400, 400, 400]
    for index, size in enumerate(sizes):
        batcher.add(N1, store(index + 1, size), index)
    chunks = [[owner for owner, _ in chunk] for _, chunk in batcher.take()]
    assert chunks == [[0, 1, 2], [4], [3, 5], [6, 7]]
    assert sorted(owner for chunk in chunks for owner in chunk) == list(range(len(sizes)))


def test_stores_max_one_sends_every_store_and_release_alone() -> None:
    batcher: StoreBatcher[int] = StoreBatcher(stores_max=1)
    for index in range(3):
        batcher.add(N1, store(index + 1), index)
        batcher.add_release(N1, Release(log_id=LogId(index + 1), release_lsn=Lsn(5)))
    assert [len(chunk) for _, chunk in batcher.take()] == [1, 1, 1]
    assert [type(m) for _, m in batcher.take_releases()] == [Release] * 3


def test_releases_keep_each_logs_highest_pointer_per_node() -> None:
    batcher: StoreBatcher[int] = StoreBatcher()
    assert batcher.add_release(N1, Release(log_id=LogId(1), release_lsn=Lsn(5))) is True
    batcher.add_release(N1, Release(log_id=LogId(1), release_lsn=Lsn(9)))
    batcher.add_release(N1, Release(log_id=LogId(1), release_lsn=Lsn(7)))
    batcher.add_release(N1, Release(log_id=LogId(2), release_lsn=Lsn(3)))
    batcher.add_release(N2, Release(log_id=LogId(2), release_lsn=Lsn(3)))
    assert batcher.add(N1, store(1), 0) is False  # releases staged already count
    assert batcher.take_releases() == [
        (N1, ReleaseBatch(releases=((1, 9), (2, 3)))),
        (N2, Release(log_id=LogId(2), release_lsn=Lsn(3)))]
    assert batcher.take_releases() == []


def test_chunk_answers_give_each_store_its_own_answer() -> None:
    reply = StoredBatch(statuses=(int(Status.OK), int(Status.PREEMPTED)),
                        seals=((1, 4, "s2"),))
    assert chunk_answers(reply, 2) == [(Status.OK, Epoch(0), None),
                                       (Status.PREEMPTED, Epoch(4), "s2")]
    # The request failed as a whole: every STORE in it failed the same way.
    assert chunk_answers(Status.CONNFAILED, 3) == [(Status.CONNFAILED, Epoch(0), None)] * 3
    # An answer that does not fit (or is not a STORED_BATCH): BADMSG for each.
    assert chunk_answers(reply, 3) == [(Status.BADMSG, Epoch(0), None)] * 3
    assert chunk_answers(object(), 2) == [(Status.BADMSG, Epoch(0), None)] * 2


def test_owed_release_can_leave_now_and_then_no_timer_sends_it() -> None:
    sequencer = active_sequencer(replication=3, release_delay_ms=10)
    first = stores(sequencer.on_append(2, (b"a",), None, 1, 0))
    for send in first:
        sequencer.on_stored(send.node, send.message.lsn, 1, Status.OK, Epoch(0), None, 1)
    released = sequencer.release_lsn
    assert sequencer.deadline_ms() == 1 + 10  # the owed RELEASE is due then
    # The driver sends a STORE_BATCH to these nodes now: the RELEASEs go along.
    now = sequencer.release_owed_now()
    release = Release(log_id=LogId(1), release_lsn=released)
    assert sorted(now, key=lambda e: e.node) == sorted(
        (Send(send.node, release) for send in first), key=lambda e: e.node)
    assert sequencer.deadline_ms() is None and sequencer.release_owed_now() == []
    late = sequencer.on_timer(100)
    assert not [e for e in late if type(e) is Send and type(e.message) is Release]
