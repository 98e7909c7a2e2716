"""Which LSNs of a donor's copy the node being rebuilt writes (pure).

An LSN's identity must never regress: a donor's copy is written only where this node holds
no copy of equal or higher precedence (``shared.wire.store.copy_precedence``). "Holds" counts
three places: the index (written copies: any copy there blocks the donor's, as it did before),
and the writer's queue and the batch being written (copies a sequencer's STORE, recovery or
a CLEAN's purge queued but had not written yet). The record store writes in queue order and
a later entry of an LSN replaces an earlier one, so:

- a queued copy of equal or higher precedence would be overwritten by the donor's copy queued
  after it: the donor's copy is not written there;
- a queued copy of lower precedence is overwritten by the donor's, as it should be;
- a STORE or recovery copy that arrives after the donor's was queued is written after it and
  wins as any later write does (the store machine's usual seal and wave checks decide whether
  it is written at all).

Ranges are inclusive ``(first_lsn, last_lsn)`` pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Precedence = tuple[int, int]
"""``copy_precedence(flags, wave)``."""


def queued_winners(queued: Iterable[tuple[int, int, Precedence]],
                   donor: Precedence) -> list[tuple[int, int]]:
    """The sorted, merged ranges of ``queued`` copies whose precedence is at least
    ``donor``'s: where the donor's copy must not go."""
    ranges = sorted((first, last) for first, last, precedence in queued
                    if precedence >= donor)
    merged: list[tuple[int, int]] = []
    for first, last in ranges:
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def rebuild_pieces(held: Sequence[tuple[int, int]], winners: Sequence[tuple[int, int]],
                   first: int, last: int) -> list[tuple[int, int]]:
    """The parts of ``first..last`` outside both ``held`` (the index) and ``winners``
    (``queued_winners``), each sorted and non-overlapping."""
    gaps = outside(held, first, last)
    if not winners:
        return gaps
    pieces: list[tuple[int, int]] = []
    for lo, hi in gaps:
        pieces.extend(outside(winners, lo, hi))
    return pieces


def outside(ranges: Sequence[tuple[int, int]], first: int, last: int
            ) -> list[tuple[int, int]]:
    """The parts of ``first..last`` outside the sorted ``ranges`` (sorted, inside it)."""
    gaps: list[tuple[int, int]] = []
    cursor = first
    for lo, hi in ranges:
        if hi < cursor:
            continue
        if lo > last:
            break
        if lo > cursor:
            gaps.append((cursor, min(lo - 1, last)))
        cursor = max(cursor, hi + 1)
    if cursor <= last:
        gaps.append((cursor, last))
    return gaps
