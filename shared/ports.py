"""Protocols through which domains reach the outside: the epoch store, the clock."""

from __future__ import annotations

from typing import Protocol

from shared.epoch_metadata import LastCleanEpoch, LogMetadata, NodesetTarget, ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId


class EpochStore(Protocol):
    """Per-log epoch metadata and last clean epoch. Every method is safe to call from many
    processes at once; every change is a compare-and-swap on a version.

    Statuses: ``OK``; ``NOTFOUND`` (log not provisioned and no ``provision`` given);
    ``TOOBIG`` (epochs exhausted); ``STALE`` (last clean epoch would not increase);
    ``AGAIN`` (lost the CAS race too many times); ``CONNFAILED``/``TIMEDOUT`` (backend
    unreachable; retryable, nothing changed or the change is not known to have happened).
    """

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        """The log's metadata, or ``NOTFOUND``."""
        ...

    async def activate(
        self, log_id: LogId, *, writer: NodeId, provision: ProvisionSpec | None,
        retired: frozenset[NodeId] = frozenset(), target: NodesetTarget | None = None,
    ) -> tuple[Status, Epoch, LogMetadata | None]:
        """Take the log's next epoch for ``writer`` (provisioning the log first if ``provision``
        is given and it does not exist). Returns the epoch taken and the metadata after the
        bump. No epoch is ever returned twice. ``retired``: storage nodes that take no new
        copies; the epoch taken is stored on the log's nodeset without them when at least R
        nodes remain; ``target``: the nodeset the writer wants it on, which the log's nodeset grows
        towards (``shared.epoch_metadata.next_nodeset``)."""
        ...

    async def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        """The last clean epoch; a log without one yet has epoch 0 (``OK``)."""
        ...

    async def set_last_clean_epoch(self, log_id: LogId, epoch: Epoch, tail_lsn: Lsn) -> Status:
        """Advance the last clean epoch; ``STALE`` unless ``epoch`` is higher than the stored."""
        ...

    async def close(self) -> None: ...


class Rng(Protocol):
    """Randomness injected into cores (``random.Random`` satisfies it); seeded in simulation."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...
