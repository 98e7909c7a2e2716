"""Pure decisions of retention and disk reclaim on a storage node (no I/O, no clock).

Retention by age (LogDevice's per-log ``backlog``): each storage node trims its own copy of a
log up to the last record it holds that is older than ``now - backlog_ms``, never above its
release pointer. A record's age is taken from the running maximum of the timestamps the node
holds up to it (``LogIndex.last_before_time``), so a younger record held here is never trimmed
early, whatever order its timestamp came in. Records the node does not hold are covered by
the sequencer: it never stamps a record older than one before it (``Sequencer.
timestamp_floor_ms``; an append that waited for activation or a producer lookup would keep
its arrival time otherwise), so every record at or below the trim point, held here or on
another node, is older too. The bound that remains: across a failover the new sequencer node's
clock may be behind the old one's, and a record of the old epoch on another node may then be
trimmed early (readers take the highest trim point they are told) by at most that clock
difference. The trim point goes no further than a record this node holds: another node may
hold a younger record just above.

Reclaim: a closed segment none of whose entries the index points at any more is deleted; one
whose live bytes are below a fraction of its size is compacted. The segment new entries go to
is never touched, nor one with corruption in it (bytes past a bad entry may be acknowledged
records nobody could index).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shared.config import ClusterConfig
from shared.types import LogId, Lsn
from storage_node.core.store_machine import LSN_READABLE_MAX


class BacklogTable:
    """Per log id, its retention in ms (0: forever): the cluster default and the ranges that
    override it, looked up by binary search."""

    def __init__(self, default_ms: int, ranges: Iterable[tuple[int, int, int]] = ()) -> None:
        ordered = sorted(ranges)
        self._firsts = [first for first, _last, _backlog in ordered]
        self._ranges = ordered
        self._default_ms = default_ms
        self.any = default_ms > 0 or any(backlog > 0 for _f, _l, backlog in ordered)
        """Whether some log has a finite backlog (else retention has nothing to do)."""

    @staticmethod
    def of(cluster: ClusterConfig) -> BacklogTable:
        return BacklogTable(cluster.log_backlog_ms, (
            (b.first_log_id, b.last_log_id, b.backlog_ms) for b in cluster.log_backlogs))

    def backlog_ms(self, log_id: int) -> int:
        index = bisect.bisect_right(self._firsts, log_id) - 1
        if index >= 0:
            _first, last, backlog_ms = self._ranges[index]
            if log_id <= last:
                return backlog_ms
        return self._default_ms


def age_trim_lsn(*, last_older_lsn: Lsn | None, release_lsn: Lsn,
                 trim_lsn: Lsn) -> Lsn | None:
    """The trim point to raise to: the last LSN held here whose records are all older than
    the cutoff (``last_older_lsn``, from the index), capped by the release pointer. None when
    that does not raise ``trim_lsn``."""
    if last_older_lsn is None:
        return None
    target = min(last_older_lsn, release_lsn, LSN_READABLE_MAX)
    return Lsn(target) if target > trim_lsn else None


def plan_age_trims(log_ids: Iterable[LogId], *, now_ms: int, backlogs: BacklogTable,
                   release_lsn: Callable[[LogId], Lsn], trim_lsn: Callable[[LogId], Lsn],
                   last_older_lsn: Callable[[LogId, int], Lsn | None]
                   ) -> list[tuple[LogId, Lsn]]:
    """``(log_id, trim_lsn)`` for every log whose trim point age retention raises now.
    ``last_older_lsn(log_id, cutoff_ms)`` asks the index for the last LSN held below a time;
    ``trim_lsn`` is the durable trim point (a trim not yet written is decided again)."""
    trims: list[tuple[LogId, Lsn]] = []
    if not backlogs.any:
        return trims
    for log_id in log_ids:
        backlog_ms = backlogs.backlog_ms(log_id)
        if backlog_ms <= 0:
            continue
        target = age_trim_lsn(last_older_lsn=last_older_lsn(log_id, now_ms - backlog_ms),
                              release_lsn=release_lsn(log_id), trim_lsn=trim_lsn(log_id))
        if target is not None:
            trims.append((log_id, target))
    return trims


@dataclass(frozen=True, slots=True)
class SegmentUsage:
    segment_id: int
    file_bytes: int
    live_bytes: int
    """Bytes of the STORE entries the index still points at; everything else in the file
    (trimmed or replaced records, pointers summarised by a checkpoint) is dead."""


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    delete: tuple[int, ...] = ()
    compact: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.delete or self.compact)


def plan_reclaim(segments: Iterable[SegmentUsage], *, newest_segment_id: int,
                 excluded: frozenset[int] = frozenset(), live_fraction_max: float,
                 copy_bytes_max: int, deletes_max: int) -> ReclaimPlan:
    """What one reclaim pass does: delete up to ``deletes_max`` dead segments (oldest first)
    and compact the segments below ``live_fraction_max`` live that free the most bytes, copying
    at most ``copy_bytes_max`` live bytes (the first one is taken whatever its size, so that
    a big segment is not starved). Segments at or above ``newest_segment_id`` (the one being
    written) and ``excluded`` ones are left alone."""
    closed = sorted((s for s in segments
                     if s.segment_id < newest_segment_id and s.segment_id not in excluded),
                    key=lambda s: s.segment_id)
    delete = tuple(s.segment_id for s in closed if s.live_bytes <= 0)[:deletes_max]
    candidates = sorted(
        (s for s in closed if 0 < s.live_bytes < s.file_bytes * live_fraction_max),
        key=lambda s: (-(s.file_bytes - s.live_bytes), s.segment_id))
    compact: list[int] = []
    copied_bytes = 0
    for usage in candidates:
        if compact and copied_bytes + usage.live_bytes > copy_bytes_max:
            continue
        compact.append(usage.segment_id)
        copied_bytes += usage.live_bytes
    return ReclaimPlan(delete, tuple(sorted(compact)))
