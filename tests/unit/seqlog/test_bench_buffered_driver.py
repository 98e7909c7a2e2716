"""``loadtests.bench_buffered``'s default driver (``run_handles``) keeps its promises: never more
than ``inflight`` records unanswered, every record counted once (a latency if stored, an error
if its batch failed), payload bytes counted from what was stored."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

from loadtests.bench_buffered import Phase, run_handles
from seqlog import BufferedWriter, LogError, Status
from seqlog.results import BatchResult
from shared.types import Lsn

WAIT_S = 10.0


class CountingAppender:
    """Answers each batch a millisecond later; the second batch is refused for good."""

    def __init__(self) -> None:
        self.calls = 0
        self.next_lsn = 1

    async def append_batch(
        self, log_id: int, payloads: Iterable[bytes], *, key: str | None = None,
        producer_id: str | None = None, producer_seq: int | None = None,
        compression: str | None = None,
    ) -> BatchResult:
        items = list(payloads)
        self.calls += 1
        call = self.calls
        await asyncio.sleep(0.001)
        if call == 2:
            raise LogError(Status.INVALID_PARAM, "scripted")
        first = self.next_lsn
        self.next_lsn += len(items)
        return BatchResult(first_lsn=Lsn(first), last_lsn=Lsn(first + len(items) - 1),
                           count=len(items), timestamp_ms=1)


async def test_handles_driver_keeps_the_window_and_counts_every_record_once() -> None:
    appender = CountingAppender()
    w = BufferedWriter(appender, linger_ms=1, batch_records_max=50)
    peak = 0
    real_append = w.append_nowait

    def append(log_id: int, payload: bytes, key: str | None = None):  # type: ignore[no-untyped-def]
        nonlocal peak
        handle = real_append(log_id, payload, key)
        unanswered = w.stats.records_ok + w.stats.records_failed
        peak = max(peak, appended[0] + 1 - unanswered)
        appended[0] += 1
        return handle

    appended = [0]
    w.append_nowait = append  # type: ignore[method-assign]
    phase = Phase()
    payloads = itertools.cycle([b"x" * 10, b"y" * 20])
    await asyncio.wait_for(run_handles(w, 1000, 120, payloads, [1, 2], phase), WAIT_S)
    await w.close()
    assert appended[0] == 1000
    assert peak <= 120  # never more than the window unanswered
    failed = w.stats.records_failed
    assert failed > 0 and phase.errors == {"INVALID_PARAM": failed}
    assert len(phase.latencies_s) == 1000 - failed == w.stats.records_ok
    assert all(latency >= 0 for latency in phase.latencies_s)
    assert phase.payload_bytes == w.stats.payload_bytes_ok
