"""A copy the node already indexes does not block a donor's copy of higher precedence
(issue 17, ``storage_node.held_precedence``): the node being rebuilt reads the precedence
of the copy it holds (flags and wave, from its segment: the index keeps neither) where a
donor's copy collides with it, and the higher one wins.

The case it closes: a node's copy of an LSN in a damaged segment had superseded an older
copy of the same LSN in an earlier segment (a recovery's hole plug over a record copy, a
later wave); losing the newer copy leaves the index resolving that LSN to the older one, so
the node served a record where recovery had decided a hole until a donor's copy replaced it.
Real storage node, real segments, a flipped byte."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

from shared.status import Status
from shared.types import LogId, NodeId
from shared.wire.codec import Message
from shared.wire.rebuild import RebuildStored
from shared.wire.store import RECOVERY_HOLE, Stored, recovery_wave
from storage_node.core.rebuild_accept import (
    PRECEDENCE_LOWEST,
    HeldCopy,
    contested,
    outranked,
)
from tests.unit.storage_node.helpers import (
    REPLY_TIMEOUT_S,
    make_store,
    running_node,
    segment_paths,
    storage_config,
    store,
    store_all,
)
from tests.unit.storage_node.test_rebuild_precedence import (
    LOG,
    ME,
    _chunk,
    _copy,
    _held,
    _lsn,
    _runtime,
)

OTHER = LogId(6)
PLUG = (int(RECOVERY_HOLE), recovery_wave(4, 0), b"")


def _flip(path: str, needle: bytes) -> None:
    data = bytearray(Path(path).read_bytes())
    data[data.index(needle)] ^= 0x01
    Path(path).write_bytes(bytes(data))


async def _rebuild(runtime: object, *copies: object) -> RebuildStored:
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Message] = loop.create_future()
    runtime.on_rebuild_store(_chunk(*copies), answered.set_result)  # type: ignore[attr-defined]
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        answer = await answered
    assert isinstance(answer, RebuildStored) and answer.status is Status.OK, answer
    return answer


async def test_a_lost_plug_is_restored_over_the_older_record_copy(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "st1")
    config = storage_config()
    victim_payload = b"victim-" * 20
    async with running_node(data_dir, config, node_id=ME) as node:
        assert (await store(node, _copy(1, wave=1))).status is Status.OK
        # Fill the first segment (1 MiB) so that what follows goes to a second one.
        fillers = [make_store(_lsn(esn, 1), (b"f" * 100_000,), log_id=OTHER)
                   for esn in range(1, 13)]
        assert all(r.status is Status.OK for r in await store_all(node, fillers))
        victim = make_store(_lsn(20, 1), (victim_payload,), log_id=OTHER)
        assert (await store(node, victim)).status is Status.OK
        # Recovery decided LSN 1 is a hole: its plug supersedes the record copy.
        plug = _copy(1, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
        assert (await store(node, plug)).status is Status.OK
        assert await _held(node, 1) == PLUG
    paths = segment_paths(data_dir)
    assert len(paths) == 2
    _flip(paths[1], victim_payload)  # the second segment is damaged before the plug
    async with running_node(data_dir, config, node_id=ME) as node:
        assert node.store.authority.damaged
        # The damage took the plug: the index resolves LSN 1 to the older record copy.
        assert await _held(node, 1) == (0, 1, b"record-1")
        runtime = _runtime(node)
        try:
            # A donor sends the plug it holds (the mini-rebuild of the damaged range).
            answer = await _rebuild(runtime, _copy(1, wave=recovery_wave(4, 0),
                                                   flags=int(RECOVERY_HOLE)))
            assert answer.written == 1
            assert await _held(node, 1) == PLUG
            metrics = runtime.metrics()
            assert metrics["rebuild_precedence_reads"] == 1
            assert metrics["rebuild_copies_outranked"] == 1
        finally:
            await runtime.close()
    async with running_node(data_dir, config, node_id=ME) as node:
        assert await _held(node, 1) == PLUG  # durable: a restart resolves it the same


async def test_an_indexed_copy_of_lower_precedence_is_replaced(tmp_path: Path) -> None:
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        try:
            for esn in (1, 2, 3):
                assert (await store(node, _copy(esn, wave=2))).status is Status.OK
            # Lower (wave 1) and equal (wave 2) donor copies never replace the node's.
            answer = await _rebuild(runtime, _copy(1, wave=1), _copy(2, wave=2))
            assert answer.written == 0
            assert runtime.metrics()["rebuild_precedence_reads"] == 1  # wave 2's, not wave 1's
            assert (await _held(node, 1))[:2] == (0, 2)
            # A later wave and a recovery copy do; only where the node's is lower.
            answer = await _rebuild(runtime, _copy(1, wave=3, count=3))
            assert answer.written == 3
            assert [(await _held(node, esn))[:2] for esn in (1, 2, 3)] == [(0, 3)] * 3
            plug = _copy(2, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
            answer = await _rebuild(runtime, plug)
            assert answer.written == 1
            assert await _held(node, 2) == PLUG
            assert (await _held(node, 1))[:2] == (0, 3)
            assert (await _held(node, 3))[:2] == (0, 3)
            # The plug is not replaced by a sequencer copy of any wave.
            answer = await _rebuild(runtime, _copy(2, wave=9))
            assert answer.written == 0
            assert await _held(node, 2) == PLUG
        finally:
            await runtime.close()


async def test_a_copy_written_while_the_precedence_is_read_is_not_overwritten(
        tmp_path: Path) -> None:
    """The read learns the precedence of the copy indexed when it began; a recovery copy of
    higher precedence written before the donor's copy is decided must stay: the index no
    longer resolves the LSN to the copy that was read."""
    async with running_node(str(tmp_path), node_id=ME) as node:
        runtime = _runtime(node)
        try:
            assert (await store(node, _copy(1, wave=1))).status is Status.OK
            newer = _copy(1, wave=recovery_wave(5, 0), flags=int(RECOVERY_HOLE))
            newer_stored: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            read = node.store.read_precedences
            waits: list[asyncio.Task[None]] = []

            def read_then_wait(log_id: LogId, ranges: list[tuple[int, int]],
                               done: Callable[[list[HeldCopy]], None]) -> None:
                def delayed(copies: list[HeldCopy]) -> None:
                    # Answered only once the newer copy is written and indexed (no longer
                    # queued: the queue's own check would otherwise block the donor's).
                    async def later() -> None:
                        await newer_stored
                        async with asyncio.timeout(REPLY_TIMEOUT_S):
                            while node.store.queued_copies(LOG, _lsn(1), _lsn(1)):  # noqa: ASYNC110
                                await asyncio.sleep(0.001)
                        done(copies)
                    waits.append(asyncio.get_running_loop().create_task(later()))
                read(log_id, ranges, delayed)
                # After the read has looked the copy up (its task's first step).
                asyncio.get_running_loop().call_soon(
                    node.on_message, NodeId("seq"), newer, newer_stored.set_result)

            node.store.read_precedences = read_then_wait  # type: ignore[method-assign]
            older_plug = _copy(1, wave=recovery_wave(4, 0), flags=int(RECOVERY_HOLE))
            answer = await _rebuild(runtime, older_plug)
            stored = newer_stored.result()
            assert isinstance(stored, Stored) and stored.status is Status.OK
            assert answer.written == 0
            assert await _held(node, 1) == (int(RECOVERY_HOLE), recovery_wave(5, 0), b"")
        finally:
            await runtime.close()


def _merged_lsns(ranges: list[tuple[int, int]]) -> set[int]:
    return {lsn for first, last in ranges for lsn in range(first, last + 1)}


def test_contested_and_outranked_rules() -> None:
    """The pure rules against a brute-force model: a held LSN is read only where a donor
    copy above the lowest precedence covers it; it is replaced only where the copy read is
    still the one indexed and of lower precedence than the donor's."""
    rng = random.Random(17)
    for _ in range(2000):
        held = sorted({(a, a + rng.randint(0, 3)) for a in rng.sample(range(1, 40), 4)})
        merged: list[tuple[int, int]] = []
        for a, b in held:
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        copies = [(a, a + rng.randint(0, 5), (rng.randint(0, 1), rng.randint(1, 3)))
                  for a in rng.sample(range(1, 40), 3)]
        expected = {lsn for lsn in _merged_lsns(merged)
                    if any(a <= lsn <= b and p > PRECEDENCE_LOWEST for a, b, p in copies)}
        got = contested(merged, copies)
        assert _merged_lsns(got) == expected, (merged, copies, got)
        assert all(got[i][1] + 1 < got[i + 1][0] for i in range(len(got) - 1))
        read = [(a, b, (rng.randint(0, 1), rng.randint(1, 3)), rng.randint(0, 2))
                for a, b in merged]
        current = [(a, b, key if rng.random() < 0.7 else 9) for a, b, _, key in read]
        donor = (rng.randint(0, 1), rng.randint(1, 3))
        beaten = _merged_lsns(outranked(read, current, donor))
        for lsn in _merged_lsns(merged):
            want = any(a <= lsn <= b and p < donor and any(
                c <= lsn <= d and k == key for c, d, k in current) for a, b, p, key in read)
            assert (lsn in beaten) == want, (lsn, read, current, donor)
