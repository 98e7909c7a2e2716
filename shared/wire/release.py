"""RELEASE: the sequencer tells storage nodes that every record of the log up to
``release_lsn`` (in every epoch) may be shown to readers. Best effort and one-way; the periodic
broadcast and the release pointer piggybacked on STOREs are the backstops."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.types import Epoch, LogId, Lsn
from shared.wire.extension import EXTENSION


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    log_id: LogId
    release_lsn: Lsn
    drained_epoch: Epoch = field(default=Epoch(0), metadata=EXTENSION)
    """Set by the last broadcast of a sequencer whose epoch is drained (a graceful stop, an
    idle deactivation), to its epoch, when ``release_lsn`` is in it: every copy of that epoch
    is a record at or below ``release_lsn``, so a node settles the epoch
    (``StoreMachine.drained_mark``) and no later sequencer needs to purge it. 0 otherwise."""


_new_object = object.__new__
_NOT_DRAINED = Epoch(0)
_set_log_id = Release.__dict__["log_id"].__set__
_set_release_lsn = Release.__dict__["release_lsn"].__set__
_set_drained_epoch = Release.__dict__["drained_epoch"].__set__
assert len(Release.__dataclass_fields__) == 3 and not hasattr(Release, "__post_init__")


def release_of(log_id: LogId, release_lsn: Lsn, drained_epoch: Epoch = _NOT_DRAINED) -> Release:
    """``Release(...)`` set through the slots' descriptors: a fraction of the frozen
    dataclass ``__init__``'s cost (a sequencer with many busy logs builds one per append)."""
    release = _new_object(Release)
    _set_log_id(release, log_id)
    _set_release_lsn(release, release_lsn)
    _set_drained_epoch(release, drained_epoch)
    return release
