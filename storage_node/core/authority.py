"""What a storage node can vouch for (its authoritative status), pure.

A node is fully authoritative until it finds that it lost copies; then it says, in every
READ, SEAL, DIGEST, GET_LOG_STATE, FIND_TIME and GET_PRODUCER answer, which LSN ranges of
what it was asked about it cannot vouch for (``shared.authority``; the wire field
``non_authoritative``). Sources of damage:

- the start-up scan finds a bad entry in the middle of a segment (``segment_files``): nothing
  after it is indexed, and the entry boundaries there cannot be trusted, so which logs and
  LSNs it held is unknown. The node becomes non-authoritative for every LSN of every log.
  Copies it received before the scan could be anywhere in the log's LSN space (recovery
  re-replicates old epochs at any time), and until rebuilding restores them it cannot say
  which it lacks.
- a read meets an entry whose CRC (or content) does not match the index: the index knows
  exactly which log and LSNs that entry held, so only that range becomes non-authoritative.

Each damage found also adds to the **damage scope** (``damage_scope``): what a rebuild must
restore. A read's damage is its range; a damaged segment's is what the caller knows from the
segment's index (``storage_node.core.rebuild_scope.segment_scope``), or the whole shard when
that is unknown. The scope accumulates until the node vouches for everything again (after a
rebuild, ``clear``), and is durable with the rest. (The node's non-authoritative ranges do
not shrink to the scope: while a damaged segment is repaired the node still vouches for
nothing, which is safe whatever the scope, and short, since a mini-rebuild's walk is small.)

Nothing here makes a node authoritative again: that is rebuilding's job (repairing the
ranges, then ``clear``). ``storage_node.authority`` keeps the status durable; the simulation's
storage model uses this class as it is.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from shared.authority import NonAuthoritative, checked, clipped, normalized
from shared.cluster_state import DirtyRanges, dirty_of
from shared.types import (
    EPOCH_MAX,
    ESN_MAX,
    LSN_MAX,
    Epoch,
    Esn,
    LogId,
    compose_lsn,
    log_id_valid,
)
from shared.wire.codec import Message
from shared.wire.producer import GetProducer, ProducerState
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.recovery import Digest, GetDigest, Seal, Sealed
from shared.wire.trim import FindTime, FoundTime
from storage_node.core.rebuild_scope import Scope, merged, scope_of

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
LOGS_MAX = 10_000
"""Logs with ranges of their own; past it the node is unsure of every log (safe: it says
less)."""
EVERYTHING: NonAuthoritative = ((1, LSN_MAX),)


class AuthorityStatus:
    """The node's non-authoritative ranges: some for every log, some per log."""

    def __init__(self) -> None:
        self._all: NonAuthoritative = ()
        self._logs: dict[LogId, NonAuthoritative] = {}
        self.damaged_segments: frozenset[int] = frozenset()
        """Segments whose damage made the node non-authoritative (for the operator)."""
        self.version = 0
        """Bumped on every change (a save can tell whether it has anything new to write)."""
        self.damaged = False
        """Whether the node is unsure of anything: a plain attribute, checked per message."""
        self.damage_found = 0
        """Times damage was found (a scan, a read, the status itself lost): durable, so that
        a rebuild under way can tell that copies its donors already sent are gone again
        (``storage_node.core.rebuild.target_step``)."""
        self.damage_covered = 0
        """``damage_found`` when the rebuild under way began: damage found since is not
        repaired by it (durable)."""
        self._scope: Scope = ()
        """What the damage found since the node last vouched for everything lost: per log
        its LSN ranges, or None (the whole shard). Durable."""

    def _changed(self) -> None:
        self.version += 1
        self.damaged = bool(self._all) or bool(self._logs)

    def ranges(self, log_id: LogId, lo: int, hi: int) -> NonAuthoritative:
        """Where in ``[lo, hi]`` of ``log_id`` the node cannot vouch for its answers."""
        own = self._logs.get(log_id)
        if not own:
            return clipped(self._all, lo, hi)
        return clipped(normalized((*self._all, *own)), lo, hi)

    def damage_scope(self) -> Scope:
        """What a rebuild of the damage found so far must restore (``rebuild_scope``): per
        log its LSN ranges, or None for the whole shard (also when the node is unsure of
        something and no scope says why, e.g. a status written before scopes existed)."""
        if self._scope is None or (not self._scope and self.damaged):
            return None
        return self._scope

    def _add_scope(self, scope: Scope) -> None:
        self._scope = merged(self._scope, scope)

    def damaged_ranges(self, log_id: LogId, lo: int, hi: int) -> NonAuthoritative:
        """Where in ``[lo, hi]`` of ``log_id`` a read found the node's own copies damaged
        (not the ranges it is unsure of for every log): rebuilding writes over those."""
        return clipped(self._logs.get(log_id, ()), lo, hi)

    def snapshot(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "all_logs": [list(r) for r in self._all],
                "logs": {str(log_id): [list(r) for r in ranges]
                         for log_id, ranges in sorted(self._logs.items())},
                "damaged_segments": sorted(self.damaged_segments),
                "damage_found": self.damage_found, "damage_covered": self.damage_covered,
                "scope_all": self._scope is None,
                "scope": [[log_id, [list(r) for r in ranges]]
                          for log_id, ranges in self._scope or ()]}

    # ---- changes (each returns whether anything changed: then ``save``) -------------------

    def segments_damaged(self, segment_ids: frozenset[int], scope: Scope = None) -> bool:
        """The start-up scan (or the scrub) found these segments damaged mid-way; ``scope``:
        what they held, as far as their index knows (None: unknown, the whole shard)."""
        new = segment_ids - self.damaged_segments
        if not new:
            return False
        self.damaged_segments |= new
        self.damage_found += 1
        self._add_scope(scope)
        log.error("segments %s are damaged: this node is no longer authoritative for any log "
                  "until it is rebuilt", sorted(new))
        self._all = EVERYTHING
        self._changed()
        return True

    def range_damaged(self, log_id: LogId, first_lsn: int, last_lsn: int) -> bool:
        """A read found the copies of ``[first_lsn, last_lsn]`` of ``log_id`` damaged."""
        if clipped(self._logs.get(log_id, ()), first_lsn, last_lsn) == (
                (first_lsn, last_lsn),):
            # Known already. (Not merely inside what the node is unsure of for every log: a
            # mini-rebuild under way may not cover this range, and a rebuild must replace
            # the damaged copy, which it does only where ``damaged_ranges`` says so.)
            return False
        if (log_id not in self._logs and len(self._logs) >= LOGS_MAX
                and self._all == EVERYTHING and self._scope is None):
            return False  # too many logs to tell: unsure of all, the whole shard rebuilt
        log.error("log %d: copies of LSNs %d..%d are damaged: this node no longer vouches for "
                  "them until they are rebuilt", log_id, first_lsn, last_lsn)
        if log_id not in self._logs and len(self._logs) >= LOGS_MAX:
            self._all = EVERYTHING
            self._add_scope(None)
        else:
            self._logs[log_id] = normalized((*self._logs.get(log_id, ()),
                                             (first_lsn, last_lsn)))
            self._add_scope(scope_of([(log_id, first_lsn, last_lsn)]))
        self.damage_found += 1
        self._changed()
        return True

    def clear(self, log_id: LogId | None, first_lsn: int, last_lsn: int) -> bool:
        """``[first_lsn, last_lsn]`` (of ``log_id``, or of every log) was repaired: the node
        vouches for it again (for rebuilding; nothing calls it yet)."""
        def cut(ranges: NonAuthoritative) -> NonAuthoritative:
            kept: list[tuple[int, int]] = []
            for lo, hi in ranges:
                if hi < first_lsn or lo > last_lsn:
                    kept.append((lo, hi))
                    continue
                if lo < first_lsn:
                    kept.append((lo, first_lsn - 1))
                if hi > last_lsn:
                    kept.append((last_lsn + 1, hi))
            return tuple(kept)

        before = (self._all, dict(self._logs), self._scope)
        if log_id is None:
            self._all = cut(self._all)
            self._logs = {k: r for k, v in self._logs.items() if (r := cut(v))}
            if first_lsn <= 1 and last_lsn >= LSN_MAX:
                self._scope = ()  # vouches for everything again: nothing left to repair
            elif self._scope:
                self._scope = scope_of((log, lo, hi) for log, ranges in self._scope
                                       for lo, hi in cut(ranges)) or ()
        elif log_id in self._logs:
            ranges = cut(self._logs[log_id])
            if ranges:
                self._logs[log_id] = ranges
            else:
                del self._logs[log_id]
        if before == (self._all, self._logs, self._scope):
            return False
        self._changed()
        return True

    def unsure_of_everything(self) -> None:
        """Vouch for nothing (a new disk, or the status itself was lost or is unreadable)."""
        self._all = EVERYTHING
        self._scope = None
        self._changed()

    def status_lost(self) -> None:
        """The durable status is unreadable: vouch for nothing, and count it as damage (what
        it said about a rebuild under way is gone too)."""
        self.damage_found = max(self.damage_found, self.damage_covered) + 1
        self.unsure_of_everything()

    def rebuild_covers(self, damage_found: int) -> None:
        """A rebuild of everything began (or began again) after ``damage_found`` damage
        was found: that damage is repaired by it."""
        if damage_found > self.damage_covered:
            self.damage_covered = damage_found
            self._changed()

    def restore(self, document: Any) -> bool:
        """The status from ``snapshot``'s document; False (nothing changed) if malformed."""
        if type(document) is not dict or document.get("version") != FORMAT_VERSION:
            return False
        all_logs = checked(_pairs(document.get("all_logs")))
        logs = document.get("logs")
        segments = document.get("damaged_segments")
        if all_logs is None or type(logs) is not dict or type(segments) is not list or not all(
                type(s) is int for s in segments):
            return False
        restored: dict[LogId, NonAuthoritative] = {}
        for key, value in logs.items():
            ranges = checked(_pairs(value))
            if not key.isdigit() or not log_id_valid(int(key)) or not ranges:
                return False
            restored[LogId(int(key))] = ranges
        found, covered = document.get("damage_found", 0), document.get("damage_covered", 0)
        if type(found) is not int or type(covered) is not int or min(found, covered) < 0:
            return False
        # A status written before scopes: the whole shard if it is unsure of anything.
        scope_all = document.get("scope_all", bool(all_logs or restored))
        scope: DirtyRanges | None = dirty_of(document.get("scope", []))
        if type(scope_all) is not bool or scope is None:
            return False
        self._scope = None if scope_all else scope
        self._all, self._logs = all_logs, restored
        self.damaged_segments = frozenset(segments)
        self.damage_found, self.damage_covered = found, covered
        self._changed()
        return True


