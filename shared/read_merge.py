"""Pure merge of storage nodes' READ answers into the API's records-and-gaps view.

Each released record is stored on R nodes of the nodeset, so once an f-majority
(``|nodeset| - R + 1``) of nodes has answered, every released record below the lowest
``next_lsn`` among them has been seen at least once. Up to that point each LSN is a record
(copies deduplicated), or a gap: a ``BRIDGE`` where one epoch ends and a later one begins, or
``DATALOSS`` for a missing LSN inside an epoch, below the release pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.types import Lsn, compose_lsn, lsn_to_epoch, lsn_to_esn
from shared.wire.read import WireRecord

GapKind = Literal["HOLE", "BRIDGE", "TRIM", "DATALOSS"]


@dataclass(frozen=True, slots=True)
class Gap:
    kind: GapKind
    lo: Lsn
    hi: Lsn


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    records: tuple[WireRecord, ...]
    next_lsn: Lsn
    release_lsn: Lsn


@dataclass(frozen=True, slots=True)
class Merged:
    records: list[WireRecord]
    gaps: list[Gap]
    next_lsn: Lsn


def f_majority(nodeset_size: int, replication: int) -> int:
    return max(nodeset_size - replication + 1, 1)


def merge(
    answers: list[NodeAnswer], from_lsn: Lsn, release_lsn: Lsn, records_max: int,
    bytes_max: int,
) -> Merged:
    """Records and gaps covering ``[from_lsn, next_lsn - 1]`` exactly once, in order; at most
    ``records_max`` records, stopping once ``bytes_max`` payload bytes are reached.

    The caller must pass answers from at least an f-majority of the nodeset."""
    assert answers
    until = min(min(a.next_lsn for a in answers) - 1, release_lsn)
    by_lsn: dict[int, WireRecord] = {}
    for answer in answers:
        for record in answer.records:
            if from_lsn <= record[0] <= until:
                by_lsn.setdefault(record[0], record)
    records: list[WireRecord] = []
    gaps: list[Gap] = []
    cursor: int = from_lsn
    payload_bytes = 0
    for lsn in sorted(by_lsn):
        if len(records) >= records_max or (records and payload_bytes >= bytes_max):
            return Merged(records, gaps, Lsn(cursor))
        payload_bytes += len(by_lsn[lsn][3])
        if lsn > cursor:
            gaps.extend(_gaps_between(Lsn(cursor), Lsn(lsn - 1)))
        records.append(by_lsn[lsn])
        cursor = lsn + 1
    if cursor <= until:
        # Nothing more is held below ``until`` by an f-majority of the nodeset: an epoch
        # boundary is a bridge, a released LSN inside an epoch is lost.
        gaps.extend(_gaps_between(Lsn(cursor), Lsn(until)))
        cursor = until + 1
    return Merged(records, gaps, Lsn(cursor))


def _gaps_between(lo: Lsn, hi: Lsn) -> list[Gap]:
    """The gaps covering ``[lo, hi]``, which hold no record of any answering node."""
    if lsn_to_epoch(lo) == lsn_to_epoch(hi):
        return [Gap("BRIDGE" if lsn_to_esn(lo) == 0 else "DATALOSS", lo, hi)]
    # The span crosses into hi's epoch: bridge up to its slot 0, then whatever is missing in it.
    bridge_end = compose_lsn(lsn_to_epoch(hi), lsn_to_esn(Lsn(0)))
    gaps = [Gap("BRIDGE", lo, bridge_end)]
    if hi > bridge_end:
        gaps.append(Gap("DATALOSS", Lsn(bridge_end + 1), hi))
    return gaps
