"""Mini-rebuilding (issue 17): the scope of damaged copies (per log LSN ranges, merged,
escalated to the whole shard when unknown or too big), what the damaged node decides at a
poll, the donor's walk of only those ranges, the cluster state's record of it, the scope a
damaged segment's index file gives; and the rate limit's bounded burst."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from epoch_store.cluster_state import MemoryClusterState
from shared import cluster_state as cs
from shared.cluster_state import (
    DIRTY_RANGES_MAX,
    DOCUMENT_DIRTY_RANGES_MAX,
    DonorProgress,
    ShardState,
    ShardStatus,
)
from shared.status import Status
from shared.types import LSN_MAX, LogId
from storage_node.core.authority import AuthorityStatus
from storage_node.core.rebuild import (
    AskTails,
    DonorCore,
    Finished,
    Piece,
    ReadChunk,
    SaveCheckpoint,
    SendChunk,
    Sleep,
    Tail,
    TokenBucket,
)
from storage_node.core.rebuild_scope import (
    TargetStep,
    merged,
    scope_of,
    segment_scope,
    target_decision,
)
from tests.unit.storage_node.helpers import (
    lsn,
    make_store,
    one_node_rebuild_runtime,
    running_node,
    segment_paths,
    storage_config,
    store_all,
)

L1, L2, L3 = LogId(1), LogId(2), LogId(3)


# ---- scopes ----------------------------------------------------------------------------


def test_ranges_are_joined_per_log() -> None:
    assert scope_of([(2, 5, 9), (1, 10, 20), (2, 10, 12), (2, 30, 40), (1, 15, 25)]) == (
        (1, ((10, 25),)), (2, ((5, 12), (30, 40))))
    assert scope_of([]) == ()
    assert scope_of([(1, 0, 5)]) is None and scope_of([(1, 9, 5)]) is None  # not ranges


def test_several_damages_are_merged_and_an_unranged_one_escalates() -> None:
    first = scope_of([(1, 10, 20)])
    second = scope_of([(1, 21, 30), (3, 5, 5)])
    assert merged(first, second) == ((1, ((10, 30),)), (3, ((5, 5),)))
    assert merged(first, None) is None and merged(None, second) is None
    assert merged((), first) == first


def test_too_many_ranges_become_one_per_log_then_the_whole_shard() -> None:
    many = [(1, 2 * i + 1, 2 * i + 1) for i in range(DIRTY_RANGES_MAX + 1)]
    assert scope_of(many) == ((1, ((1, 2 * DIRTY_RANGES_MAX + 1),)),)  # more, never less
    logs = [(log_id, 1, 1) for log_id in range(1, DIRTY_RANGES_MAX + 2)]
    assert scope_of(logs) is None


def test_a_segment_scope_is_one_range_per_log() -> None:
    # Pieces sorted by first LSN; a later piece may end before an earlier one.
    assert segment_scope({2: [(5, 100), (7, 8), (200, 210)], 1: [(3, 3)], 4: []}) == (
        (1, ((3, 3),)), (2, ((5, 210),)))


# ---- the damaged node's decision ---------------------------------------------------------


def _shard(status: ShardStatus, *, generation: int = 2, done: bool = False,
           dirty: cs.DirtyRanges = ()) -> ShardState:
    return ShardState("st2", generation, status, rebuild_generation=generation,
                      donors=(("st1", DonorProgress(done=done)),), dirty=dirty)


def test_damage_on_an_authoritative_shard_starts_a_mini_rebuild_of_its_ranges() -> None:
    authoritative = _shard(ShardStatus.AUTHORITATIVE)
    ranged = scope_of([(1, 10, 20)])
    decision = target_decision(authoritative, 2, damaged=True, damage_found=1,
                               damage_covered=0, pending=ranged)
    assert decision.step is TargetStep.START and decision.dirty == ranged
    whole = target_decision(authoritative, 2, damaged=True, damage_found=1,
                            damage_covered=0, pending=None)
    assert whole.step is TargetStep.START and whole.dirty == ()  # the whole shard
    assert target_decision(authoritative, 2, damaged=False, damage_found=0, damage_covered=0,
                           pending=()).step is TargetStep.NOTHING
    assert target_decision(authoritative, 3, damaged=True, damage_found=1, damage_covered=0,
                           pending=ranged).step is TargetStep.NOTHING  # another disk


def test_damage_found_during_a_mini_rebuild_restarts_it_over_both_scopes() -> None:
    mini = _shard(ShardStatus.REBUILDING, dirty=scope_of([(1, 10, 20)]), done=True)
    again = target_decision(mini, 2, damaged=True, damage_found=2, damage_covered=1,
                            pending=scope_of([(1, 10, 20), (2, 1, 5)]))
    assert again.step is TargetStep.RESTART
    assert again.dirty == ((1, ((10, 20),)), (2, ((1, 5),)))
    unranged = target_decision(mini, 2, damaged=True, damage_found=2, damage_covered=1,
                               pending=None)
    assert unranged.step is TargetStep.RESTART and unranged.dirty == ()  # escalated
    full = _shard(ShardStatus.REBUILDING, done=True)
    assert target_decision(full, 2, damaged=True, damage_found=2, damage_covered=1,
                           pending=scope_of([(2, 1, 5)])).dirty == ()  # stays whole
    assert target_decision(mini, 2, damaged=True, damage_found=1, damage_covered=1,
                           pending=scope_of([(1, 10, 20)])).step is TargetStep.FINISH
    assert target_decision(mini, 3, damaged=True, damage_found=2, damage_covered=1,
                           pending=None).step is TargetStep.NOTHING


# ---- the authority status keeps the scope ------------------------------------------------


def test_the_damage_scope_accumulates_is_durable_and_clears_with_the_rebuild() -> None:
    status = AuthorityStatus()
    assert status.damage_scope() == ()
    assert status.segments_damaged(frozenset({4}), scope_of([(1, 100, 200)]))
    assert status.ranges(L2, 1, 5) == ((1, 5),)  # unsure of everything meanwhile
    # A read's damage elsewhere, while unsure of everything, still counts and is ranged: a
    # mini-rebuild under way does not cover it.
    assert status.range_damaged(L2, 7, 9)
    assert status.damage_found == 2
    assert status.damage_scope() == ((1, ((100, 200),)), (2, ((7, 9),)))
    assert not status.range_damaged(L2, 7, 9)  # known already
    restored = AuthorityStatus()
    assert restored.restore(json.loads(json.dumps(status.snapshot())))
    assert restored.damage_scope() == status.damage_scope()
    assert status.clear(None, 1, LSN_MAX)
    assert status.damage_scope() == () and not status.damaged


def test_unranged_damage_and_old_files_rebuild_the_whole_shard() -> None:
    status = AuthorityStatus()
    status.range_damaged(L1, 1, 2)
    status.segments_damaged(frozenset({1}))  # no scope: unknown
    assert status.damage_scope() is None
    old = status.snapshot()
    del old["scope"], old["scope_all"]  # a file written before scopes
    older = AuthorityStatus()
    assert older.restore(old) and older.damage_scope() is None
    lost = AuthorityStatus()
    lost.status_lost()
    assert lost.damage_scope() is None
    assert not AuthorityStatus().restore(dict(status.snapshot(), scope=[[1, [[5, 3]]]]))


# ---- the donor walks only the ranges ------------------------------------------------------


def _piece(lsn_: int, size: int = 10) -> Piece:
    return Piece(lsn_, lsn_, ("st1", "st2"), b"x" * size, size)


def test_a_mini_rebuild_donor_plans_its_logs_only_and_walks_only_their_ranges() -> None:
    dirty = ((1, ((10, 20), (40, 45))), (3, ((5, 6),)))
    core = DonorCore(shard="st2", logs=[(1, 1000), (2, 1000), (3, 1000)],
                     progress=DonorProgress(), bucket=TokenBucket(0, 100, 0),
                     by_copyset=False, checkpoint_interval_ms=1_000, now_ms=0, dirty=dirty)
    assert core.next(0) == AskTails((1, 3), everywhere=False)  # not log 2, not everywhere
    core.on_tails({1: Tail(500, 500, 1000), 3: Tail(0, 0, 1000)}, 0)
    walked = []
    while True:
        effect = core.next(0)
        if isinstance(effect, ReadChunk):
            walked.append((effect.log_id, effect.from_lsn, effect.until_lsn))
            core.on_read([_piece(effect.from_lsn)], effect.until_lsn + 1, 0)
        elif isinstance(effect, SendChunk):
            core.on_sent(Status.OK, 0)
        elif isinstance(effect, SaveCheckpoint):
            core.on_checkpointed(True, 0)
        else:
            assert isinstance(effect, Finished)
            break
    # The tail (500) does not widen a range; the walk is the ranges, in order.
    assert walked == [(1, 10, 20), (1, 40, 45), (3, 5, 6)]
    assert effect.progress.records == 3


def test_a_mini_rebuild_resumes_inside_its_ranges() -> None:
    dirty = ((1, ((10, 20), (40, 45))), (3, ((5, 6),)))
    core = DonorCore(shard="st2", logs=[], progress=DonorProgress(log_id=1, next_lsn=42),
                     bucket=TokenBucket(0, 100, 0), by_copyset=False,
                     checkpoint_interval_ms=1_000, now_ms=0, tails=False, dirty=dirty)
    assert core.next(0) == ReadChunk(1, 42, 45)
    core.on_read([], 46, 0)
    assert core.next(0) == ReadChunk(3, 5, 6)


def test_a_whole_shard_walk_is_unchanged() -> None:
    core = DonorCore(shard="st2", logs=[(2, 0), (1, 3)], progress=DonorProgress(),
                     bucket=TokenBucket(0, 100, 0), by_copyset=False,
                     checkpoint_interval_ms=1_000, now_ms=0, tails=False)
    assert core.next(0) == ReadChunk(1, 1, 3)
    core.on_read([], 4, 0)
    saved = core.next(0)  # log 2 holds nothing (its last LSN 0): passed over
    assert isinstance(saved, SaveCheckpoint)
    core.on_checkpointed(True, 0)
    assert isinstance(core.next(0), Finished)


# ---- the cluster state records it --------------------------------------------------------


def test_the_cluster_state_records_a_mini_rebuild() -> None:
    state = cs.registered("st2", 1, 0)(cs.EMPTY)
    assert state is not None
    dirty = scope_of([(1, 10, 20), (4, 1, 1)])
    assert dirty is not None
    state = cs.rebuild_started("st2", 1, ("st1", "st3"), now_ms=5, reason="damaged",
                               requested_by="st2", dirty=dirty)(state)
    assert state is not None
    shard = state.shard("st2")
    assert shard is not None and shard.mini and shard.dirty == dirty
    assert (shard.rebuilds_count, shard.mini_rebuilds_count) == (1, 1)
    decoded = cs.decode(cs.encode(state))
    assert decoded == state
    shown = cs.as_json(state)[0]
    assert shown["mini"] is True and shown["dirty_ranges"] == [[1, [[10, 20]]], [4, [[1, 1]]]]
    # A document written before mini-rebuilds decodes as whole-shard rebuilds.
    raw = json.loads(cs.encode(state))
    for shard_json in raw["shards"]:
        del shard_json["dirty_ranges"], shard_json["mini_rebuilds_count"], shard_json["mini"]
        del shard_json["scope_logs"], shard_json["scope_ranges"], shard_json["rebuild_id"]
    old = cs.decode(json.dumps(raw).encode())
    assert old is not None and old.shards[0].dirty == () and not old.shards[0].mini


def test_finished_scopes_are_dropped_and_recorded_scopes_are_bounded() -> None:
    """(fix17) A finished rebuild's ranges leave the document (their size stays); a scope
    past ``DIRTY_RANGES_MAX``, or one that would take the document's past
    ``DOCUMENT_DIRTY_RANGES_MAX``, is recorded as the whole shard; so with every shard
    mini-rebuilding as much as it may, the document stays well under ZooKeeper's 1 MiB. An
    older document's bigger scope still decodes."""
    big = 2**62  # LSNs as long as they get in JSON
    widest = tuple((log_id, ((big + 2 * log_id, big + 2 * log_id + 1),))
                   for log_id in range(1, DIRTY_RANGES_MAX + 1))
    state: cs.ClusterState | None = cs.EMPTY
    shards = [f"st{i}" for i in range(100)]
    for name in shards:
        state = cs.registered(name, 1, 0)(state)  # type: ignore[arg-type]
    assert state is not None
    for name in shards:
        state = cs.rebuild_started(name, 1, tuple(s for s in shards if s != name), now_ms=5,
                                   reason="damaged", requested_by=name, dirty=widest)(state)
        assert state is not None
    recorded = [s for s in state.shards if s.dirty]
    assert recorded and all(s.dirty == widest for s in recorded)
    assert sum(cs.ranges_count(s.dirty) for s in state.shards) <= DOCUMENT_DIRTY_RANGES_MAX
    assert all(not s.mini for s in state.shards if not s.dirty)  # escalated: whole shards
    without_donors = cs.ClusterState(tuple(dataclasses.replace(s, donors=())
                                           for s in state.shards))
    assert len(cs.encode(without_donors)) < 512 * 1024
    too_many = tuple((log_id, ((1, 1),)) for log_id in range(1, DIRTY_RANGES_MAX + 2))
    alone = cs.rebuild_started("st0", 2, ("st1",), now_ms=6, reason="r", requested_by="st0",
                               dirty=too_many)(cs.registered("st0", 1, 0)(cs.EMPTY))  # type: ignore[arg-type]
    assert alone is not None and alone.shards[0].dirty == () and not alone.shards[0].mini
    # Finished: the ranges go, the size stays.
    shard = recorded[0]
    done = dataclasses.replace(shard, donors=tuple((n, DonorProgress(done=True))
                                                   for n, _ in shard.donors))
    finished = cs.rebuild_finished(shard.node_id, 1, 9)(state.with_shard(done))
    assert finished is not None
    after = finished.shard(shard.node_id)
    assert after is not None and after.dirty == () and after.mini
    assert (after.scope_logs, after.scope_ranges) == (DIRTY_RANGES_MAX, DIRTY_RANGES_MAX)
    assert cs.decode(cs.encode(finished)) == finished
    # A document written when a scope could hold 4096 ranges still decodes.
    old_scope = [[log_id, [[1, 1]]] for log_id in range(1, 4097)]
    assert cs.dirty_of(old_scope) is not None


