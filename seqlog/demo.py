"""A small end-to-end workload through the public client, used by ``seqlog demo``.

It appends single records (sequential and concurrent, with and without keys) and atomic
batches to a few fresh logs, reads every log back from the start and checks that the reader
sees exactly what was acknowledged, in LSN order, with the API's coverage rule holding.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from seqlog.client import Client
from seqlog.results import Gap, ReadResult, Record
from shared.types import LSN_OLDEST, Lsn, format_lsn

_LOG_ID_FIRST = 1_000_000
_LOG_ID_LAST = 2**40


@dataclass(slots=True, kw_only=True)
class DemoReport:
    log_ids: list[int] = field(default_factory=list)
    records_appended: int = 0
    batches_appended: int = 0
    records_read: int = 0
    gaps_read: int = 0
    problems: list[str] = field(default_factory=list)
    elapsed_ms: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def coverage_problems(from_lsn: int, result: ReadResult) -> list[str]:
    """Where ``result`` breaks the coverage rule: every LSN in ``[from_lsn, next_lsn - 1]``
    covered by exactly one record or gap, in increasing order, ``next_lsn - 1 <= release``."""
    problems: list[str] = []
    expected = from_lsn
    for entry in result.entries():
        lo, hi = (entry.lsn, entry.lsn) if isinstance(entry, Record) else (entry.lo, entry.hi)
        if lo != expected or hi < lo:
            problems.append(f"entry {lo}..{hi} where {expected} was expected")
            return problems
        expected = hi + 1
    if expected != result.next_lsn:
        problems.append(f"entries end at {expected - 1} but next_lsn is {result.next_lsn}")
    if result.next_lsn - 1 > result.release_lsn:
        problems.append(f"next_lsn {result.next_lsn} is past release_lsn {result.release_lsn}")
    return problems


Expected = dict[Lsn, tuple[bytes, str | None]]


async def _write_log(
    client: Client, log_id: int, report: DemoReport, *, singles: int, batches: int,
    batch_records: int,
) -> Expected:
    expected: Expected = {}
    for i in range(singles):
        key = f"key-{i}" if i % 2 else None
        payload = f"log {log_id} single {i}".encode()
        result = await client.append(log_id, payload, key=key)
        _expect(log_id, expected, result.lsn, payload, key, report)
    concurrent = [f"log {log_id} concurrent {i}".encode() for i in range(singles)]
    results = await asyncio.gather(*(client.append(log_id, p) for p in concurrent))
    for payload, result in zip(concurrent, results, strict=True):
        _expect(log_id, expected, result.lsn, payload, None, report)
    report.records_appended += 2 * singles
    for b in range(batches):
        payloads = [f"log {log_id} batch {b} item {i}".encode() for i in range(batch_records)]
        batch = await client.append_batch(log_id, payloads)
        if batch.count != len(payloads) or batch.last_lsn - batch.first_lsn + 1 != batch.count:
            report.problems.append(f"log {log_id}: batch {b} got {batch}")
        for i, payload in enumerate(payloads):
            _expect(log_id, expected, Lsn(batch.first_lsn + i), payload, None, report)
        report.records_appended += len(payloads)
        report.batches_appended += 1
    return expected


def _expect(
    log_id: int, expected: Expected, lsn: Lsn, payload: bytes, key: str | None,
    report: DemoReport,
) -> None:
    if lsn in expected:
        report.problems.append(f"log {log_id}: {format_lsn(lsn)} acknowledged twice")
    expected[lsn] = (payload, key)


async def _read_back(
    client: Client, log_id: int, expected: Expected, report: DemoReport, *, deadline_ms: int
) -> None:
    last_lsn = max(expected)
    next_lsn = LSN_OLDEST
    seen: dict[Lsn, Record] = {}
    deadline_s = time.monotonic() + deadline_ms / 1000
    while next_lsn <= last_lsn:
        if time.monotonic() > deadline_s:
            report.problems.append(f"log {log_id}: {format_lsn(Lsn(last_lsn))} never released")
            return
        result = await client.read(log_id, next_lsn, wait_ms=1_000)
        problems = coverage_problems(next_lsn, result)
        if problems:
            report.problems.extend(f"log {log_id}: {p}" for p in problems)
            return
        for entry in result.entries():
            if isinstance(entry, Gap):
                report.gaps_read += 1
                if entry.type in ("DATALOSS", "TRIM"):
                    report.problems.append(f"log {log_id}: unexpected {entry}")
            else:
                seen[entry.lsn] = entry
        next_lsn = max(next_lsn, result.next_lsn)
    report.records_read += len(seen)
    _compare(log_id, expected, seen, report)


def _compare(log_id: int, expected: Expected, seen: dict[Lsn, Record], report: DemoReport) -> None:
    for lsn, (payload, key) in sorted(expected.items()):
        record = seen.get(lsn)
        if record is None:
            report.problems.append(f"log {log_id}: acknowledged {format_lsn(lsn)} not read")
        elif record.payload != payload or record.key != key:
            report.problems.append(f"log {log_id}: {format_lsn(lsn)} differs: {record}")
    for lsn in sorted(set(seen) - set(expected)):
        report.problems.append(f"log {log_id}: unexpected record at {format_lsn(lsn)}")


async def run_demo(
    client: Client,
    *,
    logs_count: int = 3,
    singles_per_log: int = 10,
    batches_per_log: int = 3,
    batch_records: int = 10,
    read_deadline_ms: int = 15_000,
    seed: int | None = None,
) -> DemoReport:
    """Write to ``logs_count`` fresh logs, read everything back, report any mismatch."""
    started_s = time.monotonic()
    rng = random.Random(seed)
    report = DemoReport(
        log_ids=[rng.randrange(_LOG_ID_FIRST, _LOG_ID_LAST) for _ in range(logs_count)]
    )
    written = await asyncio.gather(
        *(
            _write_log(client, log_id, report, singles=singles_per_log,
                       batches=batches_per_log, batch_records=batch_records)
            for log_id in report.log_ids
        )
    )
    for log_id, expected in zip(report.log_ids, written, strict=True):
        await _read_back(client, log_id, expected, report, deadline_ms=read_deadline_ms)
    report.elapsed_ms = int((time.monotonic() - started_s) * 1000)
    return report
