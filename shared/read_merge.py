"""Pure merge of storage nodes' READ answers into the API's records-and-gaps view.

Each released record is stored on R nodes of the nodeset, so once an f-majority
(``|nodeset| - R + 1``) of nodes has answered, every released record below the lowest
``next_lsn`` among them has been seen at least once; so has every hole and bridge that epoch
recovery wrote (it writes them to R nodes too). Per LSN the copy with the highest precedence
wins (``shared.wire.store.copy_precedence``): recovery's decision beats a stray copy that a node
got from a dead sequencer and recovery never saw. Each LSN is then a record, or a gap:

- ``HOLE``: recovery plugged it (an append that was never acknowledged);
- ``BRIDGE``: recovery's bridge ends the epoch there, or (for an epoch that was drained
  cleanly, without a bridge record) one epoch ends and a later one begins;
- ``DATALOSS``: a missing LSN inside an epoch, below the release pointer;
- ``TRIM``: at or below the highest trim point any answering node reports.

Authoritative status (``shared.authority``): a node that may have lost copies says where, and
there its silence is no evidence. The caller says how many answers must vouch for an LSN
(``needed``, the f-majority; 0 once every node of the nodeset answered, when whatever no node
holds is truly gone): the merge stops before the first LSN that fewer answers vouch for, and
the reader asks more nodes instead of calling a record that a damaged node forgot DATALOSS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.authority import NonAuthoritative, vouched_until
from shared.compression import expand_stored
from shared.status import Status
from shared.types import ESN_MAX, LSN_MAX, Lsn, compose_lsn, lsn_to_epoch, lsn_to_esn
from shared.wire.read import Block, Marker, WireRecord
from shared.wire.store import RecordFlags, copy_precedence

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
    markers: tuple[Marker, ...] = ()
    trim_lsn: Lsn = Lsn(0)
    non_authoritative: NonAuthoritative = ()
    """Where this node may have lost copies: its answer there proves no absence."""


@dataclass(frozen=True, slots=True)
class Merged:
    records: list[WireRecord]
    gaps: list[Gap]
    next_lsn: Lsn


BlockCache = dict[Block, tuple[WireRecord, ...]]
"""Expanded blocks by the block itself: the copies of one batch that several nodes send are
expanded once."""


def expand_blocks(blocks: tuple[Block, ...], records: tuple[WireRecord, ...],
                  cache: BlockCache | None = None) -> tuple[WireRecord, ...] | None:
    """A node's records with its compressed blocks (``shared.wire.read.Block``) expanded into
    per-LSN records, so that the merge sees plain records only; None when a block does not
    expand to its records (the answer is then not used)."""
    if not blocks:
        return records
    expanded = list(records)
    for block in blocks:
        first_lsn, timestamp_ms, key, codec, count, blob = block
        block_records = cache.get(block) if cache is not None else None
        if block_records is None:
            payloads = expand_stored(blob, codec, count)
            if isinstance(payloads, Status):
                return None
            block_records = tuple((first_lsn + i, timestamp_ms, key, payload)
                                  for i, payload in enumerate(payloads))
            if cache is not None:
                cache[block] = block_records
        expanded.extend(block_records)
    return tuple(expanded)


def f_majority(nodeset_size: int, replication: int) -> int:
    return max(nodeset_size - replication + 1, 1)


_SEQUENCER_COPY = copy_precedence(0, 0)


def merge(
    answers: list[NodeAnswer], from_lsn: Lsn, release_lsn: Lsn, records_max: int,
    bytes_max: int, needed: int = 0,
) -> Merged:
    """Records and gaps covering ``[from_lsn, next_lsn - 1]`` exactly once, in order; at most
    ``records_max`` records, stopping once ``bytes_max`` payload bytes are reached, and before
    the first LSN fewer than ``needed`` answers are authoritative for (0: no such limit).

    The caller must pass answers from at least an f-majority of the nodeset."""
    assert answers
    until = min(min(a.next_lsn for a in answers) - 1, release_lsn)
    records: list[WireRecord] = []
    gaps: list[Gap] = []
    cursor: int = from_lsn
    trim_lsn = min(max(a.trim_lsn for a in answers), release_lsn)
    if trim_lsn >= cursor:
        # Trimmed everywhere as far as a reader is concerned, whatever a node that missed
        # the trim still holds.
        gaps.append(Gap("TRIM", Lsn(cursor), trim_lsn))
        cursor = trim_lsn + 1
    bridge_cap: int = LSN_MAX
    if needed and cursor <= until:
        vouched = vouched_until((a.non_authoritative for a in answers), cursor, until, needed)
        if vouched < cursor:
            # Too few answers can vouch for the next LSN: nothing more is decided here.
            return Merged(records, gaps, Lsn(cursor))
        if vouched < until:
            # Past it an unheard node could hold a later recovery's copies: a bridge ends
            # no more of its epoch than is vouched for (the next round goes on from there).
            until = bridge_cap = vouched
    best = _best_copies(answers, Lsn(cursor), until)
    ended = _ended_before(answers, Lsn(cursor), best)
    if ended is not None:
        # The read starts past the bridge that ends this epoch: nothing of it is a record.
        end = min(compose_lsn(lsn_to_epoch(Lsn(cursor)), ESN_MAX) + 1, release_lsn,
                  bridge_cap)
        gaps.append(Gap("BRIDGE", Lsn(cursor), Lsn(max(end, cursor))))
        cursor = max(end, cursor) + 1
    payload_bytes = 0
    for lsn in sorted(best):
        if lsn < cursor:
            continue  # inside an epoch that a bridge already ended
        _, flags, record = best[lsn]
        if flags & RecordFlags.HOLE:
            if lsn > cursor:
                gaps.extend(_gaps_between(Lsn(cursor), Lsn(lsn - 1)))
            if flags & RecordFlags.BRIDGE:
                # Nothing of this epoch after its bridge is a record: jump to the next epoch.
                end = min(compose_lsn(lsn_to_epoch(Lsn(lsn)), ESN_MAX) + 1, release_lsn,
                          bridge_cap)
                gaps.append(Gap("BRIDGE", Lsn(lsn), Lsn(max(end, lsn))))
                cursor = max(end, lsn) + 1
            else:
                gaps.append(Gap("HOLE", Lsn(lsn), Lsn(lsn)))
                cursor = lsn + 1
            continue
        assert record is not None
        if len(records) >= records_max or (records and payload_bytes >= bytes_max):
            return Merged(records, _joined(gaps), Lsn(cursor))
        payload_bytes += len(record[3])
        if lsn > cursor:
            gaps.extend(_gaps_between(Lsn(cursor), Lsn(lsn - 1)))
        records.append(record)
        cursor = lsn + 1
    if cursor <= until:
        # Nothing more is held below ``until`` by an f-majority of the nodeset: an epoch
        # boundary is a bridge, a released LSN inside an epoch is lost.
        gaps.extend(_gaps_between(Lsn(cursor), Lsn(until)))
        cursor = until + 1
    return Merged(records, _joined(gaps), Lsn(cursor))


def _best_copies(answers: list[NodeAnswer], from_lsn: Lsn,
                 until: int) -> dict[int, tuple[tuple[int, int], int, WireRecord | None]]:
    """Per LSN in range: (precedence, flags, record or None for holes) of the winning copy."""
    best: dict[int, tuple[tuple[int, int], int, WireRecord | None]] = {}
    for answer in answers:
        recovered: dict[int, tuple[int, int]] = {}
        for first, last, flags, seal in answer.markers:
            for lsn in range(max(first, from_lsn), min(last, until) + 1):
                precedence = copy_precedence(flags, seal)
                if flags & RecordFlags.HOLE:
                    current = best.get(lsn)
                    if current is None or precedence > current[0]:
                        best[lsn] = (precedence, flags, None)
                else:
                    recovered[lsn] = precedence
        for record in answer.records:
            lsn = record[0]
            if from_lsn <= lsn <= until:
                precedence = recovered.get(lsn, _SEQUENCER_COPY)
                current = best.get(lsn)
                if current is None or precedence > current[0]:
                    best[lsn] = (precedence, 0, record)
    return best


def _ended_before(answers: list[NodeAnswer], from_lsn: Lsn,
                  best: dict[int, tuple[tuple[int, int], int, WireRecord | None]]) -> Lsn | None:
    """The bridge that ends ``from_lsn``'s epoch below ``from_lsn``, if a node reports one
    (storage nodes add it to a READ that starts past it) and no copy in that epoch from
    ``from_lsn`` on outranks it (a later recovery attempt that decided otherwise wrote its
    copies with a higher precedence, so a stale bridge of an abandoned attempt ends
    nothing). Without it a READ starting past the bridge would see only the stray copies
    that nodes which missed recovery keep there."""
    epoch = lsn_to_epoch(from_lsn)
    bridge: tuple[tuple[int, int], int] | None = None
    for answer in answers:
        for first, _last, flags, seal in answer.markers:
            if (first < from_lsn and flags & RecordFlags.BRIDGE
                    and lsn_to_epoch(Lsn(first)) == epoch):
                found = (copy_precedence(flags, seal), first)
                if bridge is None or found > bridge:
                    bridge = found
    if bridge is None:
        return None
    epoch_end = compose_lsn(epoch, ESN_MAX)
    for lsn, (precedence, _, _) in best.items():
        if lsn <= epoch_end and precedence > bridge[0]:
            return None
    return Lsn(bridge[1])


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


def _joined(gaps: list[Gap]) -> list[Gap]:
    """Adjacent gaps of one kind as one gap."""
    joined: list[Gap] = []
    for gap in gaps:
        if joined and joined[-1].kind == gap.kind and joined[-1].hi + 1 == gap.lo:
            joined[-1] = Gap(gap.kind, joined[-1].lo, gap.hi)
        else:
            joined.append(gap)
    return joined