def _pairs(value: Any) -> Any:
    """JSON lists of two-element lists as the tuples ``checked`` expects."""
    if type(value) is not list:
        return None
    return tuple(tuple(item) if type(item) is list else item for item in value)


ReplyFn = Callable[[Message], None]


def annotated_reply(status: AuthorityStatus, message: Message, reply: ReplyFn) -> ReplyFn:
    """``reply`` that adds the node's non-authoritative ranges for what ``message`` asked
    about to its answer (READ_REPLY, SEALED, DIGEST, LOG_STATE, FOUND_TIME, PRODUCER_STATE);
    other messages' answers pass unchanged. Only used while the node is unsure of anything
    (``AuthorityStatus.damaged``)."""
    window = _asked_window(message)
    if window is None:
        return reply
    log_id, lo, hi = window
    if not log_id_valid(log_id):
        return reply
    ranges = status.ranges(log_id, lo, hi)
    if not ranges:
        return reply

    def annotated(answer: Message) -> None:
        if isinstance(answer, ReadReply | Sealed | Digest | LogState | FoundTime
                      | ProducerState):
            answer = dataclasses.replace(answer, non_authoritative=ranges)
        reply(answer)

    return annotated


def _asked_window(message: Message) -> tuple[LogId, int, int] | None:
    """(log, first LSN, last LSN) that an answer to ``message`` speaks about (fields not yet
    validated: out-of-range values widen the window, which only says more is unsure)."""
    lo: int
    hi: int
    if type(message) is Read:
        lo, hi = message.from_lsn, message.until_lsn
    elif type(message) is Seal:
        lo = _epoch_lsn(min(message.from_epoch, message.seal_epoch), 0)
        hi = _epoch_lsn(message.seal_epoch, ESN_MAX)
    elif type(message) is GetDigest:
        lo = _epoch_lsn(message.epoch, max(message.from_esn, 1))
        hi = _epoch_lsn(message.epoch, ESN_MAX)
    elif isinstance(message, GetLogState | FindTime | GetProducer):
        lo, hi = 1, LSN_MAX
    else:
        return None
    lo = min(max(lo, 1), LSN_MAX)
    return message.log_id, lo, min(max(hi, lo), LSN_MAX)


def _epoch_lsn(epoch: int, esn: int) -> int:
    if not 0 <= epoch <= EPOCH_MAX + 1 or not 0 <= esn <= ESN_MAX:
        return LSN_MAX if epoch > 0 else 1
    return compose_lsn(Epoch(epoch), Esn(esn))
