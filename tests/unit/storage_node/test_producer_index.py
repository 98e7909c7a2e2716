"""A storage node's producer index on a real record store: STOREs carry producer tags, the
node answers GET_PRODUCER with them, digests carry them (so recovery keeps them on the copies
it writes), and a restart rebuilds the same answer from the segment files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shared.status import Status
from shared.types import Epoch, Esn, LogId
from shared.wire.producer import GetProducer, ProducerState
from shared.wire.recovery import Digest, GetDigest
from shared.wire.store import Store
from storage_node.producer_index import ProducerIndex
from tests.unit.storage_node.helpers import LOG, lsn, make_store, request, running_node, store


async def producer_state(node: object, producer_id: str, log_id: LogId = LOG) -> ProducerState:
    answer = await request(node, GetProducer(  # type: ignore[arg-type]
        log_id=log_id, producer_id=producer_id))
    assert isinstance(answer, ProducerState)
    return answer


def tagged(first: int, payloads: tuple[bytes, ...], *tags: tuple[str, int, int, int]) -> Store:
    return dataclasses.replace(make_store(lsn(1, first), payloads), producers=tags)


async def test_tags_are_indexed_served_and_rebuilt_after_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    # One STORE of a grouped appender: p1's batch (2 records) and p2's single record.
    grouped = tagged(1, (b"a", b"b", b"c"), ("p1", 5, lsn(1, 1), lsn(1, 2)),
                     ("p2", 9, lsn(1, 3), lsn(1, 3)))
    async with running_node(data_dir) as node:
        assert (await store(node, grouped)).status is Status.OK
        assert (await store(node, tagged(4, (b"d",), ("p1", 6, lsn(1, 4), lsn(1, 4))))
                ).status is Status.OK
        assert (await store(node, make_store(lsn(1, 5)))).status is Status.OK  # no producer
        before = await producer_state(node, "p1")
        assert before.status is Status.OK
        assert before.entries == ((5, lsn(1, 1), lsn(1, 2), grouped.timestamp_ms),
                                  (6, lsn(1, 4), lsn(1, 4), grouped.timestamp_ms))
        assert (await producer_state(node, "p2")).entries == (
            (9, lsn(1, 3), lsn(1, 3), grouped.timestamp_ms),)
        assert (await producer_state(node, "nobody")).entries == ()
        digest = await request(node, GetDigest(log_id=LOG, epoch=Epoch(1), from_esn=Esn(1),
                                               seal_epoch=Epoch(1), records_max=100,
                                               bytes_max=1 << 20))
        assert isinstance(digest, Digest)
        assert [entry[6] for entry in digest.entries] == [
            ("p1", 5, lsn(1, 1), lsn(1, 2)), ("p1", 5, lsn(1, 1), lsn(1, 2)),
            ("p2", 9, lsn(1, 3), lsn(1, 3)), ("p1", 6, lsn(1, 4), lsn(1, 4)), None]
    async with running_node(data_dir) as node:
        assert (await producer_state(node, "p1")).entries == before.entries


async def test_malformed_tags_and_requests_are_refused(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        outside = tagged(1, (b"a",), ("p1", 1, lsn(1, 7), lsn(1, 8)))
        assert (await store(node, outside)).status is Status.BADMSG
        empty_id = tagged(1, (b"a",), ("", 1, lsn(1, 1), lsn(1, 1)))
        assert (await store(node, empty_id)).status is Status.BADMSG
        too_many = tagged(1, (b"a",), ("p1", 1, lsn(1, 1), lsn(1, 1)),
                          ("p2", 1, lsn(1, 1), lsn(1, 1)))
        assert (await store(node, too_many)).status is Status.BADMSG
        assert (await producer_state(node, "")).status is Status.BADMSG
        assert (await producer_state(node, "p1", log_id=LogId(0))).status is Status.BADMSG


def test_index_keeps_the_latest_pairs_of_the_latest_producers() -> None:
    index = ProducerIndex(producer_ids_per_log_max=2, seqs_kept=3)
    for seq in range(1, 6):
        index.add(LOG, (("p1", seq, 10 * seq, 10 * seq),), seq)
    assert [e[0] for e in index.entries(LOG, "p1", 0)] == [3, 4, 5]
    assert [e[0] for e in index.entries(LOG, "p1", 40)] == [5]  # trimmed ones are not served
    # The same pair stored again (a new wave, recovery) changes nothing.
    index.add(LOG, (("p1", 5, 50, 50),), 99)
    assert index.entries(LOG, "p1", 0)[-1] == (5, 50, 50, 5)
    index.add(LOG, (("p2", 1, 60, 60),), 6)
    index.add(LOG, (("p1", 6, 70, 70),), 7)  # p1 is the most recent again
    index.add(LOG, (("p3", 1, 80, 80),), 8)  # p2 is forgotten
    assert index.entries(LOG, "p2", 0) == ()
    assert index.forgotten_count == 1
    assert index.producers_count == 2


def test_every_range_of_one_pair_is_kept_newest_first_when_bounded() -> None:
    """A stray copy of a first attempt and the record of the retry written again later are
    both remembered (issue 16 item 2): keeping only the lowest range would hide the retry."""
    index = ProducerIndex(producer_ids_per_log_max=2, seqs_kept=3, ranges_per_seq_max=2)
    index.add(LOG, (("p", 7, 12, 12),), 1)  # e.g. e1n2, plugged elsewhere by recovery
    index.add(LOG, (("p", 7, 30, 30),), 2)  # the retry, written again at e2n1
    index.add(LOG, (("p", 7, 12, 12),), 3)  # the stray stored again: nothing new
    assert index.entries(LOG, "p", 0) == ((7, 12, 12, 1), (7, 30, 30, 2))
    index.add(LOG, (("p", 7, 40, 41),), 4)  # a third attempt: the oldest range goes
    assert index.entries(LOG, "p", 0) == ((7, 30, 30, 2), (7, 40, 41, 4))
    assert index.entries(LOG, "p", 35) == ((7, 40, 41, 4),)
