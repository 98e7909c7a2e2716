"""A STORE arriving again while the node still writes the first copy (a later wave of the same
append, a duplicated message) is answered by that one write, not written twice."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from shared.status import Status
from shared.types import NodeId
from shared.wire.store import RecordFlags, Store, Stored, payloads_checksum
from storage_node.core.inflight_stores import JOINED_PER_STORE_MAX, InflightStores
from tests.unit.storage_node.helpers import (
    lsn,
    make_store,
    payload_for,
    read_file,
    running_node,
    segment_paths,
    store,
    store_all,
)


def test_a_copy_joins_the_store_being_written_and_gets_its_outcome() -> None:
    inflight: InflightStores[str] = InflightStores()
    first = make_store(lsn(1, 1), (b"p" * 100,))
    again = dataclasses.replace(first, wave=2)
    assert not inflight.join(first, "first")
    inflight.begin(first)
    assert inflight.join(again, "again")
    assert inflight.finish(again) == []  # not the STORE being written
    assert inflight.finish(first) == [(again, "again")]
    assert len(inflight) == 0
    # Written and answered: a later copy is written again (the sequencer counts it stored).
    assert not inflight.join(dataclasses.replace(first, wave=3), "late")


def test_other_payloads_and_recovery_copies_never_join() -> None:
    inflight: InflightStores[str] = InflightStores()
    first = make_store(lsn(1, 1), (b"a",))
    inflight.begin(first)
    other = make_store(lsn(1, 1), (b"b",))
    assert not inflight.join(other, "other")
    hole = dataclasses.replace(first, flags=RecordFlags.WRITTEN_BY_RECOVERY | RecordFlags.HOLE,
                               payloads=(b"",), checksum=payloads_checksum((b"",)))
    assert not inflight.join(hole, "hole")
    inflight.begin(hole)  # not tracked: recovery copies are written whatever is in flight
    assert inflight.finish(hole) == []
    assert not inflight.join(make_store(lsn(1, 2), (b"a",)), "next lsn")


def test_joined_stores_are_bounded() -> None:
    inflight: InflightStores[int] = InflightStores()
    first = make_store(lsn(1, 1))
    inflight.begin(first)
    joined = [inflight.join(dataclasses.replace(first, wave=w), w)
              for w in range(2, JOINED_PER_STORE_MAX + 3)]
    assert joined.count(True) == JOINED_PER_STORE_MAX and not joined[-1]
    assert len(inflight.finish(first)) == JOINED_PER_STORE_MAX


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.booleans()), max_size=40))
def test_every_joined_store_comes_back_once(ops: list[tuple[int, int, bool]]) -> None:
    inflight: InflightStores[int] = InflightStores()
    writing: dict[int, Store] = {}
    tokens_joined: list[int] = []
    tokens_back: list[int] = []
    for token, (esn, wave, finish) in enumerate(ops):
        message = make_store(lsn(1, esn), (payload_for(esn),), wave=wave)
        if finish and esn in writing:
            tokens_back += [t for _, t in inflight.finish(writing.pop(esn))]
        elif inflight.join(message, token):
            tokens_joined.append(token)
        elif esn not in writing:
            inflight.begin(message)
            writing[esn] = message
    for message in writing.values():
        tokens_back += [t for _, t in inflight.finish(message)]
    assert sorted(tokens_back) == tokens_joined
    assert len(inflight) == 0


async def test_a_second_wave_to_a_node_still_writing_is_not_written_again(
        tmp_path: Path) -> None:
    payload = payload_for(1, 64 * 1024)
    first = make_store(lsn(1, 1), (payload,))
    async with running_node(str(tmp_path)) as node:
        # Both arrive before the writer gets to the first (one loop iteration).
        replies = await store_all(node, [first, dataclasses.replace(first, wave=2)])
        assert [(r.status, r.wave) for r in replies] == [(Status.OK, 1), (Status.OK, 2)]
        stats = node.stats()
        assert stats["stores_joined"] == 1 and stats["stores"] == 1
        assert stats["stored_ok"] == 2
        assert payload_for(1, 64 * 1024) in b"".join(
            [await asyncio.to_thread(read_file, p) for p in segment_paths(str(tmp_path))])
        assert stats["bytes_written"] < 2 * len(payload)
        # Once durable, the copy is there for later waves as for any other record.
        again = await store(node, dataclasses.replace(first, wave=3))
        assert again.status is Status.OK


async def test_a_joined_store_is_answered_when_a_closing_node_drains_the_write(
        tmp_path: Path) -> None:
    first = make_store(lsn(1, 1))
    async with running_node(str(tmp_path)) as node:
        answers: list[Stored] = []
        node.on_message(NodeId("seq"), first, lambda m: None)
        node.on_message(NodeId("seq"), dataclasses.replace(first, wave=2),
                        lambda m: answers.append(m) if isinstance(m, Stored) else None)
        await node.close()  # the queued write is drained and durable: both are answered
        assert [(a.status, a.wave) for a in answers] == [(Status.OK, 2)]
