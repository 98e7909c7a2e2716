"""RELEASE: the sequencer tells storage nodes that every record of the log up to
``release_lsn`` (in every epoch) may be shown to readers. Best effort and one-way; the periodic
broadcast and the release pointer piggybacked on STOREs are the backstops."""

from __future__ import annotations

from dataclasses import dataclass

from shared.types import LogId, Lsn


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    log_id: LogId
    release_lsn: Lsn
