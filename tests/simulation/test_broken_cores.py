"""The checkers have teeth: each test breaks a core on purpose (monkeypatched, undone after
the test) and asserts that the randomized simulation catches it with the right checker.

If one of these fails, a checker went blind: the seeds in test_seeds.py prove nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sequencer.core.appender import Appender, AppenderResult
from sequencer.core.effects import AppendReply
from sequencer.core.sequencer import Sequencer
from sequencer.core.sliding_window import SlidingWindow
from shared.epoch_metadata import LastCleanEpoch
from shared.status import Status
from shared.types import Epoch, Esn
from storage_node.core.authority import AuthorityStatus
from tests.simulation.runner import SimulationFailure, run_simulation
from tests.simulation.sim_cluster import SimCluster

SEEDS_MAX = 40
"""Seeds tried per broken variant; each variant is caught within the first few."""
TAIL_SEED = 200
"""A seed whose owner sequencer crashes after its last RELEASEs were lost."""
DAMAGE_SEED = 32
"""A seed with a damaged restart of a node that held acknowledged copies."""


def first_failure(seeds: range = range(1, SEEDS_MAX + 1)) -> SimulationFailure:
    """The first failure among ``seeds`` that is not a liveness failure (a broken core may
    also hang, which is not what these tests look for)."""
    for seed in seeds:
        try:
            run_simulation(seed)
        except SimulationFailure as failure:
            if failure.checker not in ("L1", "L2"):
                print(f"broken core caught:\n{failure}")
                return failure
    raise AssertionError(f"no checker fired in {len(seeds)} seeds: the checkers are blind")


def assert_caught_by(checker: str, text: str) -> None:
    failure = first_failure()
    assert failure.checker == checker, str(failure)
    assert text in str(failure)
    assert f"reproduce with: python -m tests.simulation.run --seed {failure.seed}" in str(
        failure)


def test_ack_after_one_copy_is_caught_by_c2(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Appender.on_reply

    def on_reply(self: Appender, node: Any, wave: int, status: Status, *args: Any) -> Any:
        result, resend = original(self, node, wave, status, *args)
        if status is Status.OK and result is AppenderResult.PENDING and wave == self.wave:
            return AppenderResult.DONE, False  # "one STORED OK is enough"
        return result, resend

    monkeypatch.setattr(Appender, "on_reply", on_reply)
    assert_caught_by("C2", "< R=")


def test_release_before_replication_is_caught_by_c3(monkeypatch: pytest.MonkeyPatch) -> None:
    original: Callable[..., list[Any]] = Sequencer._start_append

    def start_append(self: Sequencer, *args: Any) -> list[Any]:
        effects = original(self, *args)
        if self.releasable and self.appenders:
            newest = max(self.appenders.values(), key=lambda a: a.lsn)
            self._advance_release(newest.last_lsn, effects)  # release at creation, not reap
        return effects

    monkeypatch.setattr(Sequencer, "_start_append", start_append)
    assert_caught_by("C3", "released log")


def test_release_over_unclean_epoch_is_caught_by_c3(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Sequencer.on_activated

    def on_activated(self: Sequencer, status: Status, epoch: Epoch, metadata: Any,
                     lce: LastCleanEpoch | None, now_ms: int) -> list[Any]:
        if lce is not None:  # "the previous epoch is always clean"
            lce = LastCleanEpoch(log_id=lce.log_id, epoch=Epoch(max(lce.epoch, epoch - 1)),
                                 tail_lsn=lce.tail_lsn, version=lce.version)
        return original(self, status, epoch, metadata, lce, now_ms)

    monkeypatch.setattr(Sequencer, "on_activated", on_activated)
    assert_caught_by("C3", "are unclean")


def test_esn_handed_out_twice_is_caught_by_c1(monkeypatch: pytest.MonkeyPatch) -> None:
    original = SlidingWindow.grow

    def grow(self: SlidingWindow, esn_count: int) -> Esn | None:
        first = original(self, esn_count)
        if first == 3 and esn_count == 1:
            self._next_esn = first  # ESN 3 goes to the next append too
        return first

    monkeypatch.setattr(SlidingWindow, "grow", grow)
    assert_caught_by("C1", "sent with payload")


def test_nothing_written_answer_for_a_stored_append_is_caught_by_c4(
        monkeypatch: pytest.MonkeyPatch) -> None:
    original: Callable[..., list[Any]] = Sequencer._complete

    def complete(self: Sequencer, appender: Appender, now_ms: int) -> list[Any]:
        return [AppendReply(e.request_id, Status.SEQNOBUFS)
                if type(e) is AppendReply and e.request_id % 5 == 0 else e
                for e in original(self, appender, now_ms)]

    monkeypatch.setattr(Sequencer, "_complete", complete)
    assert_caught_by("C4", "nothing written")


def test_tail_answered_from_storage_while_recovering_is_caught_by_t1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # FrontEnd.tail as issue 16 item 4 found it: while the owner recovers, the storage nodes'
    # release pointers, which the dead owner's last RELEASEs may not have reached.
    monkeypatch.setattr(SimCluster, "tail_from_storage_while_recovering", True)
    with pytest.raises(SimulationFailure) as caught:
        run_simulation(TAIL_SEED)
    assert caught.value.checker == "T1", str(caught.value)
    assert "tail as" in str(caught.value)


def test_damaged_node_answering_as_complete_is_caught_by_r2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 16 item 3 as it was: a node that lost the end of its segment answers as if
    # complete, so a reader whose f-majority includes it reads DATALOSS at an acknowledged
    # record (the restart's scan no longer marks the node non-authoritative here).
    monkeypatch.setattr(AuthorityStatus, "segments_damaged", lambda self, ids, scope=None: None)
    with pytest.raises(SimulationFailure) as caught:
        run_simulation(DAMAGE_SEED)
    assert caught.value.checker == "R2", str(caught.value)
    assert "reads as DATALOSS" in str(caught.value)
