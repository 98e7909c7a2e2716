"""The buffered writer: many small appends sent as few atomic append-batches (LogDevice's
``BufferedWriter``, Kafka's record accumulator).

``w.append(log, payload, key)`` puts the record into its log's *building* batch (one per log and
key; with ``ordered=True`` one per log) and returns a future; ``w.append_nowait(...)`` does the
same and returns an ``AppendHandle`` instead (Kafka's ``FutureRecordMetadata``: a reference to
the batch plus the record's index in it), which costs one small object per record and nothing
per record when the batch is answered. A building batch is sealed when it holds
``batch_records_max`` records or ``batch_bytes_max`` payload bytes, or when its oldest record
has waited ``linger_ms`` (one timer per writer, armed for the oldest building batch). A sealed
batch is one ``append_batch`` call: the cluster writes it with consecutive LSNs, so record *i*
gets ``first_lsn + i``, and all of the batch's futures and handles are answered from its one
ack. Tasks, timers and retries are per batch.

Delivery:

- Every batch carries the writer's producer pair (a fresh ``producer_id`` per writer, one
  ``producer_seq`` per batch, numbered in the order batches are first sent), so a retry after
  an unknown outcome, also through another sequencer after a failover, cannot write twice
  (docs/API-EXTENSIONS.md, "Idempotent appends"). A batch is retried while its error is
  retryable (``Status.retryable``) and it is younger than ``retry_timeout_ms``; then its
  records' futures fail with the ``LogError``.
- ``ordered=False`` (LogDevice's INDEPENDENT): up to ``batches_in_flight_per_log_max`` batches
  of a log are in flight; a retried batch may land after a later one.
- ``ordered=True`` (ONE_AT_A_TIME): one batch per log in flight, so records are stored in the
  order they were appended, retries and failovers included. A key change seals the log's
  building batch (one building batch per log keeps the order across keys). While a batch is in
  flight the next one keeps growing past its linger (up to its size triggers). When a batch
  fails for good, the log's later records fail with it without being sent: nothing appended
  after a lost record is stored ahead of a retry of it.
- Memory: past ``memory_bytes_max`` payload bytes buffered or in flight, ``append`` fails at
  once with ``SEQNOBUFS`` and buffers nothing.
- A record bigger than ``batch_bytes_max`` travels in a batch of its own, so with
  ``batch_bytes_max`` at most the cluster's ``payload_bytes_max`` (1 MiB by default) a record
  the cluster refuses as ``TOOBIG`` fails alone.
- Compression (``"lz4"``/``"zstd"``) is per batch and kept only when it shrinks the batch
  (``shared.compression``); readers see plain payloads.

Cancelling an ``await w.append(...)`` does not take the record out of its batch: like a
cancelled ``Client.append``, its outcome is then unknown. ``flush()`` sends every building
batch and waits until all batches sent so far are answered; ``close()`` (and leaving
``async with``) flushes and refuses further appends.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections import deque
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypedDict

from seqlog.results import BatchResult
from shared.compression import CODEC_NAMES
from shared.limits import BATCH_RECORDS_MAX, KEY_BYTES_MAX, PRODUCER_SEQS_KEPT
from shared.status import LogError, Status
from shared.types import Lsn, log_id_valid

_log = logging.getLogger(__name__)

BATCHES_IN_FLIGHT_PER_LOG_MAX = 8
"""Default bound on the batches of one log in flight with ``ordered=False``. It is counted as
the span of their send order (oldest unanswered to newest), and must stay below
``PRODUCER_SEQS_KEPT`` so that the cluster still remembers the pair of every batch that may be
retried (an older pair would be refused with ``STALE``)."""

assert BATCHES_IN_FLIGHT_PER_LOG_MAX < PRODUCER_SEQS_KEPT

TIMER_SLACK_S = 0.0002
"""Batches due this soon after a timer tick are sealed by it rather than by another tick."""

RETRY_BACKOFF_MS_MIN = 10
RETRY_BACKOFF_MS_MAX = 1_000


class BatchAppender(Protocol):
    """What the writer needs of ``seqlog.Client``."""

    async def append_batch(
        self, log_id: int, payloads: Iterable[bytes], *, key: str | None = None,
        producer_id: str | None = None, producer_seq: int | None = None,
        compression: str | None = None,
    ) -> BatchResult: ...


class BufferedWriterOptions(TypedDict, total=False):
    """The keyword options of ``BufferedWriter`` (and ``Client.buffered_writer``)."""

    linger_ms: float
    batch_records_max: int
    batch_bytes_max: int
    compression: str | None
    ordered: bool
    memory_bytes_max: int
    batches_in_flight_per_log_max: int
    retry_timeout_ms: int


@dataclass(slots=True)
class WriterStats:
    """Counters of one writer, per batch (for benchmarks and monitoring)."""

    batches_sent: int = 0
    """``append_batch`` calls, retries included."""
    batches_ok: int = 0
    batches_failed: int = 0
    records_ok: int = 0
    records_failed: int = 0
    payload_bytes_ok: int = 0
    retries: int = 0


class _Batch:
    __slots__ = ("deadline", "due", "error", "first_lsn", "futures", "key", "log", "nbytes",
                 "payloads", "sealed", "send_index", "seq", "slot", "waiter")

    def __init__(self, log: _Log, key: str | None, slot: str | None, deadline: float) -> None:
        self.log = log
        self.key = key
        self.slot = slot
        """Its key in ``log.building``."""
        self.deadline = deadline
        """When its oldest record has waited ``linger_ms`` (loop time)."""
        self.payloads: list[bytes] = []
        self.futures: list[tuple[int, asyncio.Future[Lsn]]] = []
        """The futures of the records added with ``append``, by their index in the batch
        (``append_nowait``'s records have none: their handles read the batch's outcome)."""
        self.nbytes = 0
        self.sealed = False
        self.due = False
        """Past its deadline but held back because its log had no room in flight."""
        self.seq = -1
        """``producer_seq``, given when it is first sent."""
        self.send_index = -1
        self.first_lsn = -1
        """The LSN of its first record once the batch is stored (record *i* has
        ``first_lsn + i``)."""
        self.error: LogError | None = None
        """Why its records failed, once they did."""
        self.waiter: asyncio.Future[None] | None = None
        """Resolved when the batch is answered (or abandoned); created only when someone
        waits: ``flush``, or an ``await`` of a handle of an unanswered batch."""

    def get_waiter(self) -> asyncio.Future[None]:
        waiter = self.waiter
        if waiter is None:
            waiter = self.waiter = asyncio.get_running_loop().create_future()
            if self.first_lsn >= 0 or self.error is not None:
                waiter.set_result(None)
        return waiter


class AppendHandle:
    """The pending outcome of one record added with ``BufferedWriter.append_nowait``: ``lsn =
    await handle`` (or ``handle.result()`` once ``handle.done()``).

    Not an ``asyncio.Future``: like the record future of Kafka's producer it is only a
    reference to its batch and its index in it (LSN = the batch's first LSN + index), so a
    record costs one small object, and nothing per record happens when its batch is answered.
    A failed record's error is kept on the batch and never logged as "never retrieved".
    ``asyncio.gather``/``wait_for`` take it as any awaitable (wrapping it in a Task)."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        batch = self._batch
        return batch.first_lsn >= 0 or batch.error is not None

    def result(self) -> Lsn:
        """The record's LSN; raises its batch's ``LogError`` if it failed, and
        ``asyncio.InvalidStateError`` while it is pending."""
        batch = self._batch
        if batch.first_lsn >= 0:
            return batch.first_lsn + self._index  # type: ignore[return-value]
        if batch.error is not None:
            # One error object serves the whole batch: no traceback piling up across raises.
            raise batch.error.with_traceback(None)
        raise asyncio.InvalidStateError("the record's batch is not answered yet")

    def exception(self) -> LogError | None:
        """None if the record is stored, its ``LogError`` if it failed; raises
        ``asyncio.InvalidStateError`` while it is pending."""
        batch = self._batch
        if batch.first_lsn >= 0:
            return None
        if batch.error is not None:
            return batch.error
        raise asyncio.InvalidStateError("the record's batch is not answered yet")

    def __await__(self) -> Generator[Any, None, Lsn]:
        batch = self._batch
        if batch.first_lsn < 0 and batch.error is None:
            yield from batch.get_waiter().__await__()
            if batch.first_lsn < 0 and batch.error is None:  # never: every end sets one
                raise LogError(Status.INTERNAL, "the record's batch ended without an outcome")
        return self.result()


class _Log:
    __slots__ = ("building", "in_flight", "log_id", "queue", "sends")

    def __init__(self, log_id: int) -> None:
        self.log_id = log_id
        self.building: dict[str | None, _Batch] = {}
        self.queue: deque[_Batch] = deque()
        """Sealed batches waiting for room in flight, in seal order."""
        self.in_flight: dict[int, _Batch] = {}
        """By send index (this log's count of batches sent before it)."""
        self.sends = 0


class BufferedWriter:
    """``async with client.buffered_writer(linger_ms=5) as w: lsn = await w.append(7, b"x")``.

    Create it with a running event loop; use it from that loop only.
    """

    def __init__(
        self,
        client: BatchAppender,
        *,
        linger_ms: float = 5,
        batch_records_max: int = 1_000,
        batch_bytes_max: int = 1024 * 1024,
        compression: str | None = None,
        ordered: bool = False,
        memory_bytes_max: int = 64 * 1024 * 1024,
        batches_in_flight_per_log_max: int = BATCHES_IN_FLIGHT_PER_LOG_MAX,
        retry_timeout_ms: int = 30_000,
    ) -> None:
        if linger_ms < 0 or retry_timeout_ms < 0:
            raise ValueError("linger_ms and retry_timeout_ms must be >= 0")
        if not 1 <= batch_records_max <= BATCH_RECORDS_MAX:
            raise ValueError(f"batch_records_max must be in 1..{BATCH_RECORDS_MAX}")
        if batch_bytes_max < 1 or memory_bytes_max < batch_bytes_max:
            raise ValueError("batch_bytes_max must be >= 1 and <= memory_bytes_max")
        if not 1 <= batches_in_flight_per_log_max < PRODUCER_SEQS_KEPT:
            raise ValueError(
                f"batches_in_flight_per_log_max must be in 1..{PRODUCER_SEQS_KEPT - 1}")
        if compression is not None and compression not in CODEC_NAMES:
            raise ValueError(f"compression must be None or one of {sorted(CODEC_NAMES)}")
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._linger_s = linger_ms / 1000
        self._records_max = batch_records_max
        self._bytes_max = batch_bytes_max
        self._compression = compression
        self._ordered = ordered
        self._memory_max = memory_bytes_max
        self._in_flight_max = 1 if ordered else batches_in_flight_per_log_max
        self._retry_timeout_s = retry_timeout_ms / 1000
        self._producer_id = f"bw-{uuid.uuid4().hex}"
        # One counter across logs: each log sees increasing (not consecutive) seqs, which is
        # all the cluster asks, and a log's state can be dropped when it is idle.
        self._next_seq = 0
        self._logs: dict[int, _Log] = {}
        self._timeline: deque[_Batch] = deque()
        """Building batches in creation (so deadline) order; sealed ones are skipped lazily."""
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._bytes_held = 0
        self._closed = False
        self._rng = random.Random()
        self.stats = WriterStats()

    # -- public API ---------------------------------------------------------------------

    async def __aenter__(self) -> BufferedWriter:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def bytes_held(self) -> int:
        """Payload bytes buffered or in flight (bounded by ``memory_bytes_max``)."""
        return self._bytes_held

    @property
    def producer_id(self) -> str:
        return self._producer_id

    def append(self, log_id: int, payload: bytes, key: str | None = None
               ) -> asyncio.Future[Lsn]:
        """``lsn = await w.append(log, payload)``: the future of the record's LSN, resolved
        once its batch is stored on R storage nodes, or failed with the ``LogError`` its batch
        failed with. Raises ``LogError`` at once (nothing buffered) with ``SEQNOBUFS`` past
        the memory bound, ``SHUTDOWN`` once closed, ``INVALID_PARAM`` for bad arguments.

        A plain method returning a future, not a coroutine: a record costs no frame or Task.
        If nobody awaits a future that fails, asyncio logs the unretrieved exception. Callers
        that fire many appends pay less per record with ``append_nowait``."""
        handle = self.append_nowait(log_id, payload, key)
        future: asyncio.Future[Lsn] = self._loop.create_future()
        # The batch cannot be answered before this returns: sealing it only schedules a Task.
        handle._batch.futures.append((handle._index, future))
        return future

    def append_nowait(self, log_id: int, payload: bytes, key: str | None = None
                      ) -> AppendHandle:
        """``append`` for callers that fire many appends and look at the outcomes later
        (``await handle``, ``handle.result()``, or just ``flush()`` and ``stats``): returns
        an ``AppendHandle``, a reference to the record's place in its batch, instead of a
        future. Same errors, raised at once, as ``append``."""
        # The hot path of every record: checks first, each attribute read once.
        if type(payload) is not bytes:
            payload = _as_bytes(payload)
        size = len(payload)
        held = self._bytes_held + size
        if held > self._memory_max or self._closed:
            raise self._refusal(size)
        if key is not None and (type(key) is not str or len(key) > KEY_BYTES_MAX):
            raise LogError(Status.INVALID_PARAM, f"key must be a str of at most "
                           f"{KEY_BYTES_MAX} characters or None")
        # ``type(log_id) is int`` also keeps 1.0 and True from finding log 1.
        log = self._logs.get(log_id) if type(log_id) is int else None
        if log is None:
            log = self._log(log_id)
        slot = None if self._ordered else key
        batch = log.building.get(slot)
        if batch is not None and (batch.key != key or batch.nbytes + size > self._bytes_max):
            self._seal(batch)
            batch = None
        if batch is None:
            batch = self._open(log, key, slot)
        payloads = batch.payloads
        payloads.append(payload)
        count = len(payloads)
        batch.nbytes += size
        self._bytes_held = held
        if count >= self._records_max or batch.nbytes >= self._bytes_max:
            self._seal(batch)
        return AppendHandle(batch, count - 1)

    def _refusal(self, size: int) -> LogError:
        if self._closed:
            return LogError(Status.SHUTDOWN, "the buffered writer is closed")
        return LogError(Status.SEQNOBUFS, f"the writer holds {self._bytes_held} bytes; "
                        f"{size} more would pass memory_bytes_max={self._memory_max}")

    async def flush(self) -> None:
        """Send every building batch and wait until every batch sent so far is answered (its
        futures resolved or failed). Raises only if cancelled; the writer stays usable."""
        for log in list(self._logs.values()):
            for batch in list(log.building.values()):
                self._seal(batch)
        waiters = [b.get_waiter() for log in self._logs.values()
                   for b in (*log.queue, *log.in_flight.values())]
        if waiters:
            await asyncio.wait(waiters)

    async def close(self) -> None:
        """Flush, then refuse further appends. If cancelled (or failing) meanwhile, batches
        still unanswered are abandoned: never-sent ones fail with ``SHUTDOWN`` (nothing
        written), in-flight ones with ``TIMEDOUT`` (outcome unknown)."""
        self._closed = True
        clean = False
        try:
            await self.flush()
            clean = True
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timeline.clear()  # every batch in it is sealed by now
            if not clean:
                self._abort()

    # -- batching -----------------------------------------------------------------------

    def _log(self, log_id: int) -> _Log:
        if type(log_id) is not int or not log_id_valid(log_id):
            raise LogError(Status.INVALID_PARAM, f"log id must be an int in 1..2**62-1: "
                           f"{log_id!r}")
        log = self._logs[log_id] = _Log(log_id)
        return log

    def _open(self, log: _Log, key: str | None, slot: str | None) -> _Batch:
        deadline = self._loop.time() + self._linger_s
        batch = log.building[slot] = _Batch(log, key, slot, deadline)
        self._timeline.append(batch)
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._on_timer)
        return batch

    def _on_timer(self) -> None:
        self._timer = None
        now = self._loop.time() + TIMER_SLACK_S
        timeline = self._timeline
        while timeline:
            batch = timeline[0]
            if batch.sealed:
                timeline.popleft()
            elif batch.deadline <= now:
                timeline.popleft()
                if self._room(batch.log):
                    self._seal(batch)
                else:
                    # Relaxed trigger (ONE_AT_A_TIME): it keeps filling until its log has
                    # room, when ``_pump`` seals it.
                    batch.due = True
            else:
                self._timer = self._loop.call_at(batch.deadline, self._on_timer)
                break

    def _room(self, log: _Log) -> bool:
        """Whether a batch of ``log`` may be sent now: nothing queued ahead of it and its
        in-flight span under the bound."""
        if log.queue:
            return False
        return not log.in_flight or log.sends - min(log.in_flight) < self._in_flight_max

    def _seal(self, batch: _Batch) -> None:
        log = batch.log
        del log.building[batch.slot]
        batch.sealed = True
        if self._room(log):
            self._send(batch)
        else:
            log.queue.append(batch)

    def _pump(self, log: _Log) -> None:
        """Send what ``log`` has waiting, as far as the in-flight bound allows."""
        while log.queue:
            if log.in_flight and log.sends - min(log.in_flight) >= self._in_flight_max:
                return
            self._send(log.queue.popleft())
        for batch in [b for b in log.building.values() if b.due]:
            if not self._room(log):
                return
            self._seal(batch)

    # -- sending ------------------------------------------------------------------------

    def _send(self, batch: _Batch) -> None:
        log = batch.log
        batch.seq = self._next_seq
        self._next_seq += 1
        batch.send_index = log.sends
        log.sends += 1
        log.in_flight[batch.send_index] = batch
        task = self._loop.create_task(self._write(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, batch: _Batch) -> None:
        """Append the batch, retrying while that is safe and useful, then answer its records.
        Every path ends in ``_finish``, so no future is left unresolved."""
        log = batch.log
        give_up_at = self._loop.time() + self._retry_timeout_s
        attempt = 0
        try:
            while True:
                self.stats.batches_sent += 1
                try:
                    result = await self._client.append_batch(
                        log.log_id, batch.payloads, key=batch.key,
                        producer_id=self._producer_id, producer_seq=batch.seq,
                        compression=self._compression)
                except LogError as exc:
                    backoff_s = self._backoff_s(attempt)
                    if (not exc.status.retryable
                            or self._loop.time() + backoff_s > give_up_at):
                        self._fail(batch, exc)
                        return
                    self.stats.retries += 1
                    attempt += 1
                    await asyncio.sleep(backoff_s)
                    continue
                count = len(batch.payloads)
                if result.count != count or result.last_lsn - result.first_lsn + 1 != count:
                    self._fail(batch, LogError(
                        Status.BADMSG, f"a batch of {count} got {result.count} LSNs "
                        f"{result.first_lsn}..{result.last_lsn}"))
                    return
                self._succeed(batch, result.first_lsn)
                return
        except asyncio.CancelledError:
            self._fail(batch, LogError(Status.TIMEDOUT, "the writer was closed with the batch "
                                       "in flight; the outcome is unknown"))
            raise
        except Exception as exc:
            # A bug, not an answer: the records' outcome is unknown; never leave them hanging.
            _log.exception("buffered writer: appending a batch of log %s failed", log.log_id)
            self._fail(batch, LogError(Status.INTERNAL, f"{exc!r}; the outcome is unknown"))
        finally:
            self._finish(batch)

    def _backoff_s(self, attempt: int) -> float:
        backoff_ms = min(RETRY_BACKOFF_MS_MAX, RETRY_BACKOFF_MS_MIN << min(attempt, 16))
        return backoff_ms * self._rng.uniform(0.5, 1.0) / 1000

    def _succeed(self, batch: _Batch, first_lsn: int) -> None:
        batch.first_lsn = first_lsn
        # Plain ints (an ``Lsn`` is one): calling the NewType would cost a call per record.
        for index, future in batch.futures:
            if not future.done():  # a caller cancelled its await
                future.set_result(first_lsn + index)  # type: ignore[arg-type]
        stats = self.stats
        stats.batches_ok += 1
        stats.records_ok += len(batch.payloads)
        stats.payload_bytes_ok += batch.nbytes

    def _fail(self, batch: _Batch, exc: LogError) -> None:
        _fail_records(batch, exc)
        self.stats.batches_failed += 1
        self.stats.records_failed += len(batch.payloads)
        if self._ordered:
            # Nothing appended after a lost record may be stored before a retry of it.
            log = batch.log
            later = [*log.queue, *log.building.values()]
            log.queue.clear()
            log.building.clear()
            cause = LogError(exc.status, f"not sent: an earlier batch of log {log.log_id} "
                             f"failed ({exc.message})")
            for other in later:
                other.sealed = True
                _fail_records(other, cause)
                self.stats.records_failed += len(other.payloads)
                self._release(other)

    def _finish(self, batch: _Batch) -> None:
        log = batch.log
        del log.in_flight[batch.send_index]
        self._release(batch)
        self._pump(log)
        if not (log.in_flight or log.queue or log.building) and self._logs.get(
                log.log_id) is log:
            del self._logs[log.log_id]

    def _release(self, batch: _Batch) -> None:
        self._bytes_held -= batch.nbytes
        batch.nbytes = 0
        # The timeline may hold the batch until the next tick: drop the records now.
        batch.payloads = []
        batch.futures = []
        if batch.first_lsn < 0 and batch.error is None:  # never: every end sets one
            batch.error = LogError(Status.INTERNAL, "the batch ended without an outcome")
        if batch.waiter is not None and not batch.waiter.done():
            batch.waiter.set_result(None)

    def _abort(self) -> None:
        """Give up on everything unanswered (``close`` was cancelled or failed)."""
        cause = LogError(Status.SHUTDOWN, "the buffered writer was closed before this record "
                         "was sent; nothing was written")
        for log in list(self._logs.values()):
            for batch in [*log.queue, *log.building.values()]:
                batch.sealed = True
                _fail_records(batch, cause)
                self._release(batch)
            log.queue.clear()
            log.building.clear()
        for task in list(self._tasks):
            task.cancel()


def _fail_records(batch: _Batch, exc: LogError) -> None:
    """Fail every record of ``batch``: its handles see ``batch.error``, its futures get it."""
    batch.error = exc
    for _, future in batch.futures:
        if not future.done():
            future.set_exception(exc)


def _as_bytes(payload: object) -> bytes:
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    raise LogError(Status.INVALID_PARAM, f"payload must be bytes, not {type(payload).__name__}")

