"""On the node being rebuilt, a donor's copy never takes the place of a copy of equal or
higher precedence that a sequencer's STORE or recovery queued here but had not written yet,
and a donor's copy of higher precedence still wins over an older STORE in flight (an LSN's
identity never regresses; ``storage_node.core.rebuild_accept``).

Deterministic interleaving on a real storage node and record store: the STORE and the
REBUILD_STORE of the same LSN are both handed to the node in one event-loop iteration, so the
STORE is queued (not yet written, not in the index) when the donor's chunk is decided."""

from __future__ import annotations

import asyncio
import gc
import random
import types
from typing import Any

from shared import cluster_state as cs
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import Message, encode_fields
from shared.wire.rebuild import RebuildStore, RebuildStored
from shared.wire.store import (
    RECOVERY_HOLE,
    RecordFlags,
    Store,
    Stored,
    payloads_checksum,
    recovery_wave,
)
from storage_node.core.rebuild_accept import queued_winners, rebuild_pieces
from storage_node.rebuild_runtime import RebuildRuntime
from storage_node.runtime import StorageNode
from tests.unit.storage_node.helpers import REPLY_TIMEOUT_S, running_node

LOG = LogId(5)
ME = "st1"
GENERATION = 2


def _lsn(esn: int, epoch: int = 3) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def _copy(esn: int, *, wave: int = 1, flags: int = 0, count: int = 1) -> Store:
    payloads = tuple(b"" if flags & RecordFlags.HOLE else b"record-%d" % (esn + i)
                     for i in range(count))
    return Store(log_id=LOG, lsn=_lsn(esn), wave=wave, sequencer_node=NodeId("seq"),
                 copyset=(NodeId("st1"), NodeId("st2")) if not flags else (),
                 timestamp_ms=1_700_000_000_000, last_known_good=Esn(0),
                 release_lsn=Lsn(0), timeout_ms=1000, key=None, payloads=payloads,
                 checksum=payloads_checksum(payloads), flags=flags)


class _NoState:
    async def read(self) -> tuple[Status, cs.ClusterState, int]:
        return Status.OK, cs.EMPTY, 0

    async def write(self, state: cs.ClusterState, *, expected_version: int) -> Status:
        return Status.OK

    async def close(self) -> None:
        return None


def _runtime(node: StorageNode) -> RebuildRuntime:
    runtime = RebuildRuntime(node=node, data_dir="", cluster_name="c", state_store=_NoState(),
                             storage_nodes=lambda: (ME, "st2"),
                             request=lambda *_: None)
    runtime.generation = GENERATION
    return runtime


def _chunk(*copies: Store) -> RebuildStore:
    return RebuildStore(shard=ME, generation=GENERATION, log_id=int(LOG), release_lsn=0,
                        trim_lsn=0, sealed_epoch=0, sealed_by="",
                        entries=tuple(bytes(encode_fields(c)) for c in copies))


async def _both(node: StorageNode, runtime: RebuildRuntime, first: Store | RebuildStore,
                second: Store | RebuildStore) -> list[Message]:
    """Hand both to the node in one loop iteration (nothing is written in between)."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Message]] = [loop.create_future(), loop.create_future()]
    for message, future in zip((first, second), futures, strict=True):
        def reply(answer: Message, future: asyncio.Future[Message] = future) -> None:
            future.set_result(answer)
        if isinstance(message, RebuildStore):
            runtime.on_rebuild_store(message, reply)
        else:
            node.on_message(NodeId("seq"), message, reply)
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        return list(await asyncio.gather(*futures))


async def _held(node: StorageNode, esn: int) -> tuple[int, int, bytes]:
    """(flags, wave, payload) of the node's copy of ``esn``."""
    result = await node.store.read_copies(LOG, _lsn(esn), _lsn(esn), 1, 1 << 20)
    assert result.status is Status.OK and len(result.copies) == 1, result
    copy = result.copies[0]
    return copy[4], copy[5], bytes(copy[3])


def _ok(answers: list[Message]) -> None:
    for answer in answers:
        assert isinstance(answer, Stored | RebuildStored), answer
        assert answer.status is Status.OK, answer


