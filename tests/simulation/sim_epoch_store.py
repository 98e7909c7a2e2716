"""The epoch store of a simulated cluster: the pure compare-and-swap planners of
``epoch_store.core.metadata`` over two dicts, answering synchronously.

Only one change runs at a time in the simulation, so no compare-and-swap is ever lost; the
harness injects the store's failures (CONNFAILED before a change, TIMEDOUT after one).
"""

from __future__ import annotations

from epoch_store.core import metadata as planner
from shared.epoch_metadata import LastCleanEpoch, LogMetadata, ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId


class SimEpochStore:
    def __init__(self) -> None:
        self.metadata: dict[LogId, LogMetadata] = {}
        self.lce: dict[LogId, LastCleanEpoch] = {}
        self.activations_count = 0

    def activate(self, log_id: LogId, *, writer: NodeId, provision: ProvisionSpec | None,
                 retired: frozenset[NodeId] = frozenset(),
                 ) -> tuple[Status, Epoch, LogMetadata | None]:
        status, bumped = planner.plan_activation(
            self.metadata.get(log_id), log_id=log_id, writer=writer, provision=provision,
            retired=retired)
        if status != Status.OK:
            return status, Epoch(0), None
        assert bumped is not None
        self.metadata[log_id] = bumped
        self.activations_count += 1
        return Status.OK, planner.epoch_taken(bumped), bumped

    def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return planner.view_last_clean_epoch(
            self.lce.get(log_id), log_id=log_id, log_provisioned=log_id in self.metadata)

    def set_last_clean_epoch(self, log_id: LogId, epoch: Epoch, tail_lsn: Lsn) -> Status:
        status, value = planner.plan_last_clean_epoch(
            self.lce.get(log_id), log_id=log_id, log_provisioned=log_id in self.metadata,
            epoch=epoch, tail_lsn=tail_lsn)
        if status == Status.OK:
            assert value is not None
            self.lce[log_id] = value
        return status

    def clean_epoch(self, log_id: LogId) -> Epoch:
        lce = self.lce.get(log_id)
        return lce.epoch if lce is not None else Epoch(0)

    def replication(self, log_id: LogId) -> int:
        return self.metadata[log_id].replication_factor

    def preset(self, log_id: LogId, spec: ProvisionSpec, *, next_epoch: Epoch,
               clean_epoch: Epoch) -> None:
        """Start a log as if earlier epochs had come and gone (for scenarios)."""
        self.metadata[log_id] = LogMetadata(
            log_id=log_id, next_epoch=next_epoch, nodeset=spec.nodeset,
            replication_factor=spec.replication_factor, last_writer=None, version=1)
        if clean_epoch:
            self.lce[log_id] = LastCleanEpoch(log_id=log_id, epoch=clean_epoch,
                                              tail_lsn=Lsn(0), version=1)
