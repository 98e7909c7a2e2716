"""Effects the sequencer core returns to its driver (besides ``shared.effects.Send``)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId


@dataclass(frozen=True, slots=True)
class AppendReply:
    """Answer the client's append ``request_id``."""

    request_id: int
    status: Status
    first_lsn: Lsn = Lsn(0)
    last_lsn: Lsn = Lsn(0)
    timestamp_ms: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class ActivateEpoch:
    """Take the log's next epoch from the epoch store (provisioning it if needed), read its last
    clean epoch, and report back with ``Sequencer.on_activated``."""

    log_id: LogId


@dataclass(frozen=True, slots=True)
class FetchLogState:
    """Ask ``nodes`` for their release pointer of the log; report each answer with
    ``Sequencer.on_release_hint``. Used when earlier epochs are unclean and this process does
    not know how far they were released."""

    log_id: LogId
    nodes: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class ReleaseAdvanced:
    """The log's release pointer moved (wakes long-polling readers)."""

    log_id: LogId
    release_lsn: Lsn


@dataclass(frozen=True, slots=True)
class WriteLastCleanEpoch:
    """Advance the log's last clean epoch in the epoch store to ``epoch`` with ``tail_lsn``;
    report with ``Sequencer.on_lce_written``."""

    log_id: LogId
    epoch: Epoch
    tail_lsn: Lsn


@dataclass(frozen=True, slots=True)
class RecoveryProgress:
    """Recovery of the log entered ``phase`` (for logs, metrics and failpoints)."""

    log_id: LogId
    phase: str
    attempt: int


@dataclass(frozen=True, slots=True)
class FetchProducer:
    """Look the producer up on the log's storage nodes (``sequencer.core.producers``): once
    epochs before ``epoch`` are recovered, ask the nodeset for the producer's latest appends,
    keep those that read back as records, and report with ``Sequencer.on_producer_fetched``."""

    log_id: LogId
    epoch: Epoch
    producer_id: str


_new_object = object.__new__
(_set_request_id, _set_status, _set_first_lsn, _set_last_lsn, _set_timestamp_ms,
 _set_message) = (AppendReply.__dict__[name].__set__ for name in (
     "request_id", "status", "first_lsn", "last_lsn", "timestamp_ms", "message"))
assert len(AppendReply.__dataclass_fields__) == 6 and not hasattr(AppendReply, "__post_init__")
_set_release_log_id = ReleaseAdvanced.__dict__["log_id"].__set__
_set_release_lsn = ReleaseAdvanced.__dict__["release_lsn"].__set__
assert len(ReleaseAdvanced.__dataclass_fields__) == 2


def append_ok(request_id: int, first_lsn: Lsn, last_lsn: Lsn, timestamp_ms: int) -> AppendReply:
    """``AppendReply(request_id, Status.OK, first_lsn, last_lsn, timestamp_ms)`` set through
    the slots' descriptors (a frozen dataclass ``__init__`` costs several times as much; one
    per append)."""
    reply = _new_object(AppendReply)
    _set_request_id(reply, request_id)
    _set_status(reply, Status.OK)
    _set_first_lsn(reply, first_lsn)
    _set_last_lsn(reply, last_lsn)
    _set_timestamp_ms(reply, timestamp_ms)
    _set_message(reply, "")
    return reply


def release_advanced(log_id: LogId, release_lsn: Lsn) -> ReleaseAdvanced:
    """``ReleaseAdvanced(log_id, release_lsn)``, built as ``append_ok`` builds its reply."""
    effect = _new_object(ReleaseAdvanced)
    _set_release_log_id(effect, log_id)
    _set_release_lsn(effect, release_lsn)
    return effect
