"""What the epoch store keeps per log: epoch metadata (changed only by compare-and-swap on
``version``) and the last clean epoch (which only increases)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.types import Epoch, LogId, Lsn, NodeId


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
