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
