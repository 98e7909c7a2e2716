"""What the front end needs from the roles beside it on a node, as protocols: the local
sequencer (``sequencer.runtime.SequencerRuntime`` implements ``LocalSequencer``) and the
failure detector's view (``gossip.runtime.GossipRuntime`` implements ``MembershipView``).
``services`` wires the real ones in; the front end never imports another role."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId


class AppendAnswer(Protocol):
    """The answer of one append on the local sequencer."""

    @property
    def status(self) -> Status: ...
    @property
    def first_lsn(self) -> Lsn: ...
    @property
    def last_lsn(self) -> Lsn: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def message(self) -> str: ...


class LocalSequencer(Protocol):
    def append_nowait(self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
                      producer: tuple[str, int] | None,
                      done: Callable[[AppendAnswer], None], *, compression: int = 0,
                      records: int = 0) -> None:
        """Stage an append; ``done`` gets its answer exactly once, later or (shutting down)
        at once. No Task and no future per append."""
        ...

    async def append(self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None,
                     producer: tuple[str, int] | None = None, *, compression: int = 0,
                     records: int = 0) -> AppendAnswer: ...

    def is_active(self, log_id: LogId) -> bool: ...

    def release_lsn(self, log_id: LogId) -> Lsn: ...

    def epoch(self, log_id: LogId) -> Epoch: ...

    def inflight_tail(self, log_id: LogId) -> Lsn:
        """The highest LSN the log's active sequencer here has handed out (at least its
        release pointer)."""
        ...

    def active_tails(self) -> list[tuple[LogId, Lsn, Lsn]]:
        """``(log, release_lsn, inflight_tail)`` of every log active here."""
        ...

    def request_activation(self, log_id: LogId) -> None:
        """Activate the log's sequencer if it is not active, with no append."""
        ...

    async def wait_release_above(self, log_id: LogId, lsn: Lsn, timeout_s: float) -> None: ...


ViewListener = Callable[[Mapping[NodeId, str]], None]
"""Called with every node's state name (ALIVE, SUSPECT, DEAD) when the view changes."""


class MembershipView(Protocol):
    def view(self) -> Mapping[NodeId, str]: ...

    def subscribe(self, listener: ViewListener) -> None: ...
