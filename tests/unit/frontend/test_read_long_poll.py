"""``FrontEnd.read`` on a node that does not sequence the log: one look at the owner's release
pointer per request, then long-poll rounds the storage nodes hold (no polling loop, no
sequencer hop per round); a pause instead of a spin when the storage nodes answer at once;
the release pointer it reports never goes backwards."""

from __future__ import annotations

import asyncio
from typing import cast

from frontend.service import FrontEnd
from shared.config import ClusterConfig, NodeConfig, ProcessConfig
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.net.pool import PeerPool
from shared.net.types import RequestCallback
from shared.ports import EpochStore
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.append import GetSequencerState, SequencerState
from shared.wire.codec import Message
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.trim import Trim, Trimmed

STORAGE = (NodeId("st1"), NodeId("st2"), NodeId("st3"))
ME = NodeId("seq2")
DEADLINE_S = 5.0


def _node(node_id: str, role: str, port: int) -> NodeConfig:
    return NodeConfig(node_id=NodeId(node_id), roles=(role,),  # type: ignore[arg-type]
                      http_port=port, data_port=port + 1)


CLUSTER = ClusterConfig(cluster_name="c", replication_factor=3, nodes=(
    _node("seq1", "sequencer", 9000), _node("seq2", "sequencer", 9002),
    _node("seq3", "sequencer", 9020),
    *(_node(n, "storage", 9004 + 2 * i) for i, n in enumerate(STORAGE))))


