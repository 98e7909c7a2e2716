"""The pure CAS rules (epoch_store.core.metadata) and the stored form (epoch_store.core.records)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from epoch_store.core import metadata as core
from epoch_store.core import records
from shared.epoch_metadata import LastCleanEpoch, LogMetadata, ProvisionSpec
from shared.status import Status
from shared.types import EPOCH_MAX, Epoch, Esn, LogId, Lsn, NodeId, compose_lsn

LOG = LogId(3)
SPEC = ProvisionSpec(nodeset=(NodeId("a"), NodeId("b")), replication_factor=2)


def meta(next_epoch: int, version: int = 4) -> LogMetadata:
    return LogMetadata(log_id=LOG, next_epoch=Epoch(next_epoch), nodeset=SPEC.nodeset,
                       replication_factor=2, last_writer=None, version=version)


def test_activation_of_a_new_log_provisions_and_takes_epoch_one() -> None:
    status, after = core.plan_activation(None, log_id=LOG, writer=NodeId("w"), provision=SPEC)
    assert status == Status.OK and after is not None
    assert (after.next_epoch, after.version, after.last_writer) == (2, 1, "w")
    assert core.epoch_taken(after) == 1
    assert core.plan_activation(None, log_id=LOG, writer=NodeId("w"), provision=None) == (
        Status.NOTFOUND, None
    )


def test_activation_bumps_by_one_and_stops_at_epoch_max() -> None:
    status, after = core.plan_activation(meta(7), log_id=LOG, writer=NodeId("w"), provision=None)
    assert status == Status.OK and after is not None
    assert (core.epoch_taken(after), after.next_epoch, after.version) == (7, 8, 5)
    last_ok = core.plan_activation(meta(EPOCH_MAX - 1), log_id=LOG, writer=NodeId("w"),
                                   provision=None)[1]
    assert last_ok is not None and core.epoch_taken(last_ok) == EPOCH_MAX - 1
    assert core.plan_activation(meta(EPOCH_MAX), log_id=LOG, writer=NodeId("w"),
                                provision=None) == (Status.TOOBIG, None)


def test_provision_specs_are_checked() -> None:
    bad = [
        ProvisionSpec(nodeset=(), replication_factor=1),
        ProvisionSpec(nodeset=(NodeId("a"), NodeId("a")), replication_factor=1),
        ProvisionSpec(nodeset=(NodeId("a"),), replication_factor=0),
        ProvisionSpec(nodeset=(NodeId("a"),), replication_factor=2),
        ProvisionSpec(nodeset=(NodeId("bad id"),), replication_factor=1),
        ProvisionSpec(nodeset=tuple(NodeId(f"n{i}") for i in range(200)), replication_factor=1),
    ]
    for spec in bad:
        assert core.check_provision(spec) == Status.INVALID_PARAM, spec
    assert core.check_provision(SPEC) == Status.OK


def test_last_clean_epoch_rules() -> None:
    def plan(current: LastCleanEpoch | None, epoch: int, provisioned: bool = True,
             tail: int = 0) -> tuple[Status, LastCleanEpoch | None]:
        return core.plan_last_clean_epoch(current, log_id=LOG, log_provisioned=provisioned,
                                          epoch=Epoch(epoch), tail_lsn=Lsn(tail))

    assert plan(None, 1, provisioned=False) == (Status.NOTFOUND, None)
    status, first = plan(None, 2, tail=compose_lsn(Epoch(2), Esn(5)))
    assert status == Status.OK and first is not None and first.version == 1
    assert plan(first, 2) == (Status.STALE, None)
    assert plan(first, 1) == (Status.STALE, None)
    assert plan(first, 3)[1] == LastCleanEpoch(log_id=LOG, epoch=Epoch(3), tail_lsn=Lsn(0),
                                               version=2)
    assert plan(first, 0)[0] == Status.INVALID_PARAM
    assert plan(first, 3, tail=compose_lsn(Epoch(4), Esn(0)))[0] == Status.INVALID_PARAM
    assert core.view_last_clean_epoch(None, log_id=LOG, log_provisioned=True) == (
        Status.OK, core.no_last_clean_epoch(LOG)
    )


node_ids = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True).map(NodeId)


@given(
    next_epoch=st.integers(1, EPOCH_MAX),
    nodeset=st.lists(node_ids, min_size=1, max_size=10, unique=True),
    writer=st.none() | node_ids,
    version=st.integers(1, 2**40),
)
def test_metadata_round_trips(next_epoch: int, nodeset: list[NodeId], writer: NodeId | None,
                              version: int) -> None:
    value = LogMetadata(log_id=LOG, next_epoch=Epoch(next_epoch), nodeset=tuple(nodeset),
                        replication_factor=len(nodeset), last_writer=writer, version=version)
    data = records.decode(records.encode(records.metadata_to_dict(value)))
    assert isinstance(data, dict)
    assert records.metadata_from_dict(data, LOG) == value


def test_lce_round_trips() -> None:
    value = LastCleanEpoch(log_id=LOG, epoch=Epoch(9), tail_lsn=compose_lsn(Epoch(9), Esn(1)),
                           version=3)
    data = records.decode(records.encode(records.lce_to_dict(value)))
    assert isinstance(data, dict) and records.lce_from_dict(data, LOG) == value


def test_damaged_objects_decode_to_a_reason() -> None:
    good: dict[str, Any] = records.metadata_to_dict(meta(5))
    for raw in [b"", b"{", b"[]", b'{"format": 99}', b"\xff\xfe", b" " * 70_000]:
        assert isinstance(records.decode(raw), str), raw
    damaged = [
        {**good, "next_epoch": 0}, {**good, "next_epoch": "5"}, {**good, "nodeset": []},
        {**good, "replication_factor": 3}, {**good, "version": 0}, {**good, "extra": 1},
        {**good, "last_writer": "a b"}, {**good, "log_id": 4}, {**good, "log_id": True},
        {**good, "nodeset": ["a", "a"]},
    ]
    for data in damaged:
        assert isinstance(records.metadata_from_dict(data, LOG), str), data
    lce = records.lce_to_dict(LastCleanEpoch(log_id=LOG, epoch=Epoch(2), tail_lsn=Lsn(0),
                                             version=1))
    for data in [{**lce, "epoch": 0}, {**lce, "tail_lsn": -1}, {**lce, "version": None}]:
        assert isinstance(records.lce_from_dict(data, LOG), str), data

