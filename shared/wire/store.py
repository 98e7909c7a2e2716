"""STORE (sequencer -> storage node) and STORED (the reply).

One STORE carries the records ``lsn .. lsn + len(payloads) - 1`` of one append: a single
record, or an atomic batch with consecutive LSNs. ``checksum`` covers the payloads so that a
storage node can refuse a corrupted copy with ``CHECKSUM_MISMATCH``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId


def payloads_checksum(payloads: tuple[bytes, ...]) -> int:
    """CRC-32 chained over every payload, in order."""
    crc = 0
    for payload in payloads:
        crc = zlib.crc32(payload, crc)
    return crc


@dataclass(frozen=True, slots=True, kw_only=True)
class Store:
    log_id: LogId
    lsn: Lsn
    wave: int
    sequencer_node: NodeId
    copyset: tuple[NodeId, ...]
    timestamp_ms: int
    last_known_good: Esn
    release_lsn: Lsn
    timeout_ms: int
    key: str | None
    payloads: tuple[bytes, ...]
    checksum: int

    @property
    def last_lsn(self) -> Lsn:
        return Lsn(self.lsn + len(self.payloads) - 1)

    def validate(self) -> Status:
        if not self.payloads or self.wave < 1 or self.timeout_ms < 0:
            return Status.BADMSG
        if payloads_checksum(self.payloads) != self.checksum:
            return Status.CHECKSUM_MISMATCH
        return Status.OK


@dataclass(frozen=True, slots=True, kw_only=True)
class Stored:
    log_id: LogId
    lsn: Lsn
    wave: int
    status: Status
    sealed_epoch: Epoch
    sealed_by: NodeId | None