@given(st.recursive(st.integers(min_value=-2, max_value=2**64) | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=4), max_leaves=20))
def test_hostile_dirty_ranges_never_raise(value: object) -> None:
    decoded = cs.dirty_of(value)
    if decoded is not None:
        assert cs.dirty_of([[log_id, [list(r) for r in ranges]]
                            for log_id, ranges in decoded]) == decoded


# ---- a damaged segment's index file gives the scope ---------------------------------------


def _flip(data_dir: str, needle: bytes) -> None:
    """Flip a byte of ``needle`` in the node's first segment (entries follow it)."""
    path = Path(segment_paths(data_dir)[0])
    data = bytearray(path.read_bytes())
    data[data.index(needle)] ^= 0x01
    path.write_bytes(bytes(data))


async def test_a_damaged_segment_is_ranged_by_its_index_file(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "n1")
    config = storage_config()
    async with running_node(data_dir, config) as node:
        stores = [make_store(lsn(1, esn), log_id=log_id) for log_id in (L1, L2)
                  for esn in range(1, 11)]
        assert all(r.status is Status.OK for r in await store_all(node, stores))
    async with running_node(data_dir, config):
        pass  # its start writes a checkpoint of the newest segment, all of it
    # The segment's index file covers every entry; damage one of L1's.
    _flip(data_dir, stores[2].payloads[0])
    async with running_node(data_dir, config) as node:
        authority = node.store.authority
        assert authority.damaged and authority.damage_found == 1
        assert authority.damage_scope() == ((1, ((lsn(1, 1), lsn(1, 10)),)),
                                            (2, ((lsn(1, 1), lsn(1, 10)),)))


