"""Pure compare-and-swap rules of the epoch store.

Every backend changes a log's two objects (the ``sequencer`` metadata and the ``lce``) the same
way: read the object, hand it to a ``plan_*`` function here, and compare-and-swap the returned
value on the version that was read. The plan functions decide everything (provisioning, the
epoch bump, exhaustion, monotonic LCE); backends only store bytes and detect version conflicts.

Versions count successful writes of an object: a missing object has version 0 and every write
stores ``version + 1``. A ZooKeeper backend maps this onto ``stat.version + 1``.

Epochs: a new log starts with ``next_epoch = EPOCH_MIN``. Activation takes ``next_epoch`` and
stores ``next_epoch + 1``; the stored ``next_epoch`` never exceeds ``EPOCH_MAX``, so the last
epoch ever handed out is ``EPOCH_MAX - 1`` and later activations get ``TOOBIG`` (as in
LogDevice's ``EpochMetaDataUpdateToNextEpoch``). Planners never return ``AGAIN``: that status is
reserved for lost compare-and-swap races.

Nodeset changes: an activation may be told which storage nodes take no new copies
(``retired``: draining, drained or removed) and which nodeset the writer wants (``target``:
storage nodes added to the cluster join existing logs). The epoch it takes then starts a new
nodeset range (``next_nodeset``), recorded in the same compare-and-swap as the epoch, so
every epoch's nodeset is known before anything is stored in it, and never below R nodes.
A nodeset that grew is no subset of the one before: readers and recovery use metadata only
for the epochs it has handed out (below ``next_epoch``) and read it again for later ones
(``shared.read_round.metadata_spans``).
"""

from __future__ import annotations

from shared.epoch_metadata import (
    EpochNodeset,
    LastCleanEpoch,
    LogMetadata,
    NodesetTarget,
    ProvisionSpec,
    next_nodeset,
)
from shared.limits import NODESET_SIZE_MAX
from shared.status import Status
from shared.types import (
    EPOCH_INVALID,
    EPOCH_MAX,
    EPOCH_MIN,
    LSN_INVALID,
    Epoch,
    LogId,
    Lsn,
    NodeId,
    epoch_valid,
    log_id_valid,
    lsn_to_epoch,
    lsn_valid,
    node_id_valid,
)

VERSION_MISSING = 0
"""The version of an object that does not exist yet; writing it means creating it."""


def version_of(current: LogMetadata | LastCleanEpoch | None) -> int:
    """The version a compare-and-swap over ``current`` must expect."""
    return VERSION_MISSING if current is None else current.version


def check_log_id(log_id: LogId) -> Status:
    return Status.OK if log_id_valid(log_id) else Status.INVALID_PARAM


def check_provision(spec: ProvisionSpec) -> Status:
    """``INVALID_PARAM`` for a nodeset or replication factor no log could run with."""
    nodeset = spec.nodeset
    if not isinstance(nodeset, tuple) or not 0 < len(nodeset) <= NODESET_SIZE_MAX:
        return Status.INVALID_PARAM
    if len(set(nodeset)) != len(nodeset) or not all(node_id_valid(n) for n in nodeset):
        return Status.INVALID_PARAM
    factor = spec.replication_factor
    if type(factor) is not int or not 1 <= factor <= len(nodeset):
        return Status.INVALID_PARAM
    return Status.OK


def provisioned(log_id: LogId, spec: ProvisionSpec) -> LogMetadata:
    """What a log looks like right after provisioning, before its first activation."""
    return LogMetadata(
        log_id=log_id,
        next_epoch=EPOCH_MIN,
        nodeset=spec.nodeset,
        replication_factor=spec.replication_factor,
        last_writer=None,
        version=VERSION_MISSING,
    )