class _Store:
    lce = (Epoch(0), Lsn(0))
    """(last clean epoch, its tail)."""
    last_writer: NodeId | None = None

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        return Status.OK, LogMetadata(log_id=log_id, next_epoch=Epoch(2), nodeset=STORAGE,
                                      replication_factor=3, last_writer=self.last_writer,
                                      version=1)

    async def get_last_clean_epoch(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        return Status.OK, LastCleanEpoch(log_id=log_id, epoch=self.lce[0],
                                         tail_lsn=self.lce[1], version=1)


class _Cluster:
    """The owner sequencer and three storage nodes, as the front end's pool sees them.
    ``hold``: storage nodes hold long-poll READs until the release passes ``from_lsn``."""

    cluster_fingerprint = "fp"

    def __init__(self, *, hold: bool = True) -> None:
        self.hold = hold
        self.release = Lsn(0)
        self.sequencer_state_calls = 0
        self.activations: list[tuple[NodeId, LogId]] = []
        """GetSequencerState(activate=True) sent: (node, log)."""
        self.reads: list[Read] = []
        self.asked = asyncio.Event()
        self._held: list[tuple[Read, RequestCallback]] = []

    def send(self, node: NodeId, message: Message) -> bool:
        assert type(message) is GetSequencerState and message.activate
        self.activations.append((node, message.log_id))
        return True

    async def call(self, node: NodeId, message: Message, timeout_ms: int) -> Message | Status:
        assert type(message) is GetSequencerState and node != ME
        self.sequencer_state_calls += 1
        return SequencerState(status=Status.OK, log_id=message.log_id,
                              release_lsn=self.release, epoch=Epoch(1))

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None:
        assert type(message) is Read
        self.reads.append(message)
        self.asked.set()
        if self.hold and message.wait_ms > 0 and max(self.release, message.release_lsn) < (
                message.from_lsn):
            self._held.append((message, callback))
        else:
            asyncio.get_running_loop().call_soon(callback, self._reply(message))

    def _reply(self, read: Read) -> ReadReply:
        release = max(self.release, read.release_lsn)
        last = min(release, read.until_lsn)
        records = tuple((lsn, 1, None, b"r%d" % lsn) for lsn in range(read.from_lsn, last + 1)
                        if lsn >= compose_lsn(Epoch(1), Esn(1)))
        return ReadReply(status=Status.OK, log_id=read.log_id, release_lsn=release,
                         records=records, next_lsn=Lsn(max(read.from_lsn, last + 1)))

    def release_to(self, lsn: Lsn, *, nodes_told: int = 3) -> None:
        """The sequencer released through ``lsn``; the held READs of (some) nodes wake."""
        self.release = lsn
        held, self._held = self._held, []
        for read, callback in held[:nodes_told]:
            asyncio.get_running_loop().call_soon(callback, self._reply(read))
        self._held.extend(held[nodes_told:])


def _front_end(cluster: _Cluster, store: _Store | None = None) -> tuple[FrontEnd, LogId]:
    config = ProcessConfig(node_id=ME, cluster=CLUSTER, data_dir="/nonexistent")
    front = FrontEnd(config=config, pool=cast(PeerPool, cluster), sequencer=None,
                     epoch_store=cast(EpochStore, store or _Store()))
    log_id = next(LogId(i) for i in range(1, 1000) if front.owner(LogId(i)) == "seq1")
    return front, log_id


FIRST = compose_lsn(Epoch(1), Esn(1))


async def test_a_long_poll_is_held_by_the_storage_nodes_and_ends_on_the_release() -> None:
    cluster = _Cluster()
    front, log_id = _front_end(cluster)
    cluster.release = FIRST
    loop = asyncio.get_running_loop()
    read = loop.create_task(front.read(log_id, Lsn(FIRST + 1), 100, 1 << 20, 10_000))
    async with asyncio.timeout(DEADLINE_S):
        while len(cluster.reads) < 3:
            cluster.asked.clear()
            await cluster.asked.wait()
        # Held a while: nothing more is asked (a poll loop would ask every 20 ms).
        await asyncio.sleep(0.2)
        assert not read.done()
        assert (cluster.sequencer_state_calls, len(cluster.reads)) == (1, 3)
        assert all(r.wait_ms > 9_000 and r.release_lsn == FIRST for r in cluster.reads)
        # Only the copyset of the new record is told at first: the round ends at once and
        # the next one carries the newer pointer to every node.
        cluster.release_to(Lsn(FIRST + 1), nodes_told=1)
        outcome = await read
    assert outcome.status is Status.OK
    assert [r.lsn for r in outcome.records] == [FIRST + 1]
    assert outcome.release_lsn == FIRST + 1
    assert cluster.sequencer_state_calls == 1


async def test_storage_nodes_that_answer_at_once_are_not_asked_in_a_spin() -> None:
    cluster = _Cluster(hold=False)
    front, log_id = _front_end(cluster)
    async with asyncio.timeout(DEADLINE_S):
        outcome = await front.read(log_id, FIRST, 100, 1 << 20, 300)
    assert (outcome.status, outcome.records) == (Status.OK, [])
    # Rounds of three READs, about one per pause (20 ms) over 300 ms: not thousands.
    assert len(cluster.reads) <= 3 * (300 // 20 + 2)
    assert cluster.sequencer_state_calls == 1


async def test_a_read_right_after_an_append_sees_the_owners_release() -> None:
    cluster = _Cluster()
    front, log_id = _front_end(cluster)
    cluster.release = Lsn(FIRST + 2)
    outcome = await front.read(log_id, FIRST, 100, 1 << 20, 0)
    assert [r.lsn for r in outcome.records] == [FIRST, FIRST + 1, FIRST + 2]
    # Later, a pointer from an unreachable owner is lower: what the node reports is not.
    cluster.release = Lsn(0)
    outcome = await front.read(log_id, Lsn(FIRST + 3), 100, 1 << 20, 0)
    assert outcome.release_lsn == FIRST + 2



async def test_nodesets_carry_the_owner_release_pointer() -> None:
    # A direct reader starts from it: a record acknowledged before it asked is read even from
    # storage nodes whose RELEASE has not arrived yet (the sequencer answers first).
    cluster = _Cluster()
    front, log_id = _front_end(cluster)
    cluster.release = Lsn(FIRST + 4)
    outcome = await front.nodesets(log_id)
    assert outcome.status is Status.OK and outcome.release_lsn == FIRST + 4
    assert cluster.sequencer_state_calls == 1
    # Never backwards, even when the owner cannot be asked.
    cluster.release = Lsn(0)
    assert (await front.nodesets(log_id)).release_lsn == FIRST + 4


class _StaleOwnerCluster(_Cluster):
    """The node it takes for the owner does not sequence the log (views disagree); the
    storage nodes know the release pointer and take trims."""

    async def call(self, node: NodeId, message: Message, timeout_ms: int) -> Message | Status:
        if type(message) is GetLogState:
            return LogState(status=Status.OK, log_id=message.log_id, release_lsn=self.release,
                            sealed_epoch=Epoch(0), last_lsn=self.release)
        assert type(message) is GetSequencerState
        return SequencerState(status=Status.NOSEQUENCER, log_id=message.log_id,
                              release_lsn=Lsn(0), epoch=Epoch(0))

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None:
        assert type(message) is Trim
        asyncio.get_running_loop().call_soon(callback, Trimmed(
            status=Status.OK, log_id=message.log_id, trim_lsn=message.trim_lsn))


async def test_trim_below_the_release_succeeds_when_the_owner_view_is_stale() -> None:
    cluster = _StaleOwnerCluster()
    front, log_id = _front_end(cluster)
    cluster.release = Lsn(FIRST + 9)
    outcome = await front.trim(log_id, Lsn(FIRST + 5))
    assert outcome.status is Status.OK and outcome.lsn == FIRST + 5
    # Beyond what any storage node reports released stays refused.
    assert (await front.trim(log_id, Lsn(FIRST + 10))).status is Status.INVALID_PARAM


class _TailCluster(_Cluster):
    """The owner's sequencer state and the storage nodes' pointers, for ``FrontEnd.tail``:
    ``stored`` per storage node (None: it does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.sequencer: SequencerState | None = None
        self.stored: dict[NodeId, Lsn | None] = dict.fromkeys(STORAGE)
        self.sealed: dict[NodeId, Epoch] = {}
        self.sequencers: dict[NodeId, SequencerState] = {}
        """Per node, where it differs from ``sequencer``."""

    async def call(self, node: NodeId, message: Message, timeout_ms: int) -> Message | Status:
        if type(message) is GetLogState:
            release = self.stored[node]
            if release is None:
                return Status.TIMEDOUT
            return LogState(status=Status.OK, log_id=message.log_id, release_lsn=release,
                            sealed_epoch=self.sealed.get(node, Epoch(0)), last_lsn=release)
        assert type(message) is GetSequencerState
        if node in self.sequencers:
            return self.sequencers[node]
        return self.sequencer or Status.TIMEDOUT


def _sequencer(log_id: LogId, epoch: int, release: int) -> SequencerState:
    return SequencerState(status=Status.OK, log_id=log_id, release_lsn=Lsn(release),
                          epoch=Epoch(epoch))


async def test_tail_is_a_confirmed_sequencers_pointer_or_not_given() -> None:
    # Issue 16 item 4: after a full restart the new sequencer (epoch 3) recovers with a release
    # pointer of 0; the tail used to answer 0 after having answered e2n5.
    cluster, store = _TailCluster(), _Store()
    front, log_id = _front_end(cluster, store)
    e2n5, e3n2 = compose_lsn(Epoch(2), Esn(5)), compose_lsn(Epoch(3), Esn(2))
    cluster.sequencer = _sequencer(log_id, 3, 0)
    store.lce = (Epoch(1), compose_lsn(Epoch(1), Esn(9)))
    # Recovering: the storage nodes' durable pointers do not vouch for the tail either (one
    # the old sequencer reported just before it died may be durable on none of them).
    cluster.stored = dict.fromkeys(STORAGE, e2n5)
    assert (await front.tail(log_id)).status is Status.NOTREADY
    # Releasing in its epoch, and R (3) nodes asked after it answered report no newer seal.
    cluster.sequencer = _sequencer(log_id, 3, e3n2)
    cluster.sealed = dict.fromkeys(STORAGE, Epoch(2))  # its own recovery's seal
    outcome = await front.tail(log_id)
    assert (outcome.status, outcome.release_lsn, outcome.epoch) == (Status.OK, e3n2, 3)
    # Fewer than R answers cannot show that no newer epoch sealed (and released) already.
    cluster.stored = {STORAGE[0]: e2n5, STORAGE[1]: None, STORAGE[2]: None}
    assert (await front.tail(log_id)).status is Status.NOTREADY
    # A node sealed by a newer epoch: this sequencer is a zombie, its pointer may be stale.
    cluster.stored = dict.fromkeys(STORAGE, e2n5)
    cluster.sealed[STORAGE[1]] = Epoch(3)
    outcome = await front.tail(log_id)
    assert outcome.status is Status.NOTREADY and "sealed by a newer epoch" in outcome.message
    assert cluster.activations == []  # a sequencer answered: nothing to activate


async def test_tail_takes_the_last_clean_epochs_tail_and_a_clean_successors_pointer() -> None:
    cluster, store = _TailCluster(), _Store()
    front, log_id = _front_end(cluster, store)
    e1n9 = compose_lsn(Epoch(1), Esn(9))
    # Epoch 1, the latest (next_epoch 2), was drained and marked clean; the storage nodes
    # missed the final RELEASE. No sequencer is active: nothing can be released past it.
    store.lce = (Epoch(1), e1n9)
    cluster.stored = dict.fromkeys(STORAGE, compose_lsn(Epoch(1), Esn(7)))
    outcome = await front.tail(log_id)
    assert (outcome.status, outcome.release_lsn) == (Status.OK, e1n9)
    assert cluster.activations == []
    # A sequencer of epoch 2 releases at once (epoch 1 is clean), from epoch 1's tail on.
    cluster.sequencer = _sequencer(log_id, 2, e1n9)
    outcome = await front.tail(log_id)
    assert (outcome.status, outcome.release_lsn) == (Status.OK, e1n9)


async def test_tail_never_takes_a_pointer_read_while_the_sequencer_recovered() -> None:
    # Simulation seed 215: the tail asks the sequencer of epoch 3 while it still recovers (its
    # pointer e1n1, from before), then reads the last clean epoch, which its recovery has just
    # moved to 2 (tail e2n5). The old pointer is no release of a recovered sequencer (that is
    # at least e2n5): it must not vouch, or the tail can fall below one reported before.
    cluster, store = _TailCluster(), _Store()
    front, log_id = _front_end(cluster, store)
    e1n1, e2n5 = compose_lsn(Epoch(1), Esn(1)), compose_lsn(Epoch(2), Esn(5))
    cluster.sequencer = _sequencer(log_id, 3, e1n1)
    cluster.sealed = dict.fromkeys(STORAGE, Epoch(2))
    cluster.stored = dict.fromkeys(STORAGE, e1n1)
    store.lce = (Epoch(2), e2n5)
    assert (await front.tail(log_id)).status is Status.NOTREADY
    # Recovered: its pointer is the recovered tail (nothing of its own released yet).
    cluster.sequencer = _sequencer(log_id, 3, e2n5)
    outcome = await front.tail(log_id)
    assert (outcome.status, outcome.release_lsn, outcome.epoch) == (Status.OK, e2n5, 3)


async def test_tail_of_an_unclean_inactive_log_activates_its_sequencer() -> None:
    # The sequencer of epoch 1 died: only recovery can tell what it released. The tail says
    # NOTREADY and has the owner activate the log, as an append would.
    cluster, store = _TailCluster(), _Store()
    front, log_id = _front_end(cluster, store)
    cluster.stored = dict.fromkeys(STORAGE, compose_lsn(Epoch(1), Esn(7)))
    outcome = await front.tail(log_id)
    assert outcome.status is Status.NOTREADY
    assert cluster.activations == [(NodeId("seq1"), log_id)]


async def test_tail_asks_the_latest_epochs_writer_when_the_owner_does_not_run_the_log() -> None:
    # Views disagree after a restart: this node takes seq1 for the owner, but seq3 took the
    # latest epoch and runs the log. The tail is seq3's, and nothing is activated (an
    # activation at seq1 would take the log from seq3 for nothing).
    cluster, store = _TailCluster(), _Store()
    front, log_id = _front_end(cluster, store)
    e1n9 = compose_lsn(Epoch(1), Esn(9))
    store.last_writer = NodeId("seq3")
    cluster.sequencers = {NodeId("seq1"): SequencerState(
        status=Status.NOSEQUENCER, log_id=log_id, release_lsn=Lsn(0), epoch=Epoch(0)),
        NodeId("seq3"): _sequencer(log_id, 1, e1n9)}
    cluster.stored = dict.fromkeys(STORAGE, compose_lsn(Epoch(1), Esn(7)))
    outcome = await front.tail(log_id)
    assert (outcome.status, outcome.release_lsn, outcome.epoch) == (Status.OK, e1n9, 1)
    assert cluster.activations == []
