"""What a rebuild repairs (its scope), pure: the whole shard, or a mini-rebuild of the LSN
ranges that damaged copies were in.

A storage node that finds copies damaged (its start-up scan or the background scrub finds a
bad entry in a segment, a read finds an entry that does not match its index) lost only what
that segment or entry held, not its whole shard. LogDevice repairs such a loss with
mini-rebuilding: only the dirty ranges are re-replicated (there by time range, from the
partitions a crash left dirty); here by LSN range per log, from what the node's own index
knows:

- a read's bad entry: its log and LSNs, exactly (the index located it);
- a damaged segment: every log its index file lists, each from the first to the last LSN of
  the copies the segment held (``segment_scope``), when that index file is readable and
  covers every byte of the segment; without one (no index file yet, a damaged directory,
  bytes written after the last checkpoint of the newest segment), what the segment held is
  unknown, and the whole shard is rebuilt (``None``, "unranged").

The scope is over-approximate on purpose: a range may include LSNs the node never held
(copies of other nodes' records between its own); donors send those too and the node writes
what it lacks, as a whole-shard rebuild does. It must never be smaller than what was lost.

Damage found while a rebuild runs (its donors may already have passed copies that are gone
again) begins the rebuild again for a new generation (``storage_node.core.rebuild.
target_step``); its scope is the old one merged with the new damage's (``merged``), so
several damages reported while one mini-rebuild runs are all covered, and any unranged one
makes it a whole-shard rebuild.

Scopes are ``shared.cluster_state.DirtyRanges`` (per log ascending, ranges inclusive,
ascending, disjoint), kept in the cluster state; ``None`` here means the whole shard (in the
cluster state: ``()``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from shared.authority import normalized
from shared.cluster_state import DIRTY_RANGES_MAX, DirtyRanges, ShardState, ShardStatus
from shared.types import LSN_MAX

Scope = DirtyRanges | None
"""A rebuild's scope: per log its LSN ranges, or None for the whole shard."""


def scope_of(ranges: Iterable[tuple[int, int, int]]) -> Scope:
    """The scope of ``(log_id, first_lsn, last_lsn)`` triples: per log, the ranges joined
    (overlapping and adjacent ones). Past ``DIRTY_RANGES_MAX`` ranges each log's ranges become
    one (from its first to its last LSN: more is repaired, never less); past that many logs,
    the whole shard (None), as for a range that is not one (from a damaged index: what it
    stands for is unknown)."""
    per_log: dict[int, list[tuple[int, int]]] = {}
    for log_id, first, last in ranges:
        if not (0 < first <= last <= LSN_MAX and 0 < log_id < 2**62):
            return None
        per_log.setdefault(log_id, []).append((first, last))
    scope = tuple((log_id, normalized(per_log[log_id])) for log_id in sorted(per_log))
    if sum(len(r) for _, r in scope) <= DIRTY_RANGES_MAX:
        return scope
    if len(scope) > DIRTY_RANGES_MAX:
        return None
    return tuple((log_id, ((r[0][0], r[-1][1]),)) for log_id, r in scope)


def triples(scope: DirtyRanges) -> list[tuple[int, int, int]]:
    return [(log_id, lo, hi) for log_id, ranges in scope for lo, hi in ranges]


def merged(a: Scope, b: Scope) -> Scope:
    """Both scopes' ranges; None (the whole shard) if either is."""
    if a is None or b is None:
        return None
    return scope_of([*triples(a), *triples(b)])


def segment_scope(runs: Mapping[int, Iterable[tuple[int, int]]]) -> Scope:
    """The scope of a damaged segment from its index: per log (``runs``: its copies'
    ``(first_lsn, last_lsn)``), one range from its first to its last LSN. Copies of a log in
    a segment are rarely contiguous (each node holds only the records whose copyset names
    it), so one range per log keeps the scope small; the LSNs between are walked too."""
    ranges: list[tuple[int, int, int]] = []
    for log_id, pieces in runs.items():
        firsts_lasts = list(pieces)
        if firsts_lasts:
            ranges.append((log_id, min(f for f, _ in firsts_lasts),
                           max(last for _, last in firsts_lasts)))
    return scope_of(ranges)


def of_shard(shard: ShardState) -> Scope:
    """The scope the cluster state records for ``shard``'s rebuild."""
    return shard.dirty if shard.dirty else None


def as_dirty(scope: Scope) -> DirtyRanges:
    """The cluster state's form (``()``: the whole shard)."""
    return scope if scope else ()


# ---- what the node being rebuilt does at a poll ------------------------------------------


class TargetStep(Enum):
    NOTHING = "nothing"
    START = "start"
    """Damage was found while the shard is authoritative: rebuild the damage's scope (a
    mini-rebuild, or the whole shard if it is unranged) for the current generation."""
    RESTART = "restart"
    """Damage was found since this rebuild began (a restart's scan, a read): copies the
    donors already sent may be gone again, and their walks will not come back for them. The
    rebuild begins again, for a new generation (every donor walks from the start; what the
    node still holds is not written twice), over the old scope and the new damage's."""
    FINISH = "finish"
    """Every donor is done: vouch for everything again, then record AUTHORITATIVE."""


@dataclass(frozen=True, slots=True)
class TargetDecision:
    step: TargetStep
    dirty: DirtyRanges = ()
    """START/RESTART: the scope to record (``()``: the whole shard)."""


def target_decision(shard: ShardState | None, generation: int, *, damaged: bool,
                    damage_found: int, damage_covered: int, pending: Scope) -> TargetDecision:
    """What the node whose shard ``shard`` is (as the cluster state says) does at a poll, with
    its disk of ``generation`` and its authority status: whether it is unsure of anything
    (``damaged``), its damage counters, and the scope of the damage it found since it last
    vouched for everything (``pending``: ``AuthorityStatus.damage_scope``)."""
    if shard is None:
        return TargetDecision(TargetStep.NOTHING)
    if shard.status is ShardStatus.REBUILDING:
        if shard.rebuild_generation != generation:
            return TargetDecision(TargetStep.NOTHING)
        if damage_found > damage_covered:
            return TargetDecision(TargetStep.RESTART, as_dirty(merged(of_shard(shard), pending)))
        return TargetDecision(TargetStep.FINISH if shard.donors_done else TargetStep.NOTHING)
    if shard.status is ShardStatus.AUTHORITATIVE and shard.generation == generation and damaged:
        return TargetDecision(TargetStep.START, as_dirty(pending))
    return TargetDecision(TargetStep.NOTHING)
