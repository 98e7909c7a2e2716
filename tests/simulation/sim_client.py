"""One client append as the simulation tracks it, from issue to the client's answer.

The client's answer (``outcome``) and the core's answer (``core_reply``) differ when the
client gave up first (TIMEDOUT after ``append_timeout_ms``, outcome unknown), when the
sequencer node died (CONNFAILED or SHUTDOWN, outcome unknown), or when the append never
reached a core (``refused``: nothing was written).
"""

from __future__ import annotations

from dataclasses import dataclass

from sequencer.core.effects import AppendReply
from shared.status import Status
from shared.types import LogId, Lsn, NodeId

NOTHING_WRITTEN = frozenset({Status.SEQNOBUFS, Status.NOSEQUENCER, Status.NOTFOUND})
"""Core answers that promise the append wrote nothing anywhere."""


@dataclass(slots=True, eq=False)
class ClientAppend:
    request_id: int
    log_id: LogId
    payloads: tuple[bytes, ...]
    issued_ms: int
    post_heal: bool = False
    node: NodeId | None = None
    """The sequencer node the append was sent to."""
    reached_core: bool = False
    refused: bool = False
    orphaned: bool = False
    """Its sequencer died before answering."""
    core_reply: AppendReply | None = None
    outcome: Status | None = None
    outcome_ms: int = 0

    @property
    def first_lsn(self) -> Lsn:
        return self.core_reply.first_lsn if self.core_reply is not None else Lsn(0)

    @property
    def last_lsn(self) -> Lsn:
        return self.core_reply.last_lsn if self.core_reply is not None else Lsn(0)

    def answer(self, status: Status, now_ms: int) -> None:
        """The client's answer; the first one wins (later core replies are not seen)."""
        if self.outcome is None:
            self.outcome = status
            self.outcome_ms = now_ms
