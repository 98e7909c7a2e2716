"""What a rebuilding donor asks the sequencers (issue 17, ``storage_node.core.rebuild``):
``FrontEnd.active_tails`` (every log active on any sequencer node; None until each live one
answered) and ``FrontEnd.inflight_tail`` (one log's tail, or that nothing can be in flight),
and the GET_SEQUENCER_STATE extensions they travel in."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from frontend.service import FrontEnd
from shared.config import ClusterConfig, NodeConfig, ProcessConfig
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.net.pool import PeerPool
from shared.ports import EpochStore
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.append import GetSequencerState, SequencerState
from shared.wire.codec import decode, encode
from shared.wire.framing import FrameDecoder

S1, S2, ST = NodeId("s1"), NodeId("s2"), NodeId("st1")


class _Pool:
    cluster_fingerprint = "f"

    def __init__(self, answers: dict[NodeId, Any]) -> None:
        self.answers = answers
        self.sent: list[tuple[NodeId, Any]] = []

    async def call(self, node: NodeId, message: Any, timeout_ms: int) -> Any:
        answer = self.answers.get(node, Status.CONNFAILED)
        return answer(message) if callable(answer) else answer

    def send(self, node: NodeId, message: Any) -> bool:
        self.sent.append((node, message))
        return True


class _Sequencer:
    def __init__(self, active: dict[int, tuple[int, int]]) -> None:
        self.active = active

    def is_active(self, log_id: LogId) -> bool:
        return log_id in self.active

    def release_lsn(self, log_id: LogId) -> Lsn:
        return Lsn(self.active.get(log_id, (0, 0))[0])

    def inflight_tail(self, log_id: LogId) -> Lsn:
        return Lsn(self.active.get(log_id, (0, 0))[1])

    def epoch(self, log_id: LogId) -> Epoch:
        return Epoch(1)

    def active_tails(self) -> list[tuple[LogId, Lsn, Lsn]]:
        return [(LogId(k), Lsn(r), Lsn(t)) for k, (r, t) in self.active.items()]

    def request_activation(self, log_id: LogId) -> None:
        pass


class _Store:
    def __init__(self, next_epoch: int = 3, clean: int = 2, writer: NodeId = S1) -> None:
        self.next_epoch, self.clean, self.writer = next_epoch, clean, writer

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        if log_id == 99:
            return Status.NOTFOUND, None
        return Status.OK, LogMetadata(log_id=log_id, next_epoch=Epoch(self.next_epoch),
                                      nodeset=(ST,), replication_factor=1,
                                      last_writer=self.writer, version=1)

    async def get_last_clean_epoch(self, log_id: LogId
                                   ) -> tuple[Status, LastCleanEpoch | None]:
        return Status.OK, LastCleanEpoch(log_id=log_id, epoch=Epoch(self.clean),
                                         tail_lsn=Lsn(0), version=1)


class _View:
    def __init__(self, view: dict[NodeId, str]) -> None:
        self._view = view

    def view(self) -> dict[NodeId, str]:
        return self._view

    def subscribe(self, listener: Any) -> None:
        pass


def _front(me: NodeId, pool: _Pool, sequencer: _Sequencer | None = None,
           store: _Store | None = None, view: dict[NodeId, str] | None = None) -> FrontEnd:
    nodes = (NodeConfig(node_id=S1, roles=("sequencer",)),
             NodeConfig(node_id=S2, roles=("sequencer",)),
             NodeConfig(node_id=ST, roles=("storage",)))
    front = FrontEnd(config=ProcessConfig(node_id=me, cluster=ClusterConfig(
                         nodes=nodes, replication_factor=1),
                                          data_dir="/nonexistent"),
                     pool=cast(PeerPool, pool), sequencer=cast(Any, sequencer),
                     epoch_store=cast(EpochStore, store or _Store()),
                     gossip=cast(Any, _View(view or {})))
    front.owner = lambda log_id: S1  # type: ignore[method-assign]
    return front


def _state(tails: Any, status: Status = Status.OK) -> SequencerState:
    return SequencerState(status=status, log_id=LogId(1), release_lsn=Lsn(0), epoch=Epoch(1),
                          tails=tails)


async def test_active_tails_of_every_sequencer_node() -> None:
    remote = _front(S1, _Pool({}), _Sequencer({7: (10, 12)}))
    answer = remote.sequencer_state(LogId(1), all_logs=True)
    assert answer.tails == ((7, 10, 12),)
    # Through the codec (the extension travels; an old frame decodes to no tails).
    assert decode(FrameDecoder().feed(encode(answer, 3))[0]) == (3, answer)
    asked = GetSequencerState(log_id=LogId(1), all_logs=True)
    assert decode(FrameDecoder().feed(encode(asked, 4))[0]) == (4, asked)
    plain = remote.sequencer_state(LogId(7))
    assert plain.tails == () and plain.tail_lsn == 12
    front = _front(S2, _Pool({S1: lambda m: remote.sequencer_state(
        m.log_id, all_logs=m.all_logs)}), _Sequencer({8: (3, 5)}))
    found = await front.active_tails()
    assert found == {LogId(7): (Lsn(10), Lsn(12)), LogId(8): (Lsn(3), Lsn(5))}


async def test_active_tails_waits_for_every_live_sequencer_node() -> None:
    front = _front(ST, _Pool({S1: _state(((7, 1, 2),))}))  # s2 does not answer
    assert await front.active_tails() is None
    dead = _front(ST, _Pool({S1: _state(((7, 1, 2),))}), view={S2: "DEAD"})
    assert await dead.active_tails() == {LogId(7): (Lsn(1), Lsn(2))}
    for bad in (((7, 1),), ((7, "1", 2),), ([7, 1, 2],), (None,)):
        malformed = _front(ST, _Pool({S1: _state(bad), S2: _state(())}))
        assert await malformed.active_tails() is None, bad


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.integers(-2, 2**64) | st.text(max_size=3),
                    lambda inner: st.tuples(inner, inner, inner) | st.lists(inner, max_size=3)
                    .map(tuple), max_leaves=12))
def test_active_tails_takes_any_answer(tails: Any) -> None:
    import asyncio
    front = _front(ST, _Pool({S1: _state(tails if isinstance(tails, tuple) else (tails,)),
                              S2: _state(())}))
    found = asyncio.run(front.active_tails())
    assert found is None or all(t >= r >= 0 for r, t in found.values())


async def test_inflight_tail_of_one_log() -> None:
    seq1 = _front(S1, _Pool({}), _Sequencer({1: (10, 14)}))
    asked = _front(ST, _Pool({S1: lambda m: seq1.sequencer_state(m.log_id)}))
    assert await asked.inflight_tail(LogId(1)) == (Lsn(10), Lsn(14))
    # Nobody active, the latest epoch (2) clean: nothing in flight.
    idle = _front(ST, _Pool({S1: _state((), Status.NOSEQUENCER)}))
    assert await idle.inflight_tail(LogId(1)) == (Lsn(0), Lsn(0))
    assert await idle.inflight_tail(LogId(99)) == (Lsn(0), Lsn(0))  # no such log
    # Nobody active, the latest epoch not clean: not known yet; the owner is asked to activate.
    pool = _Pool({S1: _state((), Status.NOSEQUENCER)})
    unclean = _front(ST, pool, store=_Store(next_epoch=4, clean=2))
    assert await unclean.inflight_tail(LogId(1)) is None
    assert pool.sent == [(S1, GetSequencerState(log_id=LogId(1), activate=True))]
