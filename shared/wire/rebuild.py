"""REBUILD_STORE (donor -> the shard being rebuilt) and REBUILD_STORED (its answer).

A donor re-replicates copies it holds to a shard that lost them (``storage_node.rebuild``):
one frame per log and chunk, carrying

- the shard and the disk generation being rebuilt: the receiver refuses (``STALE``) a
  rebuild meant for another disk of its own, so a stale donor cannot fill a newer disk;
- the donor's own release pointer, trim point and seal of the log, which the receiver adopts
  when higher (a wiped node knows none of them; each is a value some sequencer or recovery
  really set, so adopting it is what a RELEASE, TRIM or SEAL would have done);
- ``entries``: each a STORE's packed field array (``shared.wire.codec.encode_fields``; the
  donor's segment entry body as it is on disk when the entry is whole), so the copy keeps its
  payload, wave, flags, copyset, timestamp and producer tags: the LSN's identity is unchanged.

The receiver writes each copy only where it holds none (a copy it got after it came back,
from a sequencer or recovery, is at least as new) and answers once all are durable.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.status import Status

REBUILD_ENTRIES_MAX = 4096
REBUILD_BYTES_MAX = 8 * 1024 * 1024
"""A donor's chunk stays below this (the frame limit is larger)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildStore:
    shard: str
    generation: int
    log_id: int
    release_lsn: int
    trim_lsn: int
    sealed_epoch: int
    sealed_by: str
    entries: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildStored:
    status: Status
    log_id: int
    written: int
    """Copies written (the rest were held already)."""
