"""Typed results returned by ``seqlog.Client``: one frozen dataclass per API answer.

These mirror the response bodies of the public HTTP contract (API.md) with bytes already
decoded; they carry no behaviour beyond small conveniences for walking a read in LSN order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shared.types import Epoch, Lsn, NodeId

GapType = Literal["HOLE", "BRIDGE", "TRIM", "DATALOSS"]
GAP_TYPES: tuple[GapType, ...] = ("HOLE", "BRIDGE", "TRIM", "DATALOSS")
NodeState = Literal["ALIVE", "SUSPECT", "DEAD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResult:
    lsn: Lsn
    timestamp_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    """An atomic batch: its records hold the consecutive LSNs ``first_lsn .. last_lsn``."""

    first_lsn: Lsn
    last_lsn: Lsn
    count: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    lsn: Lsn
    timestamp_ms: int
    key: str | None
    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Gap:
    """LSNs ``lo .. hi`` (inclusive) that hold no record a reader may see, and why."""

    type: GapType
    lo: Lsn
    hi: Lsn


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResult:
    records: list[Record] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    next_lsn: Lsn = Lsn(0)
    release_lsn: Lsn = Lsn(0)

    def entries(self) -> list[Record | Gap]:
        """Records and gaps merged in increasing LSN order, as the coverage rule lays them."""
        merged: list[Record | Gap] = [*self.records, *self.gaps]
        merged.sort(key=_first_lsn)
        return merged


def _first_lsn(entry: Record | Gap) -> int:
    return entry.lsn if isinstance(entry, Record) else entry.lo


@dataclass(frozen=True, slots=True, kw_only=True)
class TailResult:
    release_lsn: Lsn
    trim_lsn: Lsn
    epoch: Epoch
    sequencer: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    node_id: NodeId
    roles: tuple[str, ...]
    http: str
    """``host:port`` of the node's HTTP API."""
    state: NodeState
    sequencer_weight: float
    storage_capacity: float
    data: str = ""
    """``host:port`` of the node's data port (binary protocol), "" when the node does not say."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    cluster: str
    nodes: list[NodeInfo]
    cluster_fingerprint: str = ""
    """What a binary client's HELLO carries; "" from nodes that do not say."""
    protocol_version: int = 0
