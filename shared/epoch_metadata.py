"""What the epoch store keeps per log: epoch metadata (changed only by compare-and-swap on
``version``) and the last clean epoch (which only increases).

A log's nodeset can change at an epoch bump (a storage node drained out of it, or one added to
the cluster joining it): the metadata keeps the nodeset of every epoch range, the current one
(``nodeset``, from ``nodeset_since`` on) and the earlier ones (``earlier``), so that readers and
recovery read each epoch from the nodes that hold it. Metadata written before nodesets could
change has neither field: one nodeset from epoch 1 on.

What metadata says about epochs it has not handed out yet (``next_epoch`` on) is unknown: the
next activation may grow the nodeset. Readers therefore use a log's metadata only for epochs
below its ``next_epoch`` (``shared.read_round.metadata_spans`` ends the last span there) and
fetch it again to read further; the epoch's nodeset is stored in the same compare-and-swap
that hands out the epoch, so metadata read after a record of an epoch was released covers
that epoch."""

from __future__ import annotations

from dataclasses import dataclass

from shared.limits import NODESET_SIZE_MAX
from shared.types import EPOCH_MIN, Epoch, LogId, Lsn, NodeId

NODESET_HISTORY_MAX = 32
"""Earlier nodesets a log's metadata keeps at most; a change past it is refused (the log keeps
its nodeset), so that the metadata stays small."""


@dataclass(frozen=True, slots=True)
class EpochNodeset:
    """Epochs ``first_epoch`` up to the next range's first epoch - 1 were stored on
    ``nodeset`` with ``replication_factor`` copies."""

    first_epoch: Epoch
    nodeset: tuple[NodeId, ...]
    replication_factor: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogMetadata:
    log_id: LogId
    next_epoch: Epoch
    """The epoch the next activation takes (LogDevice keeps "next" in the store too)."""
    nodeset: tuple[NodeId, ...]
    replication_factor: int
    last_writer: NodeId | None
    version: int
    """Bumped by every successful write; writers compare-and-swap on it."""
    nodeset_since: Epoch = EPOCH_MIN
    """The first epoch stored on ``nodeset``."""
    earlier: tuple[EpochNodeset, ...] = ()
    """The nodesets of the epochs before ``nodeset_since``, oldest first, each range ending
    where the next begins."""

    def nodeset_ranges(self) -> tuple[EpochNodeset, ...]:
        """Every epoch range's nodeset, oldest first; the last one is open-ended."""
        return (*self.earlier, EpochNodeset(self.nodeset_since, self.nodeset,
                                            self.replication_factor))


@dataclass(frozen=True, slots=True, kw_only=True)
class LastCleanEpoch:
    log_id: LogId
    epoch: Epoch
    """Every epoch up to and including this one is recovered (clean). 0: none yet."""
    tail_lsn: Lsn
    """The last LSN of ``epoch`` that holds a record (0 if none)."""
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvisionSpec:
    """How to create a log's metadata when it does not exist yet."""

    nodeset: tuple[NodeId, ...]
    replication_factor: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesetTarget:
    """The nodeset a writer wants a log's next epoch on (LogDevice's nodeset selector): at
    least ``size`` nodes, topped up from ``candidates`` (storage nodes that may take copies,
    best first; see ``shared.routing.rendezvous_order``). The nodes already in the nodeset
    stay, so a nodeset only grows towards its target and its records stay where they are."""

    candidates: tuple[NodeId, ...]
    size: int


def next_nodeset(base: LogMetadata, retired: frozenset[NodeId],
                 target: NodesetTarget | None = None) -> tuple[NodeId, ...]:
    """The nodeset of the log's next epoch: ``base.nodeset`` without ``retired`` nodes (they
    take no new copies: draining, drained or removed), topped up with ``target``'s candidates
    (not retired) while it has fewer than ``target.size`` nodes, or R (storage nodes added to
    the cluster join existing logs this way). Unchanged when that leaves fewer than R nodes or
    the metadata already keeps ``NODESET_HISTORY_MAX`` earlier nodesets (appends keep meeting
    the retired nodes' DISABLED answers and avoid them per copyset)."""
    kept = base.nodeset
    if retired and not retired.isdisjoint(kept):
        kept = tuple(n for n in kept if n not in retired)
    # Never aim below R: a drained node's place is taken even with a smaller nodeset_size.
    size = 0 if target is None else max(target.size, base.replication_factor)
    if target is not None and len(kept) < size:
        have = set(kept)
        extra = [n for n in dict.fromkeys(target.candidates)
                 if n not in have and n not in retired]
        kept = (*kept, *extra[:size - len(kept)])
    if kept == base.nodeset or len(kept) > NODESET_SIZE_MAX or nodeset_blocked(base, kept):
        return base.nodeset
    return kept


def nodeset_blocked(base: LogMetadata, kept: tuple[NodeId, ...]) -> bool:
    """Whether narrowing ``base.nodeset`` down to ``kept`` is refused."""
    return (len(kept) < base.replication_factor
            or (base.nodeset_since < base.next_epoch
                and len(base.earlier) >= NODESET_HISTORY_MAX))