async def test_a_segment_with_entries_past_its_index_file_is_unranged(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "n1")
    config = storage_config()
    async with running_node(data_dir, config) as node:
        stores = [make_store(lsn(1, esn)) for esn in range(1, 11)]
        assert all(r.status is Status.OK for r in await store_all(node, stores))
    segments = os.path.join(data_dir, "segments")
    for name in os.listdir(segments):
        if name.endswith(".idx"):
            os.unlink(os.path.join(segments, name))  # as if killed before any checkpoint
    _flip(data_dir, stores[2].payloads[0])
    async with running_node(data_dir, config) as node:
        assert node.store.authority.damaged
        assert node.store.authority.damage_scope() is None  # the whole shard


# ---- the driver records it ---------------------------------------------------------------


async def test_the_runtime_mini_rebuilds_a_reads_damage_and_escalates_an_unranged_one(
        tmp_path: Path) -> None:
    """``RebuildRuntime.poll_once`` on a real node: a read's damage is recorded as a
    mini-rebuild of its range (same generation); an unranged damage found while it runs
    begins it again for the next generation, of the whole shard."""
    store = MemoryClusterState()
    assert (await cs.change(store, cs.registered("n1", 1, 0)))[0] is Status.OK
    data_dir = str(tmp_path / "n1")
    async with running_node(data_dir, storage_config()) as node:
        runtime = one_node_rebuild_runtime(node, data_dir, store)
        try:
            assert node.store.authority.range_damaged(L3, 10, 20)
            await runtime.poll_once()
            shard = store.state.shard("n1")
            assert shard is not None and shard.status is ShardStatus.REBUILDING
            assert shard.dirty == ((3, ((10, 20),)),) and shard.generation == 1
            assert runtime.metrics()["rebuild_shard_mini_rebuilding"] == 1
            assert runtime.metrics()["rebuild_shard_dirty_ranges"] == 1
            assert node.store.authority.segments_damaged(frozenset({99}))  # unranged
            await runtime.poll_once()
            shard = store.state.shard("n1")
            assert shard is not None and shard.status is ShardStatus.REBUILDING
            assert (shard.generation, shard.dirty, shard.rebuilds_count) == (2, (), 2)
            assert runtime.metrics()["rebuild_shard_mini_rebuilding"] == 0
        finally:
            await runtime.close()


