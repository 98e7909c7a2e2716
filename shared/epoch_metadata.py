"""What the epoch store keeps per log: epoch metadata (changed only by compare-and-swap on
``version``) and the last clean epoch (which only increases).

A log's nodeset can change at an epoch bump (a storage node drained out of it): the metadata
keeps the nodeset of every epoch range, the current one (``nodeset``, from ``nodeset_since``
on) and the earlier ones (``earlier``), so that readers and recovery read each epoch from the
nodes that hold it. Metadata written before nodesets could change has neither field: one
nodeset from epoch 1 on."""

from __future__ import annotations

from dataclasses import dataclass

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


def next_nodeset(base: LogMetadata, retired: frozenset[NodeId]) -> tuple[NodeId, ...]:
    """The nodeset of the log's next epoch: ``base.nodeset`` without ``retired`` nodes (they
    take no new copies: draining, drained or removed), unless that leaves fewer than R nodes
    or the metadata already keeps ``NODESET_HISTORY_MAX`` earlier nodesets; then unchanged
    (appends keep meeting the retired nodes' DISABLED answers and avoid them per copyset).
    Only ever a subset of ``base.nodeset`` (see ``epoch_store.core.metadata``)."""
    if not retired or retired.isdisjoint(base.nodeset):
        return base.nodeset
    kept = tuple(n for n in base.nodeset if n not in retired)
    if nodeset_blocked(base, kept):
        return base.nodeset
    return kept


def nodeset_blocked(base: LogMetadata, kept: tuple[NodeId, ...]) -> bool:
    """Whether narrowing ``base.nodeset`` down to ``kept`` is refused."""
    return (len(kept) < base.replication_factor
            or (base.nodeset_since < base.next_epoch
                and len(base.earlier) >= NODESET_HISTORY_MAX))
