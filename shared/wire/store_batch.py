"""STORE_BATCH (sequencer -> storage node) and STORED_BATCH (the reply): the STOREs of many
logs to one storage node in one frame, and all their answers in one frame; RELEASE_BATCH: the
release pointers of many logs in one one-way frame.

A sequencer busy with many logs sends each log's appends as a STORE of one or a few records.
Sent one frame each, every record costs R frames out, R frames back and R reply callbacks,
which is where the sequencer's CPU went with 1,000 logs (issue 15). The STOREs staged in one
event-loop iteration for one storage node travel as one STORE_BATCH instead; the node handles
each of them exactly as if it came alone (same checks, same seals, its own answer) and answers
them all in one STORED_BATCH once the last one is settled (they are written together, in one
group commit).

On the wire a STORE_BATCH's one field is the array of its STOREs, each the field array a STORE
frame carries (``shared.wire.codec``), so that a storage node keeps each one's bytes to write
to disk as they are. STORED_BATCH answers positionally: ``statuses[i]`` answers
``stores[i]``; a PREEMPTED answer's seal is in ``seals`` as ``(i, sealed_epoch, sealed_by)``.
Echoing every STORE's log, LSN and wave back (as STORED does) would cost a tuple per record
for nothing: the sender remembers what it sent.

RELEASE_BATCH carries ``(log_id, release_lsn)`` pairs, each meaning what a RELEASE of that log
means. With many logs each append's release pointer otherwise went out as R RELEASE frames of
its own (no STORE of the same log follows soon enough to carry it), and the periodic broadcast
sent R more per log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.status import Status
from shared.types import (
    Epoch,
    LogId,
    Lsn,
    NodeId,
    epoch_valid,
    log_id_valid,
    lsn_valid,
    node_id_valid,
)
from shared.wire.extension import EXTENSION
from shared.wire.release import Release
from shared.wire.store import Store

STORE_BATCH_STORES_MAX = 4096
"""Most STOREs one STORE_BATCH may carry (a receiver refuses more as BADMSG)."""
RELEASE_BATCH_LOGS_MAX = 4096
"""Most release pointers one RELEASE_BATCH may carry (a receiver ignores the frame if more)."""

SealAnswer = tuple[int, int, str | None]
"""``(index, sealed_epoch, sealed_by)`` of a STORED_BATCH entry that carries a seal."""
StoredResult = tuple[Status, Epoch, NodeId | None]
"""One STORE's answer out of a STORED_BATCH: status, sealed epoch, sealed by."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreBatch:
    stores: tuple[Store, ...]
    packed: tuple[bytes, ...] | None = field(
        default=None, init=False, compare=False, repr=False, metadata={"wire": False})
    """Not sent as such: each STORE's packed field array, in order, when the sender packed
    them already (a STORE goes to R nodes in R batches: packed once). Set with
    ``with_packed``; None makes the codec pack them."""

    def with_packed(self, packed: tuple[bytes, ...]) -> StoreBatch:
        assert len(packed) == len(self.stores)
        object.__setattr__(self, "packed", packed)
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredBatch:
    statuses: tuple[int, ...]
    """The ``Status`` of each STORE of the batch, in the batch's order."""
    seals: tuple[SealAnswer, ...] = field(default=(), metadata=EXTENSION)
    """``(index, sealed_epoch, sealed_by)`` for the answers that report a seal (PREEMPTED)."""


_STATUS_BY_VALUE: dict[int, Status] = {int(status): status for status in Status}
_NO_SEAL: StoredResult = (Status.OK, Epoch(0), None)


def stored_batch_results(reply: StoredBatch, count: int) -> list[StoredResult] | Status:
    """The answers of a STORE_BATCH of ``count`` STOREs, or BADMSG when ``reply`` does not
    fit it (wrong length, unknown status, a seal out of range). Checks what the codec does
    not: the elements of its tuples."""
    statuses = reply.statuses
    if len(statuses) != count:
        return Status.BADMSG
    results: list[StoredResult] = []
    by_value = _STATUS_BY_VALUE
    for value in statuses:
        status = by_value.get(value) if type(value) is int else None
        if status is None:
            return Status.BADMSG
        results.append(_NO_SEAL if status is Status.OK else (status, Epoch(0), None))
    for seal in reply.seals:
        if type(seal) is not tuple or len(seal) != 3:
            return Status.BADMSG
        index, sealed_epoch, sealed_by = seal
        if (type(index) is not int or not 0 <= index < count or type(sealed_epoch) is not int
                or not (sealed_epoch == 0 or epoch_valid(sealed_epoch))
                or not (sealed_by is None or node_id_valid(sealed_by))):
            return Status.BADMSG
        results[index] = (results[index][0], Epoch(sealed_epoch),
                          None if sealed_by is None else NodeId(sealed_by))
    return results


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseBatch:
    releases: tuple[tuple[int, int], ...]
    """``(log_id, release_lsn)`` pairs: a RELEASE of each."""


def release_batch_entries(batch: ReleaseBatch) -> list[Release]:
    """The RELEASEs a RELEASE_BATCH stands for. An element that is not a valid pair is left
    out (a RELEASE is best effort: the sender's next one or a STORE brings the pointer); an
    oversized batch counts as empty."""
    releases = batch.releases
    if len(releases) > RELEASE_BATCH_LOGS_MAX:
        return []
    return [_release(pair[0], pair[1]) for pair in releases
            if type(pair) is tuple and len(pair) == 2 and log_id_valid(pair[0])
            and lsn_valid(pair[1])]


def release_batch_pairs(batch: ReleaseBatch) -> list[tuple[LogId, Lsn]]:
    """``release_batch_entries`` as ``(log_id, release_lsn)`` pairs (no RELEASE built per
    log), with the same checks."""
    releases = batch.releases
    if len(releases) > RELEASE_BATCH_LOGS_MAX:
        return []
    return [pair for pair in releases  # type: ignore[misc]
            if type(pair) is tuple and len(pair) == 2 and log_id_valid(pair[0])
            and lsn_valid(pair[1])]


_new_object = object.__new__
NOT_DRAINED = Epoch(0)
_set_release_log_id = Release.__dict__["log_id"].__set__
_set_release_lsn = Release.__dict__["release_lsn"].__set__
_set_release_drained_epoch = Release.__dict__["drained_epoch"].__set__
assert len(Release.__dataclass_fields__) == 3 and not hasattr(Release, "__post_init__")


def _release(log_id: int, release_lsn: int) -> Release:
    """``Release(...)`` without the frozen dataclass's ``__init__`` (one per log and node)."""
    release = _new_object(Release)
    _set_release_log_id(release, log_id)
    _set_release_lsn(release, release_lsn)
    _set_release_drained_epoch(release, NOT_DRAINED)  # a batch never carries a drained epoch
    return release
