"""The pure parts of retention: backlog lookup and config validation, age trim decisions,
reclaim planning, the index bookkeeping behind them, and the checkpoint folding rule."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.config import ClusterConfig, LogBacklog, StorageConfig, cluster_from_dict
from shared.types import Epoch, LogId, Lsn, NodeId
from storage_node.core.retention import (
    BacklogTable,
    ReclaimPlan,
    SegmentUsage,
    age_trim_lsn,
    plan_age_trims,
    plan_reclaim,
)
from storage_node.core.store_machine import LSN_READABLE_MAX
from storage_node.durable_state import DurableState
from storage_node.record_index import Location, LogIndex, RecordIndex
from storage_node.segment_format import (
    CheckpointEntry,
    EntryType,
    ScannedEntry,
    SealEntry,
    StoreMeta,
    decode_meta,
    encode_checkpoint,
    scan_segment,
)

# ---- configuration ----


def test_backlog_table_uses_ranges_then_the_default() -> None:
    table = BacklogTable(5_000, [(100, 199, 0), (10, 19, 60_000), (200, 200, 1)])
    assert [table.backlog_ms(i) for i in (1, 10, 19, 20, 99, 100, 199, 200, 201)] == [
        5_000, 60_000, 60_000, 5_000, 5_000, 0, 0, 1, 5_000]
    assert table.any and not BacklogTable(0, [(1, 5, 0)]).any
    assert BacklogTable(0, [(1, 5, 7)]).any


def test_cluster_config_parses_and_checks_backlogs() -> None:
    cluster = cluster_from_dict({"log_backlog_ms": 1000, "log_backlogs": [
        {"first_log_id": 5, "last_log_id": 9, "backlog_ms": 0}]})
    assert cluster.log_backlogs == (LogBacklog(first_log_id=5, last_log_id=9, backlog_ms=0),)
    table = BacklogTable.of(cluster)
    assert (table.backlog_ms(4), table.backlog_ms(5)) == (1000, 0)
    assert cluster.fingerprint() != ClusterConfig().fingerprint()
    bad: list[tuple[dict[str, object], str]] = [
        ({"log_backlog_ms": -1}, "log_backlog_ms=-1 is outside"),
        ({"log_backlog_ms": "1h"}, "is not an integer"),
        ({"log_backlogs": {"first_log_id": 1}}, "must be a list"),
        ({"log_backlogs": [{"first_log_id": 1, "last_log_id": 2}]}, "missing"),
        ({"log_backlogs": [{"first_log_id": 1, "last_log_id": 2, "backlog_ms": 1,
                            "extra": 1}]}, "unknown settings"),
        ({"log_backlogs": [{"first_log_id": 9, "last_log_id": 2, "backlog_ms": 1}]},
         "last_log_id=2 is outside"),
        ({"log_backlogs": [{"first_log_id": 0, "last_log_id": 2, "backlog_ms": 1}]},
         "first_log_id=0 is outside"),
        ({"log_backlogs": [{"first_log_id": 1, "last_log_id": 5, "backlog_ms": 1},
                           {"first_log_id": 5, "last_log_id": 8, "backlog_ms": 2}]},
         "overlap"),
    ]
    for data, message in bad:
        with pytest.raises((ValueError, TypeError), match=message):
            cluster_from_dict(data)


def test_storage_config_checks_reclaim_settings() -> None:
    for settings in ({"retention_interval_ms": 0}, {"compaction_live_fraction_max": 1.5},
                     {"reclaim_bytes_per_pass_max": 10}):
        with pytest.raises(ValueError, match=next(iter(settings))):
            StorageConfig(**settings)  # type: ignore[arg-type]


# ---- age trims ----


def test_age_trim_is_capped_by_release_and_never_lowers() -> None:
    assert age_trim_lsn(last_older_lsn=None, release_lsn=Lsn(50), trim_lsn=Lsn(0)) is None
    assert age_trim_lsn(last_older_lsn=Lsn(40), release_lsn=Lsn(50), trim_lsn=Lsn(0)) == 40
    assert age_trim_lsn(last_older_lsn=Lsn(60), release_lsn=Lsn(50), trim_lsn=Lsn(0)) == 50
    assert age_trim_lsn(last_older_lsn=Lsn(60), release_lsn=Lsn(50), trim_lsn=Lsn(50)) is None
    assert age_trim_lsn(last_older_lsn=Lsn(30), release_lsn=Lsn(50), trim_lsn=Lsn(40)) is None
    assert age_trim_lsn(last_older_lsn=Lsn(2**64 - 1), release_lsn=Lsn(2**64 - 1),
                        trim_lsn=Lsn(0)) == LSN_READABLE_MAX


def test_plan_age_trims_asks_the_index_with_each_logs_cutoff() -> None:
    asked: list[tuple[int, int]] = []

    def last_older(log_id: LogId, cutoff_ms: int) -> Lsn | None:
        asked.append((log_id, cutoff_ms))
        return Lsn(10 * log_id)

    trims = plan_age_trims(
        [LogId(1), LogId(2), LogId(3)], now_ms=100_000,
        backlogs=BacklogTable(1_000, [(2, 2, 0)]), release_lsn=lambda log: Lsn(25),
        trim_lsn=lambda log: Lsn(10 if log == 1 else 0), last_older_lsn=last_older)
    assert trims == [(3, 25)]  # log 1 is already there, log 2 keeps forever, 3 is capped
    assert asked == [(1, 99_000), (3, 99_000)]
    assert plan_age_trims([LogId(1)], now_ms=1, backlogs=BacklogTable(0),
                          release_lsn=lambda log: Lsn(1), trim_lsn=lambda log: Lsn(0),
                          last_older_lsn=last_older) == []


# ---- reclaim plan ----


def test_plan_reclaim_spares_the_newest_and_corrupt_segments() -> None:
    segments = [SegmentUsage(1, 1000, 0), SegmentUsage(2, 1000, 100), SegmentUsage(3, 1000, 900),
                SegmentUsage(4, 1000, 0), SegmentUsage(5, 1000, 0), SegmentUsage(6, 1000, 10)]
    plan = plan_reclaim(segments, newest_segment_id=6, excluded=frozenset({4}),
                        live_fraction_max=0.5, copy_bytes_max=10_000, deletes_max=10)
    assert plan == ReclaimPlan(delete=(1, 5), compact=(2,))
    assert not plan_reclaim(segments, newest_segment_id=1, live_fraction_max=0.5,
                            copy_bytes_max=10_000, deletes_max=10)
    no_compaction = plan_reclaim(segments, newest_segment_id=6, live_fraction_max=0.0,
                                 copy_bytes_max=10_000, deletes_max=1)
    assert no_compaction == ReclaimPlan(delete=(1,), compact=())


def test_plan_reclaim_bounds_the_bytes_copied_and_prefers_the_emptiest() -> None:
    segments = [SegmentUsage(i, 1000, live) for i, live in
                enumerate((400, 100, 300, 200), start=1)]
    plan = plan_reclaim(segments, newest_segment_id=99, live_fraction_max=0.5,
                        copy_bytes_max=350, deletes_max=10)
    assert plan.compact == (2, 4)  # 100 + 200 live bytes; 300 more would pass 350
    big = plan_reclaim([SegmentUsage(1, 10_000, 4_000)], newest_segment_id=2,
                       live_fraction_max=0.5, copy_bytes_max=100, deletes_max=10)
    assert big.compact == (1,)  # one segment bigger than the budget still goes, alone


# ---- index bookkeeping ----


def loc(first: int, last: int, segment_id: int = 1, offset: int | None = None,
        timestamp_ms: int = 0) -> Location:
    return Location(segment_id, first * 100 if offset is None else offset, 100, Lsn(first),
                    Lsn(last), timestamp_ms=timestamp_ms)


def test_live_bytes_follow_inserts_replacements_and_trims() -> None:
    index = RecordIndex()
    index.insert(LogId(1), loc(1, 10, segment_id=1, offset=0))
    index.insert(LogId(1), loc(11, 20, segment_id=1, offset=100))
    index.insert(LogId(2), loc(1, 5, segment_id=2, offset=0))
    assert index.refs.live_bytes == {1: 200, 2: 100}
    index.insert(LogId(1), loc(4, 6, segment_id=2, offset=100))  # splits entry 1..10
    assert index.refs.live_bytes == {1: 200, 2: 200}
    assert index.refs.entries[1][0][0] == 2  # two pieces of one entry
    index.drop_through(LogId(1), Lsn(8))
    assert index.refs.live_bytes == {1: 200, 2: 100}  # 4..6 went; 9..10 keeps entry 1 alive
    assert index.locations(LogId(1))[0] == Location(1, 0, 100, Lsn(9), Lsn(10), Lsn(1), 0)
    index.insert(LogId(1), loc(9, 20, segment_id=3, offset=0))
    assert index.refs.live_bytes == {2: 100, 3: 100}
    index.drop_through(LogId(2), Lsn(5))
    assert index.refs.live_bytes == {3: 100} and index.log_ids() == [LogId(1)]
    assert index.entries_count == 1


def test_relocate_moves_every_piece_of_a_compacted_entry() -> None:
    index = RecordIndex()
    index.insert(LogId(1), loc(1, 10, segment_id=1, offset=500))
    index.insert(LogId(1), loc(4, 5, segment_id=2, offset=0))
    index.insert(LogId(1), loc(11, 12, segment_id=1, offset=700))
    index.relocate(1, {500: 0, 700: 100}, version=1)
    assert [(x.segment_id, x.offset, x.first_lsn, x.last_lsn, x.stored_first_lsn, x.version)
            for x in index.locations(LogId(1))] == [
        (1, 0, 1, 3, 1, 1), (2, 0, 4, 5, 4, 0), (1, 0, 6, 10, 1, 1), (1, 100, 11, 12, 11, 1)]
    assert sorted(index.refs.entries[1]) == [0, 100]
    assert index.refs.live_bytes[1] == 200


def test_last_before_time_stops_at_the_first_young_record() -> None:
    log = LogIndex()
    for first, ts in ((1, 10), (5, 20), (9, -1), (13, 30), (17, 25), (21, 40)):
        log.insert(loc(first, first + 3, timestamp_ms=ts))
    assert log.last_before_time(10) is None
    assert log.last_before_time(11) == 4
    assert log.last_before_time(30) == 12  # the hole (-1) counts as old
    # 25 comes after a 30: the running maximum keeps it young.
    assert log.last_before_time(31) == 20
    assert log.last_before_time(100) == 24
    log.drop_through(Lsn(6))
    assert log.last_before_time(21) == 12
    assert log.find_time(21) == 13
    assert log.locate(Lsn(1), Lsn(100), 100)[0] == Location(1, 500, 100, Lsn(7), Lsn(8), Lsn(5),
                                                            20)


# ---- checkpoints ----


def test_checkpoint_entry_round_trips_through_the_segment_format() -> None:
    entry = CheckpointEntry(LogId(7), Lsn(99), NodeId("seq"), Lsn(90), Epoch(3),
                            NodeId("rec"), Lsn(50), ((1, 5, 9), (2, 0, 1)))
    empty = CheckpointEntry(LogId(8), Lsn(0), None, Lsn(0), Epoch(0), None, Lsn(0), ())
    scan = scan_segment(encode_checkpoint(entry) + encode_checkpoint(empty))
    assert [s.entry for s in scan.entries] == [entry, empty] and scan.bad_offset is None


def fold(entries: list[object]) -> DurableState:
    state = DurableState(RecordIndex())
    for position, entry in enumerate(entries):
        state.on_entry(1, ScannedEntry(position * 100, 100, entry))  # type: ignore[arg-type]
    state.finish_recovery()
    return state


def test_a_checkpoint_replaces_the_entries_before_it() -> None:
    store = StoreMeta(LogId(1), Lsn(2**32 + 1), 3, NodeId("seq-a"), 2, 0, 1000)
    seal_first = SealEntry(LogId(1), Epoch(4), NodeId("first"))
    seal_again = SealEntry(LogId(1), Epoch(4), NodeId("second"))
    whole = fold([seal_first, store, seal_again])
    checkpoint = whole.checkpoint(LogId(1))
    assert (checkpoint.sealed_epoch, checkpoint.sealed_by) == (4, "first")
    # The first SEAL was in a deleted segment: the later one of the same epoch comes first
    # in the scan now, and the checkpoint after it restores who sealed first.
    kept = fold([seal_again, checkpoint])
    assert kept.states() == whole.states()
    # Entries after the checkpoint still count, as they would have anyway.
    newer = StoreMeta(LogId(1), Lsn(2**33 + 1), 1, NodeId("seq-b"), 0, 0, 2000)
    assert fold([checkpoint, newer]).states() == fold([seal_first, store, newer]).states()


def test_a_settled_mark_survives_checkpoints_and_is_no_last_known_good() -> None:
    """A CLEAN's mark (a checkpoint holding only it, ``RecordStore.submit_clean_mark``) is
    folded highest-wins, carried by every later checkpoint, and read back after a round trip
    through the format; it never raises the epoch's last-known-good ESN."""
    store = StoreMeta(LogId(1), Lsn(2**32 + 2), 4, NodeId("seq-a"), 1, 0, 1000)
    mark = CheckpointEntry(LogId(1), Lsn(0), None, Lsn(0), Epoch(0), None, Lsn(0), (),
                           ((1, 5),))
    lower = dataclasses.replace(mark, settled=((1, 3),))
    whole = fold([store, mark, lower])
    state = whole.states()[LogId(1)]
    assert (state.epoch_tails, state.settled) == ({1: (1, 5)}, {1: 5})
    checkpoint = whole.checkpoint(LogId(1))
    assert checkpoint.settled == ((1, 5),)
    scanned = scan_segment(encode_checkpoint(checkpoint) + encode_checkpoint(mark))
    assert [s.entry for s in scanned.entries] == [checkpoint, mark]
    assert fold([checkpoint]).states() == whole.states()
    assert fold([mark]).states()[LogId(1)].settled == {1: 5}


_FIELD = st.one_of(st.integers(-3, 2**64 - 1), st.text(max_size=4), st.none(),
                   st.lists(st.lists(st.integers(-2, 2**33), max_size=4), max_size=3))


_SHAPED = st.tuples(
    st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.text(max_size=4),
    st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.text(max_size=4),
    st.integers(0, 2**64 - 1), st.lists(st.lists(st.integers(0, 2**32), max_size=4),
                                        max_size=3),
    st.lists(st.lists(st.integers(0, 2**32), max_size=3), max_size=3),
).flatmap(lambda base: st.integers(7, 9).map(lambda count: list(base)[:count]))


@given(st.one_of(st.lists(_FIELD, max_size=10), _SHAPED))
def test_fuzz_checkpoint_bodies_never_raise(fields: list[object]) -> None:
    """Any CHECKPOINT body decodes to an entry or to None (a bad entry), never raises; what
    decodes encodes back to itself."""
    entry = decode_meta(EntryType.CHECKPOINT, msgpack.packb(fields))
    if entry is not None:
        assert isinstance(entry, CheckpointEntry)
        scanned = scan_segment(encode_checkpoint(entry))
        assert [s.entry for s in scanned.entries] == [entry]
