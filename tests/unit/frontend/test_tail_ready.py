"""``FrontEnd.tail_ready``: what HTTP's tail serves. A NOTREADY tail (a sequencer activating
or recovering) is asked again with backoff within ``TAIL_READY_WAIT_MS``, so a caller gets the
tail rather than a 503 to retry; past the bound the NOTREADY goes out; other answers go out at
once."""

from __future__ import annotations

import asyncio

import pytest

from frontend import service as service_module
from frontend.outcomes import TailOutcome
from frontend.service import FrontEnd
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId


class _Tails:
    """Stands in for a FrontEnd whose single-attempt ``tail`` answers from a script."""

    def __init__(self, answers: list[Status], *, settling: bool = True) -> None:
        self.answers = answers
        self.calls = 0
        self.settling = settling

    async def tail(self, log_id: LogId) -> TailOutcome:
        status = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if status is Status.OK:
            return TailOutcome(status=status, release_lsn=Lsn(7), trim_lsn=Lsn(0),
                               epoch=Epoch(1), sequencer_node=NodeId("seq1"))
        return TailOutcome(status=status, sequencer_node=NodeId("seq1"), message="not yet",
                           settling=self.settling)


async def _tail_ready(tails: _Tails) -> TailOutcome:
    return await FrontEnd.tail_ready(tails, LogId(1))  # type: ignore[arg-type]


async def test_a_recovering_sequencer_answers_once_ready() -> None:
    tails = _Tails([Status.NOTREADY, Status.NOTREADY, Status.OK])
    outcome = await _tail_ready(tails)
    assert (outcome.status, outcome.release_lsn, tails.calls) == (Status.OK, 7, 3)


async def test_notready_past_the_bound_goes_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "TAIL_READY_WAIT_MS", 150)
    tails = _Tails([Status.NOTREADY])
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    outcome = await _tail_ready(tails)
    took_s = loop.time() - started_s
    assert outcome.status is Status.NOTREADY
    assert 0.05 <= took_s <= 0.15 + 0.2, took_s
    assert 3 <= tails.calls <= 6  # backoff 10, 20, 40, 80 ms: not a busy loop


async def test_other_answers_go_out_at_once() -> None:
    for status in (Status.OK, Status.NOTFOUND, Status.ACCESS):
        tails = _Tails([status])
        outcome = await _tail_ready(tails)
        assert (outcome.status, tails.calls) == (status, 1)


async def test_too_few_storage_nodes_is_answered_at_once() -> None:
    """No wait helps until the storage nodes are back: NOTREADY goes out on the first try."""
    tails = _Tails([Status.NOTREADY, Status.OK], settling=False)
    outcome = await _tail_ready(tails)
    assert (outcome.status, tails.calls) == (Status.NOTREADY, 1)
