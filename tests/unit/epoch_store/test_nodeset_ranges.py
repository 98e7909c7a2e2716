"""Per-epoch nodesets in the epoch store (issue 17): the planner's choice of the next epoch's
nodeset, and both stored forms (the file journal's records, the JSON of ZooKeeper) round
trip and stay readable for metadata written before nodesets could change."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from epoch_store.core import journal, records
from epoch_store.core.metadata import plan_activation
from shared.epoch_metadata import NODESET_HISTORY_MAX, EpochNodeset, LogMetadata, ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, NodeId

LOG = LogId(3)
W = NodeId("w")
A, B, C, D = (NodeId(n) for n in "abcd")
SPEC = ProvisionSpec(nodeset=(A, B, C, D), replication_factor=2)


def activate(current: LogMetadata | None, retired: frozenset[NodeId] = frozenset()
             ) -> LogMetadata:
    status, after = plan_activation(current, log_id=LOG, writer=W, provision=SPEC,
                                    retired=retired)
    assert status is Status.OK and after is not None
    return after


def test_the_epoch_taken_starts_a_nodeset_without_retired_nodes() -> None:
    meta = activate(activate(None))  # epochs 1 and 2 on abcd
    moved = activate(meta, frozenset({C}))  # epoch 3 on abd
    assert (moved.next_epoch, moved.nodeset, moved.nodeset_since) == (4, (A, B, D), 3)
    assert moved.earlier == (EpochNodeset(Epoch(1), (A, B, C, D), 2),)
    assert moved.nodeset_ranges()[-1] == EpochNodeset(Epoch(3), (A, B, D), 2)
    # Only ever narrower: a second drain adds a range, the first stays.
    twice = activate(moved, frozenset({C, A}))
    assert twice.nodeset == (B, D) and twice.nodeset_since == 4
    assert [r.first_epoch for r in twice.earlier] == [1, 3]


def test_a_log_provisioned_while_a_node_drains_starts_without_it() -> None:
    first = activate(None, frozenset({B}))
    assert (first.nodeset, first.nodeset_since, first.earlier) == ((A, C, D), 1, ())


def test_no_change_below_r_nodes_or_past_the_history_limit() -> None:
    meta = activate(None)
    assert activate(meta, frozenset({A, B, C})).nodeset == (A, B, C, D)
    assert activate(meta, frozenset({NodeId("zz")})).nodeset == (A, B, C, D)
    full = LogMetadata(
        log_id=LOG, next_epoch=Epoch(100), nodeset=(A, B, C, D), replication_factor=2,
        last_writer=W, version=5, nodeset_since=Epoch(90),
        earlier=tuple(EpochNodeset(Epoch(1 + i), (A, B, C, D, NodeId(f"x{i}")), 2)
                      for i in range(NODESET_HISTORY_MAX)))
    assert activate(full, frozenset({A})).nodeset == (A, B, C, D)


def _changed() -> LogMetadata:
    return activate(activate(activate(None), frozenset({C})), frozenset({A}))


def test_journal_records_round_trip_and_old_records_read_as_one_nodeset() -> None:
    meta = _changed()
    raw = journal.encode_record(meta)
    assert journal.decode_metadata(raw, LOG, journal.Interned()) == meta
    plain = activate(None)
    plain_raw = journal.encode_record(plain)
    # A log whose nodeset never changed is stored exactly as before (no trailing ranges).
    assert len(plain_raw) < len(raw)
    decoded = journal.decode_metadata(plain_raw, LOG, journal.Interned())
    assert isinstance(decoded, LogMetadata)
    assert (decoded.nodeset_since, decoded.earlier) == (1, ())


def test_json_round_trip_and_old_documents() -> None:
    meta = _changed()
    data = json.loads(records.encode(records.metadata_to_dict(meta)))
    assert records.metadata_from_dict(data, LOG) == meta
    old = records.metadata_to_dict(activate(None))
    assert "earlier" not in old and "nodeset_since" not in old
    decoded = records.metadata_from_dict(old, LOG)
    assert isinstance(decoded, LogMetadata) and decoded.earlier == ()
    for bad in ({**data, "earlier": []}, {**data, "nodeset_since": 0},
                {k: v for k, v in data.items() if k != "earlier"},
                {**data, "earlier": [{**data["earlier"][0], "first_epoch": 2}]},
                {**data, "earlier": [data["earlier"][1], data["earlier"][0]]},
                {**data, "earlier": [{**data["earlier"][0], "nodeset": ["a", "a"]}]}):
        assert isinstance(records.metadata_from_dict(bad, LOG), str), bad


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_journal_records_never_raise(data: st.DataObject) -> None:
    raw = bytearray(journal.encode_record(_changed()))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    value = journal.decode_metadata(bytes(raw[:cut]), LOG, journal.Interned())
    assert isinstance(value, (str, LogMetadata))


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.integers(-3, 2**33) | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["first_epoch", "nodeset",
                                                       "replication_factor"]), inner),
                    max_leaves=8),
       st.integers(-2, 2**33))
def test_hostile_json_ranges_never_raise(earlier: object, since: int) -> None:
    data = {**records.metadata_to_dict(_changed()), "earlier": earlier,
            "nodeset_since": since}
    assert isinstance(records.metadata_from_dict(data, LOG), (str, LogMetadata))
