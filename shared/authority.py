"""Authoritative status, pure: which of a storage node's answers are evidence of absence.

A storage node that lost data (a damaged segment found by its start-up scan or by a read,
later a replaced disk) still holds real copies of what it has left, but its "I have nothing
at LSN x" proves nothing where it may have lost x. LogDevice calls such a shard
non-authoritative (its FULLY_AUTHORITATIVE / UNDERREPLICATION states,
``logdevice-digest.md`` §5, §7.1): readers and recovery count only authoritative answers
toward an f-majority, so a record on R nodes is never declared missing because the f-majority
that answered included a node that forgot it.

On the wire a node says so with ``non_authoritative``: the LSN ranges (inclusive, ascending,
disjoint) inside what it was asked about where it cannot vouch for its answer (READ_REPLY,
SEALED, DIGEST, LOG_STATE, FOUND_TIME, PRODUCER_STATE). Empty, the default and the common
case, means fully authoritative; it then costs nothing on the wire. Received ranges are
untrusted: ``checked`` validates them once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.types import LSN_MAX

LsnRange = tuple[int, int]
"""Inclusive ``(first_lsn, last_lsn)``."""
NonAuthoritative = tuple[LsnRange, ...]
RANGES_MAX = 1024
"""Ranges one answer may carry; a node with more merges them (it may say less, never more)."""


def checked(ranges: Any) -> NonAuthoritative | None:
    """``ranges`` from the wire if well formed (a tuple of at most ``RANGES_MAX`` inclusive
    ``(lo, hi)`` int pairs within the LSN space, ascending and disjoint); None otherwise (the
    answer is then not used)."""
    if type(ranges) is not tuple or len(ranges) > RANGES_MAX:
        return None
    previous = 0  # LSN 0 is no LSN
    for item in ranges:
        if (type(item) is not tuple or len(item) != 2 or type(item[0]) is not int
                or type(item[1]) is not int or not previous < item[0] <= item[1] <= LSN_MAX):
            return None
        previous = item[1]
    return ranges


def normalized(ranges: Iterable[LsnRange]) -> NonAuthoritative:
    """``ranges`` sorted with overlapping and adjacent ones joined."""
    joined: list[LsnRange] = []
    for lo, hi in sorted(ranges):
        if joined and lo <= joined[-1][1] + 1:
            if hi > joined[-1][1]:
                joined[-1] = (joined[-1][0], hi)
        else:
            joined.append((lo, hi))
    return tuple(joined)


def clipped(ranges: Iterable[LsnRange], lo: int, hi: int) -> NonAuthoritative:
    """The parts of ``ranges`` (normalized) inside ``[lo, hi]``, at most ``RANGES_MAX``."""
    inside = tuple((max(a, lo), min(b, hi)) for a, b in ranges if a <= hi and b >= lo)
    if len(inside) > RANGES_MAX:
        # Saying "unsure" about more than the node must is safe; about less is not.
        inside = (*inside[:RANGES_MAX - 1], (inside[RANGES_MAX - 1][0], inside[-1][1]))
    return inside


def covers(ranges: NonAuthoritative, lsn: int) -> bool:
    """Whether ``lsn`` lies in one of ``ranges``."""
    for lo, hi in ranges:
        if lsn < lo:
            return False
        if lsn <= hi:
            return True
    return False


def vouched_until(answers: Iterable[NonAuthoritative], from_lsn: int, until: int,
                  needed: int) -> int:
    """The highest LSN ``u`` (at most ``until``) such that at every LSN of ``[from_lsn, u]``
    at least ``needed`` of the answers are authoritative; ``from_lsn - 1`` when ``from_lsn``
    itself is not vouched for. Each element of ``answers`` is one node's ranges."""
    answers = list(answers)
    if sum(1 for ranges in answers if not ranges) >= needed:
        return until  # the usual case: enough nodes are unsure of nothing
    lsn = from_lsn
    while lsn <= until:
        unsure = [ranges for ranges in answers if covers(ranges, lsn)]
        if len(answers) - len(unsure) < needed:
            return lsn - 1
        # The count can only drop where some answer's next range begins.
        starts = [lo for ranges in answers for lo, _ in ranges if lo > lsn]
        lsn = min(starts, default=until + 1)
    return until
