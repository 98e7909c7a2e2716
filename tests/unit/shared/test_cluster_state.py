"""The cluster-wide shard state: JSON form (round trip, hostile input), transitions, and the
compare-and-swap loop over the memory and file stores."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from epoch_store.cluster_state import FileClusterState, MemoryClusterState
from shared import cluster_state as cs
from shared.cluster_state import DonorProgress, ShardStatus
from shared.status import Status


def _rebuilding() -> cs.ClusterState:
    state = cs.registered("st1", 1, 10)(cs.EMPTY)
    assert state is not None
    state = cs.registered("st2", 1, 10)(state)
    assert state is not None
    started = cs.rebuild_started("st2", 2, ("st1", "st3"), now_ms=20, reason="disk",
                                 requested_by="st2")(state)
    assert started is not None
    return started


def test_round_trip() -> None:
    state = _rebuilding()
    assert cs.decode(cs.encode(state)) == state


def test_rebuild_lifecycle() -> None:
    state = _rebuilding()
    shard = state.shard("st2")
    assert shard is not None and shard.status is ShardStatus.REBUILDING
    assert shard.rebuild_generation == 2 and shard.rebuilds_count == 1
    assert not shard.donors_done
    # Finishing before every donor is done changes nothing.
    assert cs.rebuild_finished("st2", 2, 30)(state) is None
    for donor in ("st1", "st3"):
        moved = cs.donor_progressed("st2", 2, donor, DonorProgress(5, 9, 3, 100, 200, True, 25))(
            state)
        assert moved is not None
        state = moved
    # A checkpoint for another generation is ignored, and a done donor stays done.
    assert cs.donor_progressed("st2", 1, "st1", DonorProgress(log_id=9))(state) is None
    assert cs.donor_progressed("st2", 2, "st1", DonorProgress(log_id=9))(state) is None
    finished = cs.rebuild_finished("st2", 2, 30)(state)
    assert finished is not None
    shard = finished.shard("st2")
    assert shard is not None and shard.status is ShardStatus.AUTHORITATIVE
    assert shard.generation == 2 and shard.finished_ms == 30
    # Registering a known shard with another generation is not a registration.
    assert cs.registered("st2", 3, 40)(finished) is None


def test_drain_then_remove() -> None:
    state = _rebuilding()
    assert cs.removed("st1", 5)(state) is None  # not drained
    drained = cs.drain_started("st1", ("st2",), now_ms=5, requested_by="op")(state)
    assert drained is not None
    progressed = cs.donor_progressed("st1", 1, "st2", DonorProgress(done=True))(drained)
    assert progressed is not None
    finished = cs.rebuild_finished("st1", 1, 6)(progressed)
    assert finished is not None and finished.shard("st1").status is ShardStatus.DRAINED  # type: ignore[union-attr]
    removed = cs.removed("st1", 7)(finished)
    assert removed is not None and removed.shard("st1").status is ShardStatus.REMOVED  # type: ignore[union-attr]


@given(st.binary(max_size=512))
@settings(max_examples=300)
def test_decode_never_raises_on_bytes(raw: bytes) -> None:
    cs.decode(raw)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["format", "shards", "node_id", "status", "generation", "donors",
                         "done", "since_ms", "reason", "requested_by", "log_id"]),
        children, max_size=6),
    max_leaves=20)


@given(_json)
@settings(max_examples=300)
def test_decode_never_raises_on_json(document: object) -> None:
    state = cs.decode(json.dumps(document).encode())
    if state is not None:
        assert cs.decode(cs.encode(state)) == state


def test_change_retries_lost_races() -> None:
    async def run() -> None:
        store = MemoryClusterState()
        results = await asyncio.gather(*(cs.change(store, cs.registered(f"st{i}", 1, i))
                                         for i in range(10)))
        assert all(status is Status.OK for status, _ in results)
        _, state, version = await store.read()
        assert len(state.shards) == 10 and version == 10

    asyncio.run(run())


def test_file_store_compare_and_swap(tmp_path: Path) -> None:
    async def run() -> None:
        one, two = FileClusterState(str(tmp_path)), FileClusterState(str(tmp_path))
        assert await one.read() == (Status.OK, cs.EMPTY, 0)
        state = _rebuilding()
        assert await one.write(state, expected_version=0) is Status.OK
        assert await two.write(cs.EMPTY, expected_version=0) is Status.AGAIN
        assert await two.read() == (Status.OK, state, 1)
        (tmp_path / "cluster_state.json").write_bytes(b"{nonsense")
        status, _, _ = await two.read()
        assert status is Status.INTERNAL

    asyncio.run(run())


def test_rebuild_id_names_each_rebuild_and_old_documents_decode() -> None:
    """(fix17) Each rebuild or drain started gets the next ``rebuild_id``; a donor's progress
    naming another one is ignored; a document written before the field decodes as id 0 and
    progress without an id is not checked (the old behaviour)."""
    state = _rebuilding()
    shard = state.shard("st2")
    assert shard is not None and shard.rebuild_id == 1
    assert cs.donor_progressed("st2", 2, "st1", DonorProgress(log_id=9), rebuild_id=0)(
        state) is None
    assert cs.donor_progressed("st2", 2, "st1", DonorProgress(log_id=9), rebuild_id=1)(
        state) is not None
    assert cs.decode(cs.encode(state)) == state
    document = json.loads(cs.encode(state))
    for item in document["shards"]:
        del item["rebuild_id"]
    old = cs.decode(json.dumps(document).encode())
    assert old is not None and old.shard("st2").rebuild_id == 0  # type: ignore[union-attr]
    assert cs.donor_progressed("st2", 2, "st1", DonorProgress(log_id=9))(old) is not None
    drained = cs.drain_started("st1", ("st2",), now_ms=5, requested_by="op")(state)
    assert drained is not None and drained.shard("st1").rebuild_id == 1  # type: ignore[union-attr]
