"""Driver-side planning: where each log's read starts and ends, and how it is cut into tasks.

Offsets are per-log "next LSN" values (the first LSN not yet read). An end offset is never
above ``release_lsn + 1``, so a plan covers released records only, and released records never
change (except that a trim may turn them into a TRIM gap, which the reader reports).

LSNs are dense inside an epoch (every LSN is a record, a hole or lost) but jump by up to
2**32 at an epoch boundary (a BRIDGE gap). So "at most N records" is planned as "at most N
LSNs", and a bridge is skipped by probing: a one-record read at the LSN where N LSNs end tells
whether it is a record or inside a gap, and a gap's last LSN is where the next piece starts.
That costs one small read per task or micro-batch, never a read of the data itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from seqlog import Client, LogError, Record, Status
from shared.types import LSN_OLDEST, Lsn, format_lsn, lsn_to_epoch
from spark_ingest.options import EARLIEST, LATEST, OffsetSpec, SourceOptions

CONCURRENT_CALLS_MAX = 32
"""Most tail/find-time/probe requests one planning step has in flight."""
PARTITIONS_MAX = 100_000
"""Most tasks one plan may have; more means recordsPerPartition is far too small."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LogTail:
    """A log's release pointer and trim point; (0, 0) for a log that does not exist yet."""

    release_lsn: int
    trim_lsn: int

    @property
    def end(self) -> int:
        """The highest end offset a plan may use: one past the release pointer."""
        return self.release_lsn + 1

    @property
    def earliest(self) -> int:
        return max(LSN_OLDEST, self.trim_lsn + 1)


@dataclass(frozen=True, slots=True)
class LogRange:
    """LSNs ``start_lsn .. end_lsn - 1`` of one log."""

    log_id: int
    start_lsn: int
    end_lsn: int


def new_client(options: SourceOptions) -> Client:
    return Client(list(options.urls), timeout_ms=options.timeout_ms, ca=options.ca,
                  token=options.token)


