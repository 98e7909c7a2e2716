"""RecordIndex: batch entries by first LSN, replacement on re-STORE, lookups mid-batch."""

from __future__ import annotations

import random

from shared.types import LogId, Lsn
from storage_node.record_index import Location, LogIndex, RecordIndex


def loc(first: int, last: int, segment_id: int = 1) -> Location:
    return Location(segment_id, first * 100, 100, Lsn(first), Lsn(last))


def test_locate_starts_inside_a_batch_and_stops_at_records_max() -> None:
    index = LogIndex()
    for first, last in ((1, 5), (6, 6), (10, 19)):
        index.insert(loc(first, last))
    assert index.locate(Lsn(3), Lsn(100), 1000) == [loc(1, 5), loc(6, 6), loc(10, 19)]
    assert index.locate(Lsn(7), Lsn(100), 1000) == [loc(10, 19)]
    assert index.locate(Lsn(3), Lsn(100), 3) == [loc(1, 5)]
    assert index.locate(Lsn(3), Lsn(100), 4) == [loc(1, 5), loc(6, 6)]
    assert index.locate(Lsn(20), Lsn(100), 10) == []
    assert index.last_lsn == 19


def test_restore_of_same_lsns_replaces_the_entry() -> None:
    index = RecordIndex()
    index.insert(LogId(1), loc(5, 9, segment_id=1))
    index.insert(LogId(1), loc(5, 9, segment_id=2))
    assert index.entries_count == 2  # each segment counts its own pieces
    assert index.locate(LogId(1), Lsn(1), Lsn(100), 100) == [loc(5, 9, segment_id=2)]


def test_out_of_order_and_overlapping_inserts_keep_entries_disjoint() -> None:
    index = RecordIndex()
    for first, last in ((10, 12), (1, 3), (20, 20), (5, 6)):
        index.insert(LogId(1), loc(first, last))
    index.insert(LogId(1), loc(2, 11))  # overlaps (1,3), (5,6) and (10,12)
    # The partly covered entries stay visible for the LSNs the new one does not cover.
    assert index.locate(LogId(1), Lsn(1), Lsn(100), 100) == [
        loc(1, 3).narrowed(1, 1), loc(2, 11), loc(10, 12).narrowed(12, 12), loc(20, 20)]
    assert index.entries_count == 4
    assert index.ranges(LogId(1), Lsn(1), Lsn(15)) == [(1, 1), (2, 11), (12, 12)]
    assert index.locate(LogId(2), Lsn(1), Lsn(100), 100) == []


def test_a_single_lsn_inside_a_batch_splits_it() -> None:
    index = RecordIndex()
    index.insert(LogId(1), loc(1, 10, segment_id=1))
    index.insert(LogId(1), loc(4, 4, segment_id=2))  # e.g. recovery plugs a hole at 4
    assert [(x.first_lsn, x.last_lsn, x.segment_id, x.stored_first_lsn)
            for x in index.locate(LogId(1), Lsn(1), Lsn(10), 100)] == [
        (1, 3, 1, 1), (4, 4, 2, 4), (5, 10, 1, 1)]
    assert index.entries_count == 2  # one piece in each segment


def test_find_time_matches_a_brute_force_scan_over_100k_records() -> None:
    rng = random.Random(5)
    index = RecordIndex()
    timestamps: list[tuple[int, int]] = []  # (lsn, timestamp) of every record
    lsn, now_ms = 1, 1_000
    while lsn <= 100_000:
        count = rng.choice((1, 1, 1, 4, 64))
        now_ms += rng.choice((0, 0, 1, 3, 50))  # appends in the same millisecond too
        flags_hole = rng.random() < 0.02  # recovery plugs have no timestamp
        index.insert(LogId(1), Location(1, lsn, 10, Lsn(lsn), Lsn(lsn + count - 1),
                                        timestamp_ms=-1 if flags_hole else now_ms))
        if not flags_hole:
            timestamps.extend((lsn + i, now_ms) for i in range(count))
        lsn += count
    # A recovery plug overwriting one record in the middle.
    plugged = timestamps[len(timestamps) // 2][0]
    index.insert(LogId(1), Location(2, 0, 10, Lsn(plugged), Lsn(plugged), timestamp_ms=-1))
    timestamps = [(lsn, ts) for lsn, ts in timestamps if lsn != plugged]
    for wanted_ms in [0, 1_000, now_ms, now_ms + 1, *rng.sample(range(1_000, now_ms), 300)]:
        expected = next((lsn for lsn, ts in timestamps if ts >= wanted_ms), None)
        assert index.find_time(LogId(1), wanted_ms) == expected, wanted_ms
    assert index.find_time(LogId(2), 0) is None
