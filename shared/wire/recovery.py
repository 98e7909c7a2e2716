"""Epoch recovery between a recovering sequencer and storage nodes (LogDevice's SEAL, digest
START, CLEAN; mutations ride on STORE with ``RecordFlags.WRITTEN_BY_RECOVERY``).

- SEAL / SEALED: durably seal the log up to ``seal_epoch`` on a node; the answer lists, per
  epoch of ``[from_epoch, seal_epoch]`` the node holds records of, the highest last-known-good
  ESN it saw and its highest ESN.
- GET_DIGEST / DIGEST: every copy (released or not) a sealed node holds of one epoch from
  ``from_esn`` on, with the flags and wave (or seal epoch) that decide precedence.
- CLEAN / CLEANED: the recovery outcome of one epoch (its bridge and plugged holes); the node
  overwrites any stray copy it holds where recovery decided "no record" and answers once that
  is durable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.authority import NonAuthoritative
from shared.status import Status
from shared.types import Epoch, Esn, LogId, NodeId
from shared.wire.extension import EXTENSION
from shared.wire.store import ProducerTag

EpochTail = tuple[int, int, int]
"""(epoch, last_known_good_esn, last_esn) that a node holds for one epoch."""
DigestEntry = tuple[int, int, int, int, str | None, bytes, ProducerTag | None]
"""(esn, flags, wave_or_seal_epoch, timestamp_ms, key, payload, producer tag); payload empty
for holes; the tag (of the append the record came from) is None without a producer."""
EsnRange = tuple[int, int]
"""Inclusive ``(first_esn, last_esn)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Seal:
    log_id: LogId
    seal_epoch: Epoch
    sealed_by: NodeId
    from_epoch: Epoch
    """The first unclean epoch: tails are reported for ``[from_epoch, seal_epoch]``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sealed:
    status: Status
    """OK (sealed durably); PREEMPTED (a higher seal exists: ``sealed_epoch``/``sealed_by``);
    or why the seal could not be written (NOTREADY, OVERLOADED, NOSPC, ...)."""
    log_id: LogId
    seal_epoch: Epoch
    sealed_epoch: Epoch
    sealed_by: NodeId | None
    tails: tuple[EpochTail, ...]
    non_authoritative: NonAuthoritative = field(default=(), metadata=EXTENSION)
    """LSN ranges of the epochs ``[from_epoch, seal_epoch]`` where the node may have lost
    copies (``shared.authority``): its tails and digests there are no evidence of absence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetDigest:
    log_id: LogId
    epoch: Epoch
    from_esn: Esn
    seal_epoch: Epoch
    records_max: int
    bytes_max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest:
    status: Status
    """OK; PREEMPTED when the node is sealed above ``seal_epoch``; or a read failure."""
    log_id: LogId
    epoch: Epoch
    entries: tuple[DigestEntry, ...]
    next_esn: int
    """Every copy below this ESN was sent; past ESN_MAX when the epoch is exhausted."""
    sealed_epoch: Epoch = Epoch(0)
    """With PREEMPTED: the node's seal, and who sealed it."""
    sealed_by: NodeId | None = None
    non_authoritative: NonAuthoritative = field(default=(), metadata=EXTENSION)
    """LSN ranges of the epoch where the node may have lost copies (``shared.authority``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Clean:
    log_id: LogId
    epoch: Epoch
    seal_epoch: Epoch
    sealed_by: NodeId
    bridge_esn: Esn
    """Where the epoch ends (0: the epoch's last record is at ESN_MAX, no bridge)."""
    holes: tuple[EsnRange, ...]
    """Plugged ESN ranges below the bridge."""
    attempt: int = field(default=0, metadata=EXTENSION)
    """The attempt of the recovery of ``seal_epoch`` that decided this outcome: the node's
    purge writes its holes and bridge with that attempt's precedence
    (``recovery_wave(seal_epoch, attempt)``), never below the decision it applies (0: sent by
    a peer that predates the field)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cleaned:
    status: Status
    log_id: LogId
    epoch: Epoch
    sealed_epoch: Epoch
    sealed_by: NodeId | None
