"""The buffered writer against a scripted in-memory appender (and, for the HTTP body of
compressed batches, through a real ``Client`` against fake nodes): batching triggers, one
append-batch per batch, LSN per record, the memory bound, ordering and retries with producer
pairs, flush/close, errors and cancellation."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from fake_seqlog_node import FakeCluster, FakeNode
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from seqlog import AppendHandle, BufferedWriter, Client, LogError, Status
from seqlog.results import BatchResult
from shared.types import Lsn

E1 = 1 << 32
WAIT_S = 5.0
"""Bound on every wait in these tests (they finish in milliseconds when the writer works)."""


@dataclass
class Call:
    log_id: int
    payloads: list[bytes]
    key: str | None
    producer_id: str | None
    producer_seq: int | None
    compression: str | None


Action = Callable[[], None] | None


class FakeAppender:
    """A log store with the cluster's idempotent-append rule: a repeated (producer, log, seq)
    gets the original LSNs and writes nothing. ``script`` scripts the next calls' fates:
    ``"refuse"`` (nothing written, OVERLOADED), ``"lose"`` (written, answer lost: TIMEDOUT),
    ``"reject"`` (INVALID_PARAM, nothing written); ``hold`` makes calls wait until released."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.logs: dict[int, list[bytes]] = defaultdict(list)
        self.pairs: dict[tuple[str, int, int], BatchResult] = {}
        self.script: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.in_flight: Counter[int] = Counter()
        self.in_flight_max: Counter[int] = Counter()

    async def append_batch(
        self, log_id: int, payloads: Iterable[bytes], *, key: str | None = None,
        producer_id: str | None = None, producer_seq: int | None = None,
        compression: str | None = None,
    ) -> BatchResult:
        items = list(payloads)
        self.calls.append(Call(log_id, items, key, producer_id, producer_seq, compression))
        self.in_flight[log_id] += 1
        self.in_flight_max[log_id] = max(self.in_flight_max[log_id], self.in_flight[log_id])
        try:
            await self.hold.wait()
            await asyncio.sleep(0)
            fate = self.script.pop(0) if self.script else "ok"
            if fate == "refuse":
                raise LogError(Status.OVERLOADED, "scripted")
            if fate == "reject":
                raise LogError(Status.INVALID_PARAM, "scripted")
            assert producer_id is not None and producer_seq is not None
            pair = (producer_id, log_id, producer_seq)
            result = self.pairs.get(pair)
            if result is None:
                records = self.logs[log_id]
                first = E1 + len(records) + 1
                records.extend(items)
                result = self.pairs[pair] = BatchResult(
                    first_lsn=Lsn(first), last_lsn=Lsn(first + len(items) - 1),
                    count=len(items), timestamp_ms=1)
            if fate == "lose":
                raise LogError(Status.TIMEDOUT, "scripted: written, answer lost")
            return result
        finally:
            self.in_flight[log_id] -= 1

    def at(self, log_id: int, lsn: int) -> bytes:
        return self.logs[log_id][lsn - E1 - 1]


async def until(predicate: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.001)


async def settle() -> None:
    """Let every ready callback and task step run (no timers: linger is long in such tests)."""
    for _ in range(20):
        await asyncio.sleep(0)


def writer(appender: FakeAppender, **options: Any) -> BufferedWriter:
    options.setdefault("linger_ms", 60_000)
    return BufferedWriter(appender, **options)


def payload(i: int, size: int = 16) -> bytes:
    return f"{i:08d}".encode().ljust(size, b".")


