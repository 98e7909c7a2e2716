"""One client append as the simulation tracks it, from issue to the client's answer.

The client's answer (``outcome``) and the core's answer (``core_reply``) differ when the
client gave up first (TIMEDOUT after ``append_timeout_ms``, outcome unknown), when the
sequencer node died (CONNFAILED or SHUTDOWN, outcome unknown), or when the append never
reached a core (``refused``: nothing was written).
"""

from __future__ import annotations

from dataclasses import dataclass

import lz4.frame
import msgpack

from sequencer.core.effects import AppendReply
from shared.compression import expand_stored
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.store import Store

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


def sim_blob(payloads: tuple[bytes, ...]) -> bytes:
    """A compressed batch (``shared.compression``'s format, lz4) even where compressing does
    not pay, as the simulation's payloads are too short for that."""
    blob: bytes = lz4.frame.compress(msgpack.packb(payloads, use_bin_type=True),
                                     store_size=True)
    return blob


def store_payloads(store: Store) -> tuple[bytes, ...]:
    """A STORE's records' payloads, a compressed batch expanded (as storage nodes' reads and
    digests see them)."""
    if not store.compression:
        return store.payloads
    payloads = expand_stored(store.payloads[0], store.compression, store.records)
    assert isinstance(payloads, tuple), payloads
    return payloads
