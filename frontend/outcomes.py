"""The seam between the HTTP API and the node's roles: what a request handler may ask for.

The HTTP layer parses and validates a request, calls one method here, and maps the returned
``Status`` to an HTTP answer. Implemented by ``frontend.service.FrontEnd``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId

GapType = Literal["HOLE", "BRIDGE", "TRIM", "DATALOSS"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendOutcome:
    status: Status
    first_lsn: Lsn = Lsn(0)
    last_lsn: Lsn = Lsn(0)
    timestamp_ms: int = 0
    sequencer_node: NodeId | None = None
    message: str = ""
    redirect_http: str | None = None
    """Set (with ``NOSEQUENCER``) when the append asked ``no_forward`` and another node,
    ``sequencer_node`` at this HTTP address, sequences the log: nothing was written."""
    redirect_data: str | None = None
    """With ``redirect_http``: the ``host:port`` of that node's data port, for binary
    clients."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordOut:
    lsn: Lsn
    timestamp_ms: int
    key: str | None
    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class GapOut:
    type: GapType
    lo: Lsn
    hi: Lsn


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOutcome:
    status: Status
    records: list[RecordOut] = field(default_factory=list)
    gaps: list[GapOut] = field(default_factory=list)
    next_lsn: Lsn = Lsn(0)
    release_lsn: Lsn = Lsn(0)
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TailOutcome:
    status: Status
    release_lsn: Lsn = Lsn(0)
    trim_lsn: Lsn = Lsn(0)
    epoch: Epoch = Epoch(0)
    sequencer_node: NodeId | None = None
    message: str = ""
    settling: bool = False
    """NOTREADY only while a sequencer activates, recovers or takes over (soon ready), not
    because too few storage nodes answer (ready only once they are back)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LsnOutcome:
    """The answer to ``trim`` (the trim point now) or ``find_time`` (the LSN found)."""

    status: Status
    lsn: Lsn = Lsn(0)
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeOut:
    node_id: NodeId
    roles: tuple[str, ...]
    http: str
    state: Literal["ALIVE", "SUSPECT", "DEAD"]
    sequencer_weight: float
    storage_capacity: float
    data: str = ""
    """``host:port`` of the node's data port (node-to-node and binary client protocol)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesetOut:
    first_epoch: Epoch
    last_epoch: Epoch
    replication_factor: int
    nodes: tuple[tuple[NodeId, str], ...]
    """(node id, ``host:port`` of its node-to-node transport, or "" when unknown) for each
    nodeset member."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesetsOutcome:
    """Where a log's records are, for readers that read storage nodes directly."""

    status: Status
    nodesets: tuple[NodesetOut, ...] = ()
    cluster_fingerprint: str = ""
    protocol_version: int = 0
    release_lsn: Lsn = Lsn(0)
    """The freshest release pointer the answering node could get (its sequencer's, or the
    owner's): a reader starting from it sees every record acknowledged before it asked, even
    where a storage node has not yet been told the release."""
    message: str = ""


class LogService(Protocol):
    """Statuses: every method may return ``NOTREADY``, ``SHUTDOWN`` or ``INTERNAL``.

    ``append``: ``OK``, ``SEQNOBUFS`` (window full, nothing written), ``NOSEQUENCER``,
    ``NOTFOUND`` (log not provisioned and provisioning off), ``TIMEDOUT`` (outcome unknown),
    ``OVERLOADED``, ``NOSPC``, ``TOOBIG``.
    ``read``/``tail``: ``OK``, ``NOTFOUND``, ``NOSEQUENCER``, ``TIMEDOUT``.
    ``find_time``: ``OK``, ``NOTFOUND``, ``NOTREADY`` (fewer than an f-majority answered).
    ``nodesets``: ``OK``, ``NOTFOUND``.
    ``trim``: ``OK``, ``NOTFOUND``, ``INVALID_PARAM`` (beyond the release pointer),
    ``NOTREADY`` (too few storage nodes confirmed; retry: trimming is idempotent).
    """

    node_id: NodeId
    cluster_name: str
    cluster_fingerprint: str
    """What a binary client's HELLO must carry (docs/PROTOCOL.md)."""

    async def append(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
        producer: tuple[str, int] | None = None, no_forward: bool = False,
        compression: int = 0, records: int = 0,
    ) -> AppendOutcome:
        """Append one record (one payload) or an atomic batch (several payloads, consecutive
        LSNs in one epoch, request order). With ``no_forward`` a node that does not sequence
        the log answers with ``redirect_http`` instead of forwarding. ``producer``
        (``(producer_id, producer_seq)``) makes it idempotent: a retry gets the original
        LSNs (``sequencer.core.producers``). ``compression``: ``payloads`` is ``(blob,)``, a
        compressed batch of ``records`` records (``shared.compression``) that the caller
        validated (``shared.compression.decompress_batch``); one LSN per record."""
        ...

    async def read(
        self, log_id: LogId, from_lsn: Lsn, records_max: int, bytes_max: int, wait_ms: int
    ) -> ReadOutcome:
        """Released records and gaps from ``from_lsn`` on; long-polls up to ``wait_ms`` when
        nothing at or after ``from_lsn`` is released yet. Obeys API.md's coverage rule."""
        ...

    async def tail(self, log_id: LogId) -> TailOutcome: ...

    async def tail_ready(self, log_id: LogId) -> TailOutcome:
        """``tail``, waiting a bounded time while it answers NOTREADY (what HTTP serves)."""
        ...

    async def find_time(self, log_id: LogId, timestamp_ms: int) -> LsnOutcome:
        """The lowest released LSN whose record has a timestamp at or after ``timestamp_ms``
        (``release_lsn + 1`` if none)."""
        ...

    async def trim(self, log_id: LogId, trim_lsn: Lsn) -> LsnOutcome:
        """Make every record at or below ``trim_lsn`` unreadable (a ``TRIM`` gap)."""
        ...

    async def nodesets(self, log_id: LogId) -> NodesetsOutcome:
        """The log's nodesets by epoch, the storage nodes' transport addresses and what a
        reader's HELLO must carry: ``OK`` or ``NOTFOUND``."""
        ...

    def cluster_nodes(self) -> list[NodeOut]: ...

    def ready(self) -> bool:
        """True once every role of this node can serve."""
        ...