# ---- the rate limit ----------------------------------------------------------------------


def test_the_burst_is_bounded_to_a_fraction_of_a_second_of_the_rate() -> None:
    bucket = TokenBucket(40 * 1024, 1024 * 1024, 0)
    assert bucket.burst_bytes == 4096  # 100 ms of 40 KiB/s, not the 1 MiB configured
    assert bucket.chunk_bytes_max == 4096
    assert TokenBucket(32 * 2**20, 2**20, 0).burst_bytes == 2**20  # fast: as configured
    assert TokenBucket(0, 100, 0).delay_ms(0, 10**9) == 0  # unlimited


def test_a_small_shard_goes_out_at_the_rate_not_in_a_burst() -> None:
    """1 MB of 1 KB copies at 40 KiB/s through the donor core, with the driver's default
    512 KiB chunks and 1 MiB burst: before, the bucket started full and let the whole shard
    out in a fraction of a second; now at no point is more out than the rate allows plus
    a tenth of a second's worth (and one chunk, itself that small)."""
    rate = 40 * 1024
    records, size = 1000, 1000
    core = DonorCore(shard="st2", logs=[(1, records)], progress=DonorProgress(),
                     bucket=TokenBucket(rate, 1024 * 1024, 0), by_copyset=False,
                     checkpoint_interval_ms=1_000, now_ms=0, chunk_bytes_max=512 * 1024,
                     tails=False)
    now_ms = sent = 0
    worst_excess = 0.0
    while True:
        effect = core.next(now_ms)
        if isinstance(effect, ReadChunk):
            last = min(effect.until_lsn, effect.from_lsn + 2047)
            core.on_read([_piece(i, size) for i in range(effect.from_lsn, last + 1)],
                         last + 1, now_ms)
        elif isinstance(effect, SendChunk):
            sent += effect.bytes
            worst_excess = max(worst_excess, sent - rate * now_ms / 1000)
            core.on_sent(Status.OK, now_ms)
        elif isinstance(effect, Sleep):
            now_ms = effect.until_ms
        elif isinstance(effect, SaveCheckpoint):
            core.on_checkpointed(True, now_ms)
        else:
            assert isinstance(effect, Finished)
            break
    assert sent == records * size
    assert worst_excess <= 2 * rate * 0.1 + size  # the burst plus one chunk, no more
    assert now_ms >= 20_000  # ~24 s, not 0.2 s


def test_a_slow_donor_reads_and_sends_one_small_chunk_at_a_time() -> None:
    """The donor asks the store for at most one chunk's bytes at a time (``bytes_max``,
    which ``rebuild_reads.read_pieces`` stops at), and sends no more in one chunk."""
    core = DonorCore(shard="st2", logs=[(1, 100)], progress=DonorProgress(),
                     bucket=TokenBucket(40 * 1024, 1024 * 1024, 0), by_copyset=False,
                     checkpoint_interval_ms=1_000, now_ms=0, tails=False)
    read = core.next(0)
    assert isinstance(read, ReadChunk) and read.bytes_max == 4096
    # A read that stopped early resumes where it stopped.
    core.on_read([_piece(1, 3000), _piece(2, 3000)], 3, 0)
    send = core.next(0)
    assert isinstance(send, SendChunk) and send.records == 1  # the chunk's bytes
    core.on_sent(Status.OK, 0)
    again = core.next(500)
    assert isinstance(again, ReadChunk) and again.from_lsn == 2
