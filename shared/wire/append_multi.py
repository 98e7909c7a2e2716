"""APPEND_MULTI / APPENDED_MULTI (protocol version 3, client -> node): the single appends a
client made to many logs in one event-loop iteration, bound for one node, in one frame, and
all their answers in one frame (docs/PROTOCOL.md).

With one busy log a client's appends of one loop iteration already leave as one APPEND (of
many payloads); with 1,000 logs each went as an APPEND frame of its own, and each cost the
client and the node a frame, a decode, a callback and an answer frame (issue 15). An
APPEND_MULTI carries ``(log_id, payloads, key)`` entries, each meaning exactly what an APPEND
of those fields with ``hops`` 0 and ``no_forward`` set means (plain records only: idempotent
and compressed appends still go as APPEND). The node checks and runs each entry on its own
(its own LSNs, its own status) and answers once every entry is answered, positionally:
``answers[i]`` answers ``appends[i]``. An OK answer is ``(0, first_lsn, timestamp_ms)``
(``last_lsn`` is ``first_lsn`` plus the entry's payloads less one); any other is
``(status, sequencer_node, message, redirect_data, retry_after_ms)``, as in APPENDED. The
answering node's id (the sequencer of every OK entry) is sent once, in ``sequencer_node``.

The generic codec checks only that both fields are arrays; ``append_multi_entries`` and
``appended_multi_answers`` check their elements (a malformed frame is BADMSG, never an
exception in a handler).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.status import Status
from shared.types import LogId, Lsn, NodeId, node_id_valid
from shared.wire.append import Append, Appended

APPEND_MULTI_ENTRIES_MAX = 4096
"""Most entries one APPEND_MULTI may carry (a node refuses more: BADMSG)."""

AppendEntry = tuple[LogId, tuple[bytes, ...], str | None]
"""One entry of an APPEND_MULTI: log id, payloads, key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendMulti:
    appends: tuple[tuple[Any, ...], ...]
    """``(log_id, payloads, key)`` entries (``AppendEntry``), checked by
    ``append_multi_entries``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendedMulti:
    sequencer_node: NodeId | None
    """The answering node: the sequencer of every entry answered OK."""
    answers: tuple[tuple[Any, ...], ...]
    """One per entry, in order: ``(0, first_lsn, timestamp_ms)`` for OK, else ``(status,
    sequencer_node, message, redirect_data, retry_after_ms)``."""


def append_multi_entries(message: AppendMulti) -> list[AppendEntry] | None:
    """The entries of ``message`` with their shapes and types checked (not yet the API's
    limits: those are checked per entry, as for an APPEND), or None if it is malformed."""
    appends = message.appends
    if not 0 < len(appends) <= APPEND_MULTI_ENTRIES_MAX:
        return None
    for entry in appends:
        if type(entry) is not tuple or len(entry) != 3:
            return None
        log_id, payloads, key = entry
        if type(log_id) is not int or type(payloads) is not tuple or not (
                key is None or type(key) is str):
            return None
        for payload in payloads:
            if type(payload) is not bytes:
                return None
    return list(appends)


_new_object = object.__new__
_APPEND_SETTERS = tuple(Append.__dict__[name].__set__ for name in (
    "log_id", "payloads", "key", "hops", "producer_id", "producer_seq", "compression",
    "records", "no_forward"))
assert len(Append.__dataclass_fields__) == 9 and not hasattr(Append, "__post_init__")
_ENTRY_DEFAULTS = (0, None, 0, 0, 0, True)
"""``hops``, ``producer_id``, ``producer_seq``, ``compression``, ``records``, ``no_forward``
of the APPEND an entry stands for."""


def entry_append(log_id: LogId, payloads: tuple[bytes, ...], key: str | None) -> Append:
    """``Append(log_id=..., payloads=..., key=..., hops=0, no_forward=True)``, the APPEND an
    entry stands for, built through the slots (a frozen dataclass ``__init__`` costs several
    times as much; one per entry)."""
    append = _new_object(Append)
    for setter, value in zip(_APPEND_SETTERS, (log_id, payloads, key, *_ENTRY_DEFAULTS),
                             strict=True):
        setter(append, value)
    return append


_OK = int(Status.OK)
_STATUS_BY_VALUE: dict[int, Status] = {int(status): status for status in Status}


def ok_answer(first_lsn: int, timestamp_ms: int) -> tuple[int, int, int]:
    return (_OK, first_lsn, timestamp_ms)


def other_answer(answer: Appended) -> tuple[int, str | None, str, str | None, int]:
    """The entry answer of a non-OK ``Appended``."""
    return (int(answer.status), answer.sequencer_node, answer.message, answer.redirect_data,
            answer.retry_after_ms)


OkAnswer = tuple[int, int]
"""An OK entry answer as ``(first_lsn, timestamp_ms)``."""


def appended_multi_results(
    reply: AppendedMulti, entries: list[tuple[LogId, int]]
) -> list[OkAnswer | Appended] | None:
    """Each answer of ``reply``, given each entry's log id and payload count, in order: an OK
    one as ``(first_lsn, timestamp_ms)`` (its sequencer is ``reply.sequencer_node``), any
    other as the APPENDED it stands for; None if ``reply`` does not fit (wrong length or
    shape, unknown status, an OK without a valid LSN range)."""
    answers = reply.answers
    node = reply.sequencer_node
    if len(answers) != len(entries) or not (node is None or node_id_valid(node)):
        return None
    results: list[OkAnswer | Appended] = []
    for answer, (log_id, count) in zip(answers, entries, strict=True):
        if type(answer) is not tuple or not answer or type(answer[0]) is not int:
            return None
        if answer[0] == _OK:
            if len(answer) != 3:
                return None
            _, first_lsn, timestamp_ms = answer
            if (type(first_lsn) is not int or type(timestamp_ms) is not int
                    or not 0 < first_lsn <= (1 << 64) - count or timestamp_ms < 0):
                return None
            results.append((first_lsn, timestamp_ms))
            continue
        status = _STATUS_BY_VALUE.get(answer[0])
        if status is None or len(answer) != 5:
            return None
        _, sequencer_node, text, redirect_data, retry_after_ms = answer
        if (not (sequencer_node is None or (type(sequencer_node) is str
                                            and node_id_valid(sequencer_node)))
                or type(text) is not str
                or not (redirect_data is None or type(redirect_data) is str)
                or type(retry_after_ms) is not int or retry_after_ms < 0):
            return None
        results.append(Appended(
            status=status, log_id=log_id, first_lsn=Lsn(0), last_lsn=Lsn(0), timestamp_ms=0,
            sequencer_node=None if sequencer_node is None else NodeId(sequencer_node),
            message=text, redirect_data=redirect_data, retry_after_ms=retry_after_ms))
    return results


def appended_multi_answers(
    reply: AppendedMulti, entries: list[tuple[LogId, int]]
) -> list[Appended] | None:
    """``appended_multi_results`` with every answer as the APPENDED it stands for."""
    results = appended_multi_results(reply, entries)
    if results is None:
        return None
    node = reply.sequencer_node
    return [result if type(result) is Appended else Appended(
        status=Status.OK, log_id=log_id, first_lsn=Lsn(result[0]),  # type: ignore[index]
        last_lsn=Lsn(result[0] + count - 1), timestamp_ms=result[1],  # type: ignore[index]
        sequencer_node=node, message="")
        for result, (log_id, count) in zip(results, entries, strict=True)]
