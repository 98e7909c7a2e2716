"""Rebuilding's plan (issue 17, STALE_STORED_SEEDS): a donor walks each log up to its
sequencer's tail, and only once that tail is released, so an append in flight when the disk
was lost, acknowledged counting a STORED from the old disk, has its copy on this donor inside
the walk; logs the donor does not hold but a sequencer has active are planned too. And the
rebuilt node's own step: damage found after its rebuild began makes it begin again."""

from __future__ import annotations

from shared.cluster_state import DonorProgress, ShardState, ShardStatus
from shared.status import Status
from shared.types import LogId
from storage_node.core.authority import AuthorityStatus
from storage_node.core.rebuild import (
    AskTails,
    DonorCore,
    Finished,
    ListLogs,
    Piece,
    ReadChunk,
    SaveCheckpoint,
    SendChunk,
    Sleep,
    Tail,
    TargetStep,
    TokenBucket,
    target_step,
)


def _core(logs: list[tuple[int, int]], progress: DonorProgress | None = None) -> DonorCore:
    return DonorCore(shard="st2", logs=logs, progress=progress or DonorProgress(),
                     bucket=TokenBucket(0, 100, 0), by_copyset=False,
                     checkpoint_interval_ms=1_000, now_ms=0)


def _piece(lsn: int) -> Piece:
    return Piece(lsn, lsn, ("st1", "st2"), b"x" * 10, 10)


def test_walks_only_after_the_sequencers_tail_is_released_and_up_to_it() -> None:
    core = _core([(1, 5)])
    assert core.planning
    ask = core.next(0)
    assert ask == AskTails((1,), everywhere=True)
    assert core.next(0) is None  # asking
    # The sequencer handed out up to 9; 7 released: appends 8-9 are in flight.
    core.on_tails({1: Tail(release_lsn=7, tail_lsn=9, held_lsn=5)}, 0)
    assert core.next(1) == Sleep(20)  # not released yet: asked again after a while
    assert core.next(20) == AskTails((1,), everywhere=False)
    # A later answer's higher tail is not waited for (else a busy log never starts).
    core.on_tails({1: Tail(release_lsn=9, tail_lsn=15, held_lsn=9)}, 20)
    assert core.next(20) == ListLogs()
    core.on_logs([(1, 12)], 20)
    assert not core.planning
    # Up to the tail (9), past what the donor held when it began (5).
    assert core.next(20) == ReadChunk(1, 1, 9)
    core.on_read([_piece(8), _piece(9)], 10, 20)
    send = core.next(20)
    assert isinstance(send, SendChunk) and send.records == 2
    core.on_sent(Status.OK, 20)
    assert isinstance(core.next(20), SaveCheckpoint)
    core.on_checkpointed(True, 20)
    assert isinstance(core.next(20), Finished)


def test_logs_active_elsewhere_and_logs_that_arrive_are_planned_too() -> None:
    """The donor holds no copy of log 3 yet, but its sequencer has appends in flight; and log
    5 reaches the donor while it plans."""
    core = _core([(1, 4)])
    assert core.next(0) == AskTails((1,), everywhere=True)
    core.on_tails({1: Tail(4, 4, 4), 3: Tail(release_lsn=0, tail_lsn=2, held_lsn=0)}, 0)
    assert core.next(20) == AskTails((3,), everywhere=False)
    core.on_tails({3: Tail(2, 2, 2)}, 20)
    assert core.next(20) == ListLogs()
    core.on_logs([(1, 4), (3, 2), (5, 1)], 20)
    assert core.planning
    assert core.next(20) == AskTails((5,), everywhere=False)
    core.on_tails({5: Tail(0, 0, 1)}, 20)  # nothing in flight: decided
    assert core.next(20) == ListLogs()
    core.on_logs([(1, 4), (3, 2), (5, 1)], 20)
    walked = []
    while True:
        effect = core.next(20)
        if isinstance(effect, ReadChunk):
            walked.append((effect.log_id, effect.until_lsn))
            core.on_read([], effect.until_lsn + 1, 20)
        elif isinstance(effect, SaveCheckpoint):
            core.on_checkpointed(True, 20)
        else:
            assert isinstance(effect, Finished)
            break
    assert walked == [(1, 4), (3, 2), (5, 1)]


def test_until_every_sequencer_node_answered_nothing_is_walked() -> None:
    core = _core([(1, 4)])
    assert core.next(0) == AskTails((1,), everywhere=True)
    core.on_tails(None, 0)  # a sequencer node did not answer
    assert core.next(0) == Sleep(20)
    assert core.next(20) == AskTails((1,), everywhere=True)
    core.on_tails(None, 20)
    assert core.next(20) == Sleep(60)  # backing off
    assert core.next(60) == AskTails((1,), everywhere=True)


def test_a_resumed_walk_plans_only_the_logs_it_has_left() -> None:
    core = _core([(1, 9), (2, 9), (3, 9)], DonorProgress(log_id=2, next_lsn=5))
    assert core.next(0) == AskTails((2, 3), everywhere=True)
    core.on_tails({1: Tail(0, 0, 9), 2: Tail(9, 9, 9), 3: Tail(9, 9, 9)}, 0)
    assert core.next(0) == ListLogs()
    core.on_logs([(1, 9), (2, 9), (3, 9)], 0)
    assert core.next(0) == ReadChunk(2, 5, 9)


def _shard(status: ShardStatus, generation: int, done: bool) -> ShardState:
    return ShardState("st2", generation, status, rebuild_generation=generation,
                      donors=(("st1", DonorProgress(done=done)),))


def test_damage_found_while_rebuilt_begins_the_rebuild_again() -> None:
    rebuilding = _shard(ShardStatus.REBUILDING, 2, done=True)
    assert target_step(rebuilding, 2, 0, 0) is TargetStep.FINISH
    assert target_step(rebuilding, 2, 1, 0) is TargetStep.RESTART
    assert target_step(rebuilding, 2, 1, 1) is TargetStep.FINISH  # covered by this rebuild
    assert target_step(_shard(ShardStatus.REBUILDING, 2, False), 2, 0, 0) is TargetStep.NOTHING
    assert target_step(rebuilding, 3, 5, 0) is TargetStep.NOTHING  # not this disk's rebuild
    assert target_step(_shard(ShardStatus.AUTHORITATIVE, 2, True), 2, 1, 0) is (
        TargetStep.NOTHING)
    assert target_step(None, 2, 1, 0) is TargetStep.NOTHING


def test_damage_counters_are_durable() -> None:
    status = AuthorityStatus()
    assert status.range_damaged(LogId(1), 10, 20)
    assert not status.range_damaged(LogId(1), 10, 20)  # known already: not counted again
    assert status.segments_damaged(frozenset({3}))
    assert status.damage_found == 2 and status.damage_covered == 0
    status.rebuild_covers(1)
    restored = AuthorityStatus()
    assert restored.restore(status.snapshot())
    assert (restored.damage_found, restored.damage_covered) == (2, 1)
    old = status.snapshot()
    del old["damage_found"], old["damage_covered"]  # a file written before the counters
    older = AuthorityStatus()
    assert older.restore(old) and (older.damage_found, older.damage_covered) == (0, 0)
    bad = dict(status.snapshot(), damage_found="2")
    assert not AuthorityStatus().restore(bad)
    lost = AuthorityStatus()
    lost.rebuild_covers(4)
    lost.status_lost()  # the file is unreadable: counted, whatever was covered before
    assert lost.damage_found > lost.damage_covered and lost.damaged