async def test_count_trigger_one_append_batch_per_batch_and_lsn_per_record() -> None:
    fake = FakeAppender()
    w = writer(fake, batch_records_max=10)
    futures = [w.append_nowait(1, payload(i)) for i in range(25)]
    await settle()
    assert [len(c.payloads) for c in fake.calls] == [10, 10]
    await w.flush()
    assert [len(c.payloads) for c in fake.calls] == [10, 10, 5]
    lsns = [f.result() for f in futures]
    assert lsns == list(range(E1 + 1, E1 + 26))
    assert all(fake.at(1, lsn) == payload(i) for i, lsn in enumerate(lsns))
    # One producer for the writer, one pair per batch, increasing in send order.
    assert {c.producer_id for c in fake.calls} == {w.producer_id}
    seqs = [c.producer_seq for c in fake.calls]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert w.bytes_held == 0 and w.stats.batches_ok == 3 and w.stats.records_ok == 25
    await w.close()


async def test_bytes_trigger_seals_before_a_record_that_would_not_fit() -> None:
    fake = FakeAppender()
    w = writer(fake, batch_bytes_max=100)
    futures = [w.append_nowait(1, payload(i, 30)) for i in range(7)]
    await settle()
    assert [len(c.payloads) for c in fake.calls] == [3, 3]  # 90 bytes each; 120 would not fit
    big = w.append_nowait(1, b"x" * 250)  # bigger than a batch: a batch of its own
    await settle()
    assert [len(c.payloads) for c in fake.calls] == [3, 3, 1, 1]
    await w.close()
    assert all(f.done() and not f.exception() for f in [*futures, big])


async def test_default_batch_carries_a_thousand_1kib_records() -> None:
    """Per-batch costs (a STORE per copy, a commit, an fsync) dominate below about 1 MiB:
    by default a thousand 1 KiB records travel as one batch, not four."""
    fake = FakeAppender()
    w = writer(fake)
    futures = [w.append_nowait(1, payload(i, 1024)) for i in range(1000)]
    await settle()
    assert [len(c.payloads) for c in fake.calls] == [1000]
    await w.close()
    assert all(f.done() and not f.exception() for f in futures)


async def test_linger_flushes_the_oldest_record_after_linger_ms() -> None:
    fake = FakeAppender()
    loop = asyncio.get_running_loop()
    w = BufferedWriter(fake, linger_ms=30)
    t0 = loop.time()
    first = w.append_nowait(1, b"a")
    await settle()
    w.append_nowait(1, b"b")
    assert fake.calls == []
    assert await asyncio.wait_for(first, WAIT_S) == E1 + 1
    assert loop.time() - t0 >= 0.030 - 0.002
    assert [c.payloads for c in fake.calls] == [[b"a", b"b"]]
    await w.close()


