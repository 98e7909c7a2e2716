"""Which LSNs of a donor's copy the node being rebuilt writes (pure).

An LSN's identity must never regress: a donor's copy is written only where this node holds
no copy of equal or higher precedence (``shared.wire.store.copy_precedence``). "Holds" counts
three places: the index (written copies), the writer's queue and the batch being written
(copies a sequencer's STORE, recovery or a CLEAN's purge queued but had not written yet).
The record store writes in queue order and a later entry of an LSN replaces an earlier one,
so:

- a queued copy of equal or higher precedence would be overwritten by the donor's copy queued
  after it: the donor's copy is not written there;
- a queued copy of lower precedence is overwritten by the donor's, as it should be;
- a STORE or recovery copy that arrives after the donor's was queued is written after it and
  wins as any later write does (the store machine's usual seal and wave checks decide whether
  it is written at all).

An indexed copy blocks the donor's unless it is of lower precedence. The index keeps no flags
or wave, so where a donor's copy that could outrank anything (above ``PRECEDENCE_LOWEST``)
meets an indexed copy, the driver reads that copy's precedence from its segment
(``contested``: which ranges to read, bounded by the slice) and, if the copy it read is still
the one indexed, lets the donor's copy replace it there (``outranked``). Such an older copy
is what a damaged segment leaves behind when it held the newer copy of an LSN (a recovery's
plug or bridge over a record copy, a later wave): without this the node kept serving it.

Ranges are inclusive ``(first_lsn, last_lsn)`` pairs.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

Precedence = tuple[int, int]
"""``copy_precedence(flags, wave)``."""

HeldCopy = tuple[int, int, Precedence, object]
"""A copy the node indexes, read: first and last LSN the index resolves to it, its
precedence, and which copy it is (a key equal for the same copy only)."""

PRECEDENCE_LOWEST: Precedence = (0, 1)
"""A sequencer's first wave (waves start at 1): outranks no copy, so it never needs a read."""


def contested(held: Sequence[tuple[int, int]],
              copies: Iterable[tuple[int, int, Precedence]]) -> list[tuple[int, int]]:
    """The sorted, merged parts of ``held`` (sorted) that donor ``copies`` above
    ``PRECEDENCE_LOWEST`` overlap: where the held copy's precedence must be read."""
    firsts = [lo for lo, _ in held]
    found: list[tuple[int, int]] = []
    for first, last, precedence in copies:
        if precedence <= PRECEDENCE_LOWEST:
            continue
        at = max(0, bisect.bisect_right(firsts, first) - 1)
        while at < len(held) and held[at][0] <= last:
            lo, hi = held[at]
            if hi >= first:
                found.append((max(lo, first), min(hi, last)))
            at += 1
    return _merged(found)


def outranked(read: Iterable[HeldCopy],
              current: Iterable[tuple[int, int, object]],
              donor: Precedence) -> list[tuple[int, int]]:
    """The sorted, merged ranges where the index still resolves to a copy that was read
    (``read``: first, last, precedence, which copy; ``current``: first, last, which copy, as
    the index is now) of lower precedence than ``donor``: there the donor's copy replaces it.
    A copy written since the read (another key) is not outranked: the donor's copy does not
    go there."""
    now: dict[object, list[tuple[int, int]]] = {}
    for first, last, key in current:
        now.setdefault(key, []).append((first, last))
    found: list[tuple[int, int]] = []
    for first, last, precedence, key in read:
        if precedence >= donor:
            continue
        for lo, hi in now.get(key, ()):
            if lo <= last and hi >= first:
                found.append((max(lo, first), min(hi, last)))
    return _merged(found)


def queued_winners(queued: Iterable[tuple[int, int, Precedence]],
                   donor: Precedence) -> list[tuple[int, int]]:
    """The sorted, merged ranges of ``queued`` copies whose precedence is at least
    ``donor``'s: where the donor's copy must not go."""
    return _merged([(first, last) for first, last, precedence in queued
                    if precedence >= donor])


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
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
