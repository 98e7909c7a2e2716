"""``FrontEnd.read`` after a log's nodeset grew (a storage node added, issue 17): the front end
cached the log's metadata before the growth; it reads the epochs that metadata covers from
their nodeset, and before it reads a later epoch it fetches the metadata again and reads that
epoch from its own, larger nodeset (an f-majority of the smaller one could miss both copies
of a record there)."""

from __future__ import annotations

import asyncio

from shared.epoch_metadata import EpochNodeset, LogMetadata
from shared.net.types import RequestCallback
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import Message
from shared.wire.read import Read, ReadReply
from tests.unit.frontend.test_read_long_poll import FIRST, STORAGE, _Cluster, _front_end, _Store

ST4 = NodeId("st4")


class _GrowingStore(_Store):
    grown = False
    metadata_reads = 0

    async def get_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        self.metadata_reads += 1
        if not self.grown:
            return await super().get_metadata(log_id)
        return Status.OK, LogMetadata(
            log_id=log_id, next_epoch=Epoch(3), nodeset=(*STORAGE, ST4), replication_factor=3,
            last_writer=None, version=2, nodeset_since=Epoch(2),
            earlier=(EpochNodeset(Epoch(1), STORAGE, 3),))


HELD = (*(compose_lsn(Epoch(1), Esn(i)) for i in (1, 2, 3)),
        *(compose_lsn(Epoch(2), Esn(i)) for i in (1, 2)))
"""Every record of the log (on every node: which nodes are asked is what is checked)."""


class _Recording(_Cluster):
    def _reply(self, read: Read) -> ReadReply:
        release = max(self.release, read.release_lsn)
        last = min(release, read.until_lsn)
        return ReadReply(status=Status.OK, log_id=read.log_id, release_lsn=release,
                         records=tuple((lsn, 1, None, b"r%d" % lsn) for lsn in HELD
                                       if read.from_lsn <= lsn <= last),
                         next_lsn=Lsn(max(read.from_lsn, last + 1)))

    def __init__(self) -> None:
        super().__init__(hold=False)
        self.asked_nodes: list[tuple[NodeId, int]] = []

    def request(self, node: NodeId, message: Message, callback: RequestCallback, *,
                timeout_ms: int | None = None) -> None:
        self.asked_nodes.append((node, getattr(message, "from_lsn", 0)))
        super().request(node, message, callback, timeout_ms=timeout_ms)


async def test_a_later_epoch_is_read_from_its_grown_nodeset() -> None:
    cluster, store = _Recording(), _GrowingStore()
    front, log_id = _front_end(cluster, store)
    cluster.release = compose_lsn(Epoch(1), Esn(3))
    first = await front.read(log_id, FIRST, 100, 1 << 20, 0)
    assert [r.lsn for r in first.records] == [FIRST, FIRST + 1, FIRST + 2]
    # The sequencer moved to epoch 2 on a nodeset with st4, and released two records there.
    store.grown = True
    cluster.release = compose_lsn(Epoch(2), Esn(2))
    reads_before = store.metadata_reads
    bridge = await front.read(log_id, first.next_lsn, 100, 1 << 20, 0)
    # Epoch 1 ends (its span ends where the cached metadata's epochs do): a BRIDGE, nothing
    # of epoch 2 read from the old nodeset.
    assert not bridge.records and [g.type for g in bridge.gaps] == ["BRIDGE"]
    assert bridge.next_lsn == compose_lsn(Epoch(2), Esn(1))
    assert not [n for n, lsn in cluster.asked_nodes if lsn >= compose_lsn(Epoch(2), Esn(1))]
    for _ in range(2):
        second = await front.read(log_id, bridge.next_lsn, 100, 1 << 20, 0)
        if second.records:
            break
        await asyncio.sleep(0.05)
    assert [r.lsn for r in second.records] == [compose_lsn(Epoch(2), Esn(1)),
                                               compose_lsn(Epoch(2), Esn(2))]
    assert store.metadata_reads > reads_before
    # Epoch 2 is read from st1-st4 (each round asks an f-majority in a random order): st4 is
    # among the nodes asked; from the cached nodeset it never would be.
    for _ in range(20):
        await front.read(log_id, bridge.next_lsn, 100, 1 << 20, 0)
    epoch2 = {n for n, lsn in cluster.asked_nodes if lsn >= compose_lsn(Epoch(2), Esn(1))}
    assert epoch2 == {*STORAGE, ST4}