async def test_one_timer_and_one_task_per_batch_not_per_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAppender()
    loop = asyncio.get_running_loop()
    timers = 0
    real_call_at = loop.call_at

    def call_at(when: float, callback: Callable[..., object], *args: Any,
                **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        return real_call_at(when, callback, *args, **kwargs)

    tasks = 0
    real_create_task = loop.create_task

    def create_task(coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
        nonlocal tasks
        tasks += 1
        return real_create_task(coro, **kwargs)

    monkeypatch.setattr(loop, "call_at", call_at)
    monkeypatch.setattr(loop, "create_task", create_task)
    w = BufferedWriter(fake, linger_ms=5, batch_records_max=100_000)
    futures = [w.append(1 + i % 10, payload(i), key=f"k{i % 3}") for i in range(3000)]
    await asyncio.wait_for(asyncio.gather(*futures), WAIT_S)
    assert len(fake.calls) == 30  # 10 logs x 3 keys
    assert tasks == 30
    assert timers <= 2  # one tick seals all 30 (armed once, maybe re-armed once)
    for log_id in range(1, 11):
        for key in ("k0", "k1", "k2"):
            [call] = [c for c in fake.calls if c.log_id == log_id and c.key == key]
            assert len(call.payloads) == 100
    await w.close()


async def test_handles_read_their_batch_outcome_without_a_future_per_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``append_nowait`` returns a handle (batch + index), not a future: firing 3,000 records
    and awaiting every handle creates a future per batch at most, and each handle answers
    with its own LSN; a failed batch's handles raise its error."""
    fake = FakeAppender()
    fake.hold.clear()
    fake.script = ["ok", "reject"]
    loop = asyncio.get_running_loop()
    made = 0
    real_create_future = loop.create_future

    def create_future() -> asyncio.Future[Any]:
        nonlocal made
        made += 1
        return real_create_future()

    monkeypatch.setattr(loop, "create_future", create_future)
    w = writer(fake, batch_records_max=1000)
    handles = [w.append_nowait(1, payload(i)) for i in range(3000)]
    mixed = w.append(1, b"a future")  # a record added with ``append`` keeps its future
    after = w.append_nowait(1, b"after")
    await settle()
    assert not handles[0].done()
    with pytest.raises(asyncio.InvalidStateError):
        handles[0].result()
    with pytest.raises(asyncio.InvalidStateError):
        handles[0].exception()
    waiting = asyncio.ensure_future(handles[0])  # one Task: the await of a pending handle
    fake.hold.set()
    assert await asyncio.wait_for(waiting, WAIT_S) == E1 + 1
    await asyncio.wait_for(w.flush(), WAIT_S)
    lsns = [await h for h in handles[:1000]]
    assert lsns == list(range(E1 + 1, E1 + 1001))
    assert [fake.at(1, lsn) for lsn in lsns] == [payload(i) for i in range(1000)]
    for h in handles[1000:2000]:  # the second batch was rejected
        assert h.done()
        exc = h.exception()
        assert isinstance(exc, LogError) and exc.status is Status.INVALID_PARAM
        with pytest.raises(LogError):
            await h
    assert [h.result() for h in handles[2000:]] == list(range(E1 + 1001, E1 + 2001))
    assert mixed.result() == E1 + 2001 and after.result() == E1 + 2002
    assert made < 30  # per batch and per wait (4 batches), never per record (3,002)
    assert w.stats.records_ok == 2002 and w.stats.records_failed == 1000
    await w.close()


async def test_past_the_memory_bound_append_fails_fast_and_buffers_nothing() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    w = writer(fake, memory_bytes_max=1000, batch_bytes_max=300)
    accepted = [w.append_nowait(1, payload(i, 100)) for i in range(10)]
    with pytest.raises(LogError) as refused:
        w.append_nowait(1, payload(10, 100))
    assert refused.value.status is Status.SEQNOBUFS
    with pytest.raises(LogError):
        await w.append(2, b"x")
    assert w.bytes_held == 1000
    fake.hold.set()
    await w.flush()
    assert w.bytes_held == 0
    assert fake.logs[1] == [payload(i, 100) for i in range(10)] and 2 not in fake.logs
    assert [f.result() for f in accepted] == list(range(E1 + 1, E1 + 11))
    after = w.append_nowait(1, b"after")  # room again
    await w.flush()
    assert after.result() == E1 + 11
    await w.close()


async def test_ordered_never_has_two_batches_of_a_log_in_flight_and_keeps_order() -> None:
    fake = FakeAppender()
    # Batch 2's first attempt is written but its answer lost; batch 4's first attempt is
    # refused (nothing written). Both are retried with their pair.
    fake.script = ["ok", "lose", "ok", "refuse"]
    w = BufferedWriter(fake, linger_ms=1, batch_records_max=7, ordered=True)

    async def producer(log_id: int, n: int) -> list[int]:
        out = []
        for i in range(n):
            out.append(await w.append(log_id, payload(i)))
        return out

    def fire(log_id: int) -> list[AppendHandle]:
        return [w.append_nowait(log_id, payload(i)) for i in range(200)]

    fired = fire(1)
    sequential = asyncio.ensure_future(producer(2, 30))
    await asyncio.wait_for(asyncio.gather(*fired, sequential), WAIT_S)
    await w.close()
    assert fake.in_flight_max[1] == 1 and fake.in_flight_max[2] == 1
    assert fake.logs[1] == [payload(i) for i in range(200)]  # in order, each once
    assert fake.logs[2] == [payload(i) for i in range(30)]
    assert [f.result() for f in fired] == list(range(E1 + 1, E1 + 201))
    assert w.stats.retries == 2
    seqs = [c.producer_seq for c in fake.calls]
    assert len(seqs) == len(set(seqs)) + 2  # the two retries reused their pairs


async def test_ordered_key_change_seals_so_order_holds_across_keys() -> None:
    fake = FakeAppender()
    w = writer(fake, ordered=True)
    for i in range(6):
        w.append_nowait(1, payload(i), key="a" if i < 2 or i > 3 else "b")
    await w.flush()
    assert [(c.key, len(c.payloads)) for c in fake.calls] == [("a", 2), ("b", 2), ("a", 2)]
    assert fake.logs[1] == [payload(i) for i in range(6)]
    await w.close()


async def test_ordered_batches_grow_while_one_is_in_flight() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    w = BufferedWriter(fake, linger_ms=1, ordered=True)
    first = w.append_nowait(1, b"first")
    await until(lambda: len(fake.calls) == 1, "first batch sent")
    later = [w.append_nowait(1, payload(i)) for i in range(50)]
    await asyncio.sleep(0.01)  # several lingers pass while the first batch is in flight
    assert len(fake.calls) == 1
    fake.hold.set()
    await asyncio.wait_for(asyncio.gather(first, *later), WAIT_S)
    assert [len(c.payloads) for c in fake.calls] == [1, 50]
    await w.close()


async def test_independent_has_several_in_flight_and_retries_never_duplicate() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    fake.script = ["lose", "ok", "lose", "refuse", "lose"]
    w = writer(fake, batch_records_max=10, batches_in_flight_per_log_max=4)
    futures = [w.append_nowait(1, payload(i)) for i in range(100)]
    await settle()
    assert len(fake.calls) == 4  # the bound
    fake.hold.set()
    await w.flush()
    assert fake.in_flight_max[1] == 4
    assert sorted(fake.logs[1]) == [payload(i) for i in range(100)]  # each once
    for i, f in enumerate(futures):
        assert fake.at(1, f.result()) == payload(i)
    await w.close()


class StuckFirstBatch(FakeAppender):
    """Refuses the writer's first batch a few times; checks that no batch is ever sent
    ``bound`` or more sends after the oldest unanswered one (the pair window)."""

    def __init__(self, refusals: int, bound: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.bound = bound
        self.answered: set[int] = set()
        self.span_max = 0

    async def append_batch(self, log_id: int, payloads: Iterable[bytes], *,
                           key: str | None = None, producer_id: str | None = None,
                           producer_seq: int | None = None,
                           compression: str | None = None) -> BatchResult:
        assert producer_seq is not None
        oldest_open = min(s for s in range(producer_seq + 1) if s not in self.answered)
        self.span_max = max(self.span_max, producer_seq - oldest_open + 1)
        if producer_seq == 0 and self.refusals:
            self.refusals -= 1
            raise LogError(Status.OVERLOADED, "scripted")
        result = await super().append_batch(log_id, payloads, key=key, producer_id=producer_id,
                                             producer_seq=producer_seq)
        self.answered.add(producer_seq)
        return result


async def test_independent_in_flight_bound_spans_from_the_oldest_unanswered_batch() -> None:
    fake = StuckFirstBatch(refusals=4, bound=3)
    w = writer(fake, batch_records_max=10, batches_in_flight_per_log_max=3)
    futures = [w.append_nowait(1, payload(i)) for i in range(100)]
    await asyncio.wait_for(w.flush(), WAIT_S)
    assert fake.span_max == 3  # batches 1 and 2 were answered; 3 waited for batch 0
    assert w.stats.retries == 4
    assert sorted(fake.logs[1]) == [payload(i) for i in range(100)]
    assert all(fake.at(1, f.result()) == payload(i) for i, f in enumerate(futures))
    await w.close()


async def test_a_batch_that_fails_for_good_fails_each_of_its_records() -> None:
    fake = FakeAppender()
    fake.script = ["reject"]
    w = writer(fake, batch_records_max=5)
    doomed = [w.append_nowait(1, payload(i)) for i in range(5)]
    fine = [w.append_nowait(1, payload(i)) for i in range(5, 8)]
    await w.flush()
    for f in doomed:
        assert isinstance(f.exception(), LogError)
        assert f.exception().status is Status.INVALID_PARAM  # type: ignore[union-attr]
    assert [f.result() for f in fine] == [E1 + 1, E1 + 2, E1 + 3]
    assert w.bytes_held == 0 and w.stats.records_failed == 5
    await w.close()


async def test_retryable_errors_give_up_after_retry_timeout() -> None:
    fake = FakeAppender()
    fake.script = ["refuse"] * 1000
    w = writer(fake, retry_timeout_ms=50)
    with pytest.raises(LogError) as failed:
        await asyncio.wait_for(asyncio.gather(w.append(1, b"a"), w.flush()), WAIT_S)
    assert failed.value.status is Status.OVERLOADED
    assert 1 < len(fake.calls) < 20 and fake.logs[1] == []
    await w.close()


async def test_ordered_failure_fails_the_later_records_of_the_log_unsent() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    fake.script = ["reject"]
    w = writer(fake, ordered=True, batch_records_max=2)
    failing = [w.append_nowait(1, payload(i)) for i in range(2)]
    queued = [w.append_nowait(1, payload(i)) for i in range(2, 6)]  # two sealed, queued
    building = w.append_nowait(1, payload(6))
    other_log = w.append_nowait(2, b"other")
    await settle()
    fake.hold.set()
    await w.flush()
    assert [c.log_id for c in fake.calls] == [1, 2]
    for f in [*failing, *queued, building]:
        assert f.exception().status is Status.INVALID_PARAM  # type: ignore[union-attr]
    assert other_log.result() == E1 + 1
    assert w.bytes_held == 0
    fresh = w.append_nowait(1, b"fresh")  # the log starts afresh
    await w.flush()
    assert fresh.result() == E1 + 1
    await w.close()


async def test_cancelling_an_append_await_leaves_the_writer_intact() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    w = writer(fake, batch_records_max=3)
    waiting = [asyncio.ensure_future(w.append(1, payload(i))) for i in range(3)]
    await until(lambda: len(fake.calls) == 1, "batch sent")
    waiting[1].cancel()
    fake.hold.set()
    assert await asyncio.wait_for(waiting[0], WAIT_S) == E1 + 1
    assert await waiting[2] == E1 + 3
    assert waiting[1].cancelled()
    assert fake.logs[1] == [payload(0), payload(1), payload(2)]  # sent: outcome was unknown
    following = w.append_nowait(1, b"next")
    await w.flush()
    assert following.result() == E1 + 4
    await w.close()
    assert w.bytes_held == 0 and w.stats.records_ok == 4


async def test_cancelling_a_flush_leaves_the_writer_intact() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    w = writer(fake)
    first = w.append_nowait(1, b"a")
    flushing = asyncio.ensure_future(w.flush())
    await until(lambda: len(fake.calls) == 1, "flush sent the batch")
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    second = w.append_nowait(1, b"b")
    fake.hold.set()
    await asyncio.wait_for(w.flush(), WAIT_S)
    assert (first.result(), second.result()) == (E1 + 1, E1 + 2)
    await w.close()
    assert w.bytes_held == 0


async def test_flush_waits_and_close_refuses_later_appends() -> None:
    fake = FakeAppender()
    async with writer(fake) as w:
        f = w.append_nowait(1, b"a")
        await settle()
        assert not f.done() and fake.calls == []
        await w.flush()
        assert f.result() == E1 + 1
        g = w.append_nowait(1, b"b")
    assert g.result() == E1 + 2  # leaving ``async with`` flushed
    with pytest.raises(LogError) as closed:
        w.append_nowait(1, b"c")
    assert closed.value.status is Status.SHUTDOWN
    await w.close()  # idempotent


async def test_cancelled_close_abandons_pending_batches_cleanly() -> None:
    fake = FakeAppender()
    fake.hold.clear()
    w = writer(fake, ordered=True, batch_records_max=1)
    in_flight = w.append_nowait(1, b"a")
    queued = w.append_nowait(1, b"b")
    building = w.append_nowait(2, b"c")
    del building
    closing = asyncio.ensure_future(w.close())
    await until(lambda: len(fake.calls) == 2, "flush sent what it could")
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await until(lambda: in_flight.done(), "in-flight batch abandoned")
    assert in_flight.exception().status is Status.TIMEDOUT  # type: ignore[union-attr]
    assert queued.exception().status is Status.SHUTDOWN  # type: ignore[union-attr]
    assert w.bytes_held == 0
    await until(lambda: not w._tasks, "no tasks left")


async def test_invalid_arguments() -> None:
    fake = FakeAppender()
    w = writer(fake)
    for bad_log in (0, -1, 2**62, "1", True):
        with pytest.raises(LogError) as e:
            w.append_nowait(bad_log, b"x")  # type: ignore[arg-type]
        assert e.value.status is Status.INVALID_PARAM
    with pytest.raises(LogError):
        w.append_nowait(1, "text")  # type: ignore[arg-type]
    with pytest.raises(LogError):
        w.append_nowait(1, b"x", key=7)  # type: ignore[arg-type]
    assert w.append_nowait(1, bytearray(b"ok")) is not None
    for options in ({"compression": "gzip"}, {"batch_records_max": 0}, {"linger_ms": -1},
                    {"batches_in_flight_per_log_max": 16},
                    {"memory_bytes_max": 10, "batch_bytes_max": 100}):
        with pytest.raises(ValueError):
            BufferedWriter(fake, **options)
    await w.close()
    assert w.bytes_held == 0


# -- through the real client against fake HTTP nodes: the compressed body ------------------

@pytest.fixture
async def node() -> AsyncIterator[FakeNode]:
    cluster = FakeCluster()
    n = FakeNode(cluster, "n2")
    await n.start()
    yield n
    await n.stop()


def log_lines(n: int) -> list[bytes]:
    return [json.dumps({"ts": f"2026-11-24T06:{i % 60:02d}:00Z", "level": "info",
                        "service": "checkout", "path": f"/api/v1/orders/{i}",
                        "latency_ms": i % 97}).encode() for i in range(n)]


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
async def test_compression_is_sent_only_when_it_shrinks_the_batch(
        node: FakeNode, codec: str) -> None:
    lines = log_lines(200)
    noise = [os.urandom(512) for _ in range(20)]
    async with Client(node.url) as client:
        async with client.buffered_writer(compression=codec, linger_ms=60_000) as w:
            line_lsns = [w.append_nowait(3, line) for line in lines]
            await w.flush()
            noise_lsns = [w.append_nowait(4, p) for p in noise]
        compressed, plain = node.batch_bodies
        assert compressed["compression"] == codec and compressed["records"] == 200
        assert "payloads" not in compressed
        assert len(compressed["compressed_payloads"]) < sum(map(len, lines)) / 3
        assert "compression" not in plain and plain["payloads"] == noise
        # What the node stored is the plain records, one per LSN.
        assert node.cluster.logs[3] == [(lsn.result(), line, None)
                                        for lsn, line in zip(line_lsns, lines, strict=True)]
        assert [r.payload for r in (await client.read(4)).records] == noise
        assert [f.result() for f in noise_lsns] == [E1 + 1 + i for i in range(20)]
        sent = len(compressed["compressed_payloads"]) + sum(map(len, noise))
        assert (client.batch_bytes_plain, client.batch_bytes_sent) == (
            sum(map(len, lines)) + sum(map(len, noise)), sent)


async def test_client_append_batch_compression_keyword(node: FakeNode) -> None:
    async with Client(node.url) as client:
        result = await client.append_batch(5, log_lines(50), key="k", compression="zstd")
        assert result.count == 50
        assert node.batch_bodies[-1]["compression"] == "zstd"
        assert node.batch_bodies[-1]["key"] == "k"
        await client.append_batch(5, log_lines(50))
        assert "payloads" in node.batch_bodies[-1]
        with pytest.raises(LogError) as bad:
            await client.append_batch(5, [b"x"], compression="gzip")
        assert bad.value.status is Status.INVALID_PARAM
        assert [r.payload for r in (await client.read(5)).records] == log_lines(50) * 2


async def test_writer_through_the_client_sends_its_producer_pairs(node: FakeNode) -> None:
    async with Client(node.url) as client, client.buffered_writer(linger_ms=1) as w:
        lsns = await asyncio.gather(*(w.append(9, payload(i)) for i in range(500)))
        assert sorted(lsns) == list(range(E1 + 1, E1 + 501))
        assert all(b["producer_id"] == w.producer_id for b in node.batch_bodies)
        assert len({b["producer_seq"] for b in node.batch_bodies}) == len(node.batch_bodies)


# -- property: any mix of appends and answers keeps the writer's promises ------------------

FATES = st.sampled_from(["ok", "ok", "ok", "refuse", "lose", "reject"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(ordered=True, ops=[(1, None, 1, False), (1, None, 1, False)], fates=["refuse"],
         records_max=1, in_flight_max=4)  # a retried first batch must not land second
@example(ordered=False, ops=[(1, None, 1, False)] * 3, fates=["lose", "lose"],
         records_max=1, in_flight_max=4)  # retries after lost answers must not duplicate
@given(ordered=st.booleans(),
       ops=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([None, "a"]),
                              st.integers(1, 40), st.booleans()), min_size=1, max_size=120),
       fates=st.lists(FATES, max_size=40),
       records_max=st.integers(1, 12), in_flight_max=st.integers(1, 4))
def test_any_mix_of_appends_and_answers_keeps_the_promises(
        ordered: bool, ops: list[tuple[int, str | None, int, bool]], fates: list[str],
        records_max: int, in_flight_max: int) -> None:
    """Acked records are stored at their LSN; nothing is stored twice; ordered writers store
    each log's records in append order; nothing is left held or running."""

    async def scenario() -> None:
        fake = FakeAppender()
        fake.script = list(fates)
        w = BufferedWriter(fake, linger_ms=1, batch_records_max=records_max,
                           batch_bytes_max=100, ordered=ordered,
                           batches_in_flight_per_log_max=in_flight_max, retry_timeout_ms=30)
        futures: list[tuple[int, bytes, asyncio.Future[Lsn]]] = []
        for i, (log_id, key, size, pause) in enumerate(ops):
            data = f"{i:05d}".encode().ljust(size, b"-")
            futures.append((log_id, data, w.append(log_id, data, key=key)))
            if pause:
                await asyncio.sleep(0)
        await asyncio.wait_for(w.close(), WAIT_S)
        assert w.bytes_held == 0 and not w._tasks
        stored = [p for records in fake.logs.values() for p in records]
        assert len(stored) == len(set(stored)), "a record was stored twice"
        for log_id, data, future in futures:
            assert future.done()
            if future.exception() is None:
                assert fake.at(log_id, future.result()) == data
            else:
                assert isinstance(future.exception(), LogError)
        if ordered:
            for records in fake.logs.values():
                indexes = [int(p[:5]) for p in records]
                assert indexes == sorted(indexes), "an ordered log was reordered"

    asyncio.run(scenario())