async def test_queued_recovery_copy_is_not_overwritten_by_an_older_donor_copy(
        tmp_path: Any) -> None:
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        plug = _copy(1, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
        _ok(await _both(node, runtime, plug, _chunk(_copy(1, wave=1))))
        assert await _held(node, 1) == (int(RECOVERY_HOLE), recovery_wave(4, 0), b"")
        await runtime.close()


async def test_queued_store_is_not_overwritten_by_an_older_wave(tmp_path: Any) -> None:
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        _ok(await _both(node, runtime, _copy(1, wave=5), _chunk(_copy(1, wave=2))))
        assert (await _held(node, 1))[:2] == (0, 5)
        await runtime.close()


async def test_donor_copy_of_higher_precedence_wins_over_a_queued_store(
        tmp_path: Any) -> None:
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        plug = _copy(1, wave=recovery_wave(4, 1), flags=int(RECOVERY_HOLE))
        _ok(await _both(node, runtime, _copy(1, wave=1), _chunk(plug)))
        assert await _held(node, 1) == (int(RECOVERY_HOLE), recovery_wave(4, 1), b"")
        await runtime.close()


async def test_a_store_after_the_donor_copy_still_wins_by_precedence(tmp_path: Any) -> None:
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        plug = _copy(1, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
        _ok(await _both(node, runtime, _chunk(_copy(1, wave=1)), plug))
        assert await _held(node, 1) == (int(RECOVERY_HOLE), recovery_wave(4, 0), b"")
        await runtime.close()


async def test_only_the_covered_part_of_a_donor_batch_is_dropped(tmp_path: Any) -> None:
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        plug = _copy(2, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
        _ok(await _both(node, runtime, plug, _chunk(_copy(1, wave=1, count=3))))
        assert await _held(node, 1) == (0, 1, b"record-1")
        assert await _held(node, 2) == (int(RECOVERY_HOLE), recovery_wave(4, 0), b"")
        assert await _held(node, 3) == (0, 1, b"record-3")
        await runtime.close()


async def test_a_late_store_of_an_earlier_recovery_attempt_is_preempted(
        tmp_path: Any) -> None:
    """A donor's recovery copy counts as the recovery's STORE would have: the store machine
    remembers its wave, so an abandoned earlier attempt cannot overwrite it later."""
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        newer = _copy(1, wave=recovery_wave(4, 1), flags=int(RECOVERY_HOLE))
        older = _copy(1, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
        _ok(await _both(node, runtime, _chunk(newer), _copy(2, wave=1)))
        answers = await _both(node, runtime, older, _copy(3, wave=1))
        assert isinstance(answers[0], Stored) and answers[0].status is Status.PREEMPTED
        assert await _held(node, 1) == (int(RECOVERY_HOLE), recovery_wave(4, 1), b"")
        await runtime.close()


def test_rebuild_pieces_rule() -> None:
    """The pure rule: where the index holds a copy, nothing; where a queued copy of equal or
    higher precedence covers it, nothing; the rest goes."""
    rng = random.Random(7)
    for _ in range(2000):
        donor = (rng.randint(0, 1), rng.randint(1, 3))
        lo, hi = sorted((rng.randint(1, 30), rng.randint(1, 30)))
        held = sorted({(a, a + rng.randint(0, 3)) for a in rng.sample(range(1, 30), 2)})
        merged: list[tuple[Lsn, Lsn]] = []
        for a, b in held:
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], Lsn(max(b, merged[-1][1])))
            else:
                merged.append((Lsn(a), Lsn(b)))
        queued = [(a, a + rng.randint(0, 4), (rng.randint(0, 1), rng.randint(1, 3)))
                  for a in rng.sample(range(1, 30), 3)]
        pieces = rebuild_pieces(merged, queued_winners(queued, donor), lo, hi)
        written = {lsn for first, last in pieces for lsn in range(first, last + 1)}
        for lsn in range(lo, hi + 1):
            blocked = any(a <= lsn <= b for a, b in merged) or any(
                a <= lsn <= b and p >= donor for a, b, p in queued)
            assert (lsn not in written) == blocked, (lsn, donor, merged, queued, pieces)
        assert all(lo <= first <= last <= hi for first, last in pieces)


async def test_a_chunk_of_many_entries_is_written_in_slices(tmp_path: Any) -> None:
    """A chunk of thousands of single-record entries is decided and queued a slice per
    event-loop iteration, so the appends' STOREs are not held behind all of it; every copy
    is still written and counted in the one answer."""
    from storage_node.rebuild_runtime import REBUILD_SLICE_ENTRIES
    count = REBUILD_SLICE_ENTRIES * 5 + 3
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Message] = loop.create_future()
        inline_before = node.store.stats()["inline_commits"]
        runtime.on_rebuild_store(_chunk(*(_copy(esn) for esn in range(1, count + 1))),
                                 answered.set_result)
        queued_now = node.store.queued_copies(LOG, _lsn(1), _lsn(count))
        assert len(queued_now) == REBUILD_SLICE_ENTRIES
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            answer = await answered
        assert isinstance(answer, RebuildStored) and answer.status is Status.OK
        assert answer.written == count
        # Never committed on the event loop: an fsync per slice there held the appends back.
        assert node.store.stats()["inline_commits"] == inline_before
        held = node.store.held_ranges(LOG, _lsn(1), _lsn(count))
        assert sum(last - first + 1 for first, last in held) == count
        await runtime.close()


async def test_an_answered_chunk_is_freed_without_the_cyclic_gc(tmp_path: Any) -> None:
    """Once a chunk is answered nothing of it stays alive: with the cyclic GC off, the
    REBUILD_STORE message (and so its entries) has no referrer left but this test. A
    reference cycle through its closures kept every chunk received in memory until a
    collection ran: a 1 GB rebuild took the rebuilt node past 1 GiB of RSS."""
    from storage_node.rebuild_runtime import REBUILD_SLICE_ENTRIES
    count = REBUILD_SLICE_ENTRIES * 2 + 1  # more than one slice
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        loop = asyncio.get_running_loop()
        gc.collect()
        gc.disable()
        try:
            message = _chunk(*(_copy(esn) for esn in range(1, count + 1)))
            answered: asyncio.Future[Message] = loop.create_future()
            runtime.on_rebuild_store(message, answered.set_result)
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                answer = await answered
            assert isinstance(answer, RebuildStored) and answer.status is Status.OK
            assert answer.written == count
            # The writer thread drops its last reference to the batch just after answering.
            holders = ["not polled"]
            deadline = loop.time() + REPLY_TIMEOUT_S
            while holders and loop.time() < deadline:
                await asyncio.sleep(0.01)
                holders = [type(r).__name__ for r in gc.get_referrers(message)
                           if not isinstance(r, types.FrameType)]
            assert holders == [], holders
        finally:
            gc.enable()
        await runtime.close()