async def gather_bounded(calls: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Runs the calls with at most ``CONCURRENT_CALLS_MAX`` in flight, results in order."""
    gate = asyncio.Semaphore(CONCURRENT_CALLS_MAX)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def tails(client: Client, logs: Iterable[int]) -> dict[int, LogTail]:
    logs = list(logs)

    async def tail(log: int) -> LogTail:
        try:
            answer = await client.tail(log)
        except LogError as exc:
            if exc.status is Status.NOTFOUND:
                return LogTail(0, 0)  # not provisioned yet: empty until its first append
            raise
        return LogTail(answer.release_lsn, answer.trim_lsn)

    found = await gather_bounded([lambda log=log: tail(log) for log in logs])  # type: ignore[misc]
    return dict(zip(logs, found, strict=True))


async def starts(client: Client, options: SourceOptions,
                 log_tails: Mapping[int, LogTail]) -> dict[int, int]:
    """Each log's first LSN to read, from ``startingTimestamp`` (find-time) if given, else
    ``startingOffsets``."""
    if options.starting_timestamp_ms is not None:
        timestamp_ms = options.starting_timestamp_ms

        async def found(log: int) -> int:
            if log_tails[log].release_lsn == 0:
                return LSN_OLDEST
            return max(await client.find_time(log, timestamp_ms), log_tails[log].earliest)

        logs = list(log_tails)
        lsns = await gather_bounded([lambda log=log: found(log) for log in logs])  # type: ignore[misc]
        return dict(zip(logs, lsns, strict=True))
    return {log: _start_of(options.starting, log, tail) for log, tail in log_tails.items()}


def _start_of(spec: OffsetSpec, log: int, tail: LogTail) -> int:
    value = spec if isinstance(spec, str) else spec[log]
    if value in ("earliest", EARLIEST):
        return tail.earliest
    if value in ("latest", LATEST):
        return tail.end
    assert isinstance(value, int)
    if value > tail.end:
        raise ValueError(
            f"startingOffsets: log {log} starts at LSN {format_lsn(Lsn(value))} ({value}), "
            f"beyond its release pointer {format_lsn(Lsn(tail.release_lsn))} "
            f"({tail.release_lsn}); a reader may only start at or below release + 1")
    return value


def ends(spec: OffsetSpec, log_tails: Mapping[int, LogTail]) -> dict[int, int]:
    """Each log's end offset for a batch read: ``latest`` is release + 1; an explicit LSN
    (exclusive, as in Kafka) is clamped to release + 1."""
    chosen: dict[int, int] = {}
    for log, tail in log_tails.items():
        value = spec if isinstance(spec, str) else spec[log]
        chosen[log] = tail.end if value in ("latest", LATEST) else min(int(value), tail.end)
    return chosen


async def probe(client: Client, log: int, lsn: int) -> tuple[bool, int]:
    """Whether ``lsn`` is inside a gap, and the first LSN after the entry that holds it:
    ``lsn + 1`` for a record, the gap's last LSN + 1 for a gap (which jumps over a bridge to
    the next epoch)."""
    result = await client.read(log, lsn, limit=1)
    for entry in result.entries():
        if isinstance(entry, Record):
            if entry.lsn >= lsn:
                return False, lsn + 1
        elif entry.lo <= lsn <= entry.hi:
            return True, entry.hi + 1
    return False, lsn + 1  # nothing answered about lsn: fall back to the dense-LSN bound


async def budget_end(client: Client, log: int, start: int, end: int, records_max: int) -> int:
    """The end of a range from ``start`` that holds at most ``records_max`` records, at most
    ``end``. Only an epoch boundary or gap at the cut makes it reach further than
    ``start + records_max``."""
    if end - start <= records_max:
        return end
    if lsn_to_epoch(Lsn(start)) != lsn_to_epoch(Lsn(end - 1)):
        # A range that starts in a bridge (the start of a log, or a batch that ended with an
        # epoch's last record) skips it first, so that its records fill the budget.
        in_gap, after = await probe(client, log, start)
        if in_gap:
            start = min(after, end)
            if end - start <= records_max:
                return end
    return min((await probe(client, log, start + records_max - 1))[1], end)


async def cut(client: Client, log: int, start: int, end: int,
              records_max: int) -> list[LogRange]:
    """``start .. end - 1`` as consecutive ranges of at most ``records_max`` records each."""
    pieces: list[LogRange] = []
    cursor = start
    while cursor < end:
        if len(pieces) >= PARTITIONS_MAX:
            raise ValueError(f"log {log}: more than {PARTITIONS_MAX} partitions from "
                             f"{cursor}; raise recordsPerPartition")
        following = await budget_end(client, log, cursor, end, records_max)
        pieces.append(LogRange(log, cursor, following))
        cursor = following
    return pieces


async def cut_all(client: Client, spans: Iterable[LogRange], records_max: int) -> list[LogRange]:
    """Every non-empty span cut into task-sized ranges, logs probed concurrently."""
    todo = [s for s in spans if s.end_lsn > s.start_lsn]
    found = await gather_bounded(
        [lambda s=s: cut(client, s.log_id, s.start_lsn, s.end_lsn, records_max)  # type: ignore[misc]
         for s in todo])
    return [piece for pieces in found for piece in pieces]


def share_budget(records_max: int, starts_at: Mapping[int, int],
                 ends_at: Mapping[int, int]) -> dict[int, int]:
    """Splits a micro-batch's record budget over the logs that have something to read.

    A log whose range stays inside one epoch holds at most ``end - start`` records and gets
    no more than that; the rest is shared equally (water-filling), so the shares add up to at
    most ``records_max`` and every log with data gets at least one while the budget lasts."""
    wanting = {log: ends_at[log] - starts_at[log] for log in ends_at
               if ends_at[log] > starts_at.get(log, ends_at[log])}
    # Across an epoch boundary the LSN distance says nothing about the record count.
    need = {log: (span if lsn_to_epoch(Lsn(starts_at[log])) ==
                  lsn_to_epoch(Lsn(ends_at[log] - 1)) else None)
            for log, span in wanting.items()}
    shares: dict[int, int] = {}
    left = records_max
    open_logs = sorted(need)
    while open_logs and left > 0:
        equal = max(left // len(open_logs), 1)
        small = [log for log in open_logs if need[log] is not None and need[log] <= equal]  # type: ignore[operator]
        if not small:
            for log in open_logs:
                if left <= 0:
                    break
                shares[log] = min(equal, left)
                left -= shares[log]
            break
        for log in small:
            shares[log] = need[log]  # type: ignore[assignment]
            left -= need[log]  # type: ignore[operator]
        open_logs = [log for log in open_logs if log not in shares]
    return shares


async def budget_ends(client: Client, starts_at: Mapping[int, int], ends_at: Mapping[int, int],
                      records_max: int) -> dict[int, int]:
    """End offsets that keep a micro-batch at or below ``records_max`` records in total."""
    shares = share_budget(records_max, starts_at, ends_at)
    logs = list(shares)
    found = await gather_bounded(
        [lambda log=log: budget_end(client, log, starts_at[log], ends_at[log],  # type: ignore[misc]
                                    shares[log]) for log in logs])
    limited = {log: starts_at.get(log, ends_at[log]) for log in ends_at}
    limited.update(zip(logs, found, strict=True))
    return limited