def plan_activation(
    current: LogMetadata | None,
    *,
    log_id: LogId,
    writer: NodeId,
    provision: ProvisionSpec | None,
    retired: frozenset[NodeId] = frozenset(),
    target: NodesetTarget | None = None,
) -> tuple[Status, LogMetadata | None]:
    """The metadata to write for ``writer`` to take the next epoch, which is the returned
    ``next_epoch - 1``. ``NOTFOUND`` (missing, no ``provision``), ``TOOBIG`` (epochs exhausted),
    ``INVALID_PARAM`` (bad log id, writer or provision spec). ``retired``: nodes the epoch
    taken must not store on; ``target``: the nodeset the writer wants it on (see
    ``next_nodeset``)."""
    if check_log_id(log_id) != Status.OK or not node_id_valid(writer):
        return Status.INVALID_PARAM, None
    if current is None:
        if provision is None:
            return Status.NOTFOUND, None
        status = check_provision(provision)
        if status != Status.OK:
            return status, None
        base = provisioned(log_id, provision)
    else:
        assert current.log_id == log_id, (current.log_id, log_id)
        base = current
    assert EPOCH_MIN <= base.next_epoch <= EPOCH_MAX, base
    if base.next_epoch >= EPOCH_MAX:
        return Status.TOOBIG, None
    since, earlier = base.nodeset_since, base.earlier
    nodeset = next_nodeset(base, retired, target)
    if nodeset != base.nodeset:
        taken = base.next_epoch
        if since < taken:
            # Epochs since..taken-1 keep the old nodeset; the epoch taken starts the new one.
            earlier = (*earlier, EpochNodeset(since, base.nodeset, base.replication_factor))
            since = taken
    bumped = LogMetadata(
        log_id=log_id,
        next_epoch=Epoch(base.next_epoch + 1),
        nodeset=nodeset,
        replication_factor=base.replication_factor,
        last_writer=writer,
        version=version_of(current) + 1,
        nodeset_since=since,
        earlier=earlier,
    )
    return Status.OK, bumped


def epoch_taken(after: LogMetadata) -> Epoch:
    """The epoch an activation took, given the metadata it wrote."""
    epoch = Epoch(after.next_epoch - 1)
    assert epoch_valid(epoch), after
    return epoch


def no_last_clean_epoch(log_id: LogId) -> LastCleanEpoch:
    """The LCE of a provisioned log whose LCE was never set."""
    return LastCleanEpoch(
        log_id=log_id, epoch=EPOCH_INVALID, tail_lsn=LSN_INVALID, version=VERSION_MISSING
    )


def view_last_clean_epoch(
    current: LastCleanEpoch | None, *, log_id: LogId, log_provisioned: bool
) -> tuple[Status, LastCleanEpoch | None]:
    """What ``get_last_clean_epoch`` answers: the stored LCE, epoch 0 for a provisioned log
    without one, ``NOTFOUND`` for a log that does not exist."""
    if current is not None:
        assert current.log_id == log_id, (current.log_id, log_id)
        return Status.OK, current
    if not log_provisioned:
        return Status.NOTFOUND, None
    return Status.OK, no_last_clean_epoch(log_id)


def plan_last_clean_epoch(
    current: LastCleanEpoch | None,
    *,
    log_id: LogId,
    log_provisioned: bool,
    epoch: Epoch,
    tail_lsn: Lsn,
) -> tuple[Status, LastCleanEpoch | None]:
    """The LCE to write. ``STALE`` unless ``epoch`` is above the stored one; ``NOTFOUND`` for a
    log that does not exist; ``INVALID_PARAM`` for an invalid epoch, or a tail LSN that lies in
    a later epoch than ``epoch``."""
    if check_log_id(log_id) != Status.OK or type(epoch) is not int or not epoch_valid(epoch):
        return Status.INVALID_PARAM, None
    if not lsn_valid(tail_lsn) or lsn_to_epoch(tail_lsn) > epoch:
        return Status.INVALID_PARAM, None
    status, stored = view_last_clean_epoch(
        current, log_id=log_id, log_provisioned=log_provisioned
    )
    if status != Status.OK:
        return status, None
    assert stored is not None
    if epoch <= stored.epoch:
        return Status.STALE, None
    return Status.OK, LastCleanEpoch(
        log_id=log_id, epoch=epoch, tail_lsn=tail_lsn, version=version_of(current) + 1
    )
