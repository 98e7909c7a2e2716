"""A log reader that reads straight from the storage nodes, as LogDevice's client does.

It asks one node over HTTP where the log lives (``GET /v1/logs/{id}/nodesets``), then sends
READs over the node transport (HELLO as ``client.*``, which may only read) to every node of
the nodeset that holds the next LSN, one ``ReadRound`` at a time: the same rounds and merge as
the HTTP ``records`` endpoint, so both show the same log. That gives:

- records and gaps in LSN order, each LSN once, copies deduplicated by precedence;
- a gap decided only once an f-majority of the nodeset answered; with fewer, the reader waits
  and asks again (and raises ``NOTREADY`` after ``stall_timeout_ms`` without progress);
- ``DATALOSS`` only for released LSNs that no f-majority member holds;
- tailing by long poll on the storage nodes (their release pointer), not on the sequencer;
- speculative reads: a slow node delays a round by ``speculative_delay_ms``, not its latency;
- read-ahead into a buffer bounded by records and bytes;
- epochs followed across nodeset spans (each span is read from its own nodeset).

Use it through ``Client.reader``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from ssl import SSLContext
from types import TracebackType
from typing import Any

from seqlog.results import Gap, ReadResult, Record
from shared.config import TransportConfig
from shared.net.pool import PeerPool
from shared.net.read_driver import run_round
from shared.read_merge import Merged
from shared.read_round import NodesetSpan, ReadRound, RoundResult, beyond_spans, span_of
from shared.status import LogError, Status
from shared.types import CLIENT_ID_PREFIX, Epoch, LogId, Lsn, NodeId, lsn_valid

Entry = Record | Gap
READ_REQUEST_TIMEOUT_MS = 5_000
"""How long one node may take to answer a READ (beyond its long-poll wait)."""
RETRY_MS_MIN, RETRY_MS_MAX = 20, 1_000
SPANS_REFRESH_MS = 2_000
"""While rounds fall short of an f-majority, the nodesets are fetched again at most this
often: a drained node may have left a span since the reader was made (issue 17)."""

Spans = tuple[list[NodesetSpan], Mapping[NodeId, tuple[str, int]]]
"""Backoff between rounds that could not reach an f-majority."""
IDLE_MS = 10
"""Pause before asking again when a round brought nothing new without waiting."""


def parse_nodesets(answer: Mapping[str, Any]) -> tuple[list[NodesetSpan],
                                                       dict[NodeId, tuple[str, int]], str]:
    """Spans, transport addresses and the cluster fingerprint from a nodesets answer."""
    try:
        spans: list[NodesetSpan] = []
        addresses: dict[NodeId, tuple[str, int]] = {}
        for item in answer["nodesets"]:
            nodes = []
            for node in item["nodes"]:
                node_id = NodeId(str(node["node_id"]))
                # A member the answering node has no address for still counts in the
                # nodeset (for the f-majority); the reader just cannot reach it.
                if node["data"]:
                    host, _, port = str(node["data"]).rpartition(":")
                    addresses[node_id] = (host, int(port))
                nodes.append(node_id)
            spans.append(NodesetSpan(
                first_epoch=Epoch(int(item["first_epoch"])),
                last_epoch=Epoch(int(item["last_epoch"])), nodeset=tuple(nodes),
                replication_factor=int(item["replication_factor"])))
        fingerprint = str(answer["cluster_fingerprint"])
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise LogError(Status.BADMSG, f"malformed nodesets answer: {exc!r}") from exc
    if not spans:
        raise LogError(Status.BADMSG, "the log has no nodeset")
    return spans, addresses, fingerprint


def nodesets_release_lsn(answer: Mapping[str, Any]) -> Lsn:
    """The release pointer a nodesets answer carries (0 from nodes that predate it)."""
    release = answer.get("release_lsn", 0)
    if type(release) is not int or not lsn_valid(release):
        raise LogError(Status.BADMSG, f"malformed nodesets answer: release_lsn {release!r}")
    return Lsn(release)


def entries_of(merged: Merged) -> list[Entry]:
    """A merged round as the client's records and gaps, in LSN order."""
    return ReadResult(
        records=[Record(lsn=Lsn(r[0]), timestamp_ms=r[1], key=r[2], payload=r[3])
                 for r in merged.records],
        gaps=[Gap(type=g.kind, lo=g.lo, hi=g.hi) for g in merged.gaps]).entries()


class LogReader:
    """Async iterator of a log's records and gaps from ``from_lsn`` on; see the module doc.

    Without ``follow`` it stops once it has delivered everything released when it caught up;
    with ``follow`` it tails for ever. ``until_lsn`` stops it after that LSN either way."""

    def __init__(
        self, *, log_id: LogId, from_lsn: Lsn, spans: list[NodesetSpan],
        addresses: Mapping[NodeId, tuple[str, int]], cluster_fingerprint: str,
        follow: bool = False, until_lsn: Lsn | None = None,
        read_ahead_records_max: int = 10_000, read_ahead_bytes_max: int = 32 * 1024 * 1024,
        round_records_max: int = 1_000, wait_ms: int = 5_000, speculative_delay_ms: int = 20,
        stall_timeout_ms: int = 60_000, release_lsn: int = 0, ssl: SSLContext | None = None,
        token: str = "", refresh: Callable[[], Awaitable[Spans]] | None = None,
    ) -> None:
        if not lsn_valid(from_lsn) or from_lsn < 1 or min(
                read_ahead_records_max, read_ahead_bytes_max, round_records_max) < 1:
            raise LogError(Status.INVALID_PARAM, "bad from_lsn or read-ahead limits")
        self.log_id = log_id
        self._spans = spans
        self._refresh = refresh
        self._refreshed_s = 0.0
        self._addresses = dict(addresses)
        self._follow = follow
        self._until_lsn = until_lsn
        self._records_max = read_ahead_records_max
        self._bytes_max = read_ahead_bytes_max
        self._round_records_max = min(round_records_max, read_ahead_records_max)
        self._wait_ms = wait_ms
        self._speculative_delay_ms = speculative_delay_ms
        self._stall_timeout_ms = stall_timeout_ms
        self._cursor = from_lsn
        # Known released when the reader was made (the nodesets answer): every READ carries it,
        # and storage nodes honour it, so a record acknowledged before is seen even by a node
        # whose RELEASE is still on its way.
        self._release = Lsn(release_lsn)
        self._buffer: collections.deque[Entry] = collections.deque()
        self._buffered_bytes = 0
        self._has_data = asyncio.Event()
        self._has_space = asyncio.Event()
        self._has_space.set()
        self._done = False
        self._error: Exception | None = None
        self.rounds_count = 0
        self.short_rounds_count = 0
        """Rounds that could not reach an f-majority (the reader waited instead)."""
        self._pool = PeerPool(
            node_id=NodeId(f"{CLIENT_ID_PREFIX}{os.urandom(6).hex()}"),
            cluster_fingerprint=cluster_fingerprint, config=TransportConfig(),
            addresses=self._addresses.get, client_ssl=ssl, token=token)
        self._task: asyncio.Task[None] | None = None
        # Readers start at different nodes, so that catch-up reads spread over the copies.
        nodes = list(dict.fromkeys(n for span in spans for n in span.nodeset))
        self._order: list[NodeId] = random.sample(nodes, len(nodes))

    @property
    def next_lsn(self) -> Lsn:
        """The next LSN the reader will fetch (entries before it may still be buffered)."""
        return self._cursor

    @property
    def release_lsn(self) -> Lsn:
        return self._release

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    @property
    def buffered_count(self) -> int:
        """Entries fetched ahead and not yet taken (at most ``read_ahead_records_max``)."""
        return len(self._buffer)

    def __aiter__(self) -> LogReader:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __anext__(self) -> Entry:
        self.__aiter__()
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            self._has_data.clear()
            await self._has_data.wait()
        entry = self._buffer.popleft()
        if isinstance(entry, Record):
            self._buffered_bytes -= len(entry.payload)
        if len(self._buffer) < self._records_max and self._buffered_bytes < self._bytes_max:
            self._has_space.set()
        return entry

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._pool.close()

    # ---- the fetching task ----

    async def _run(self) -> None:
        try:
            await self._fetch()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the consumer, who raises it
            self._error = exc
        finally:
            self._done = True
            self._has_data.set()

    async def _fetch(self) -> None:
        loop = asyncio.get_running_loop()
        retry_ms = RETRY_MS_MIN
        progress_s = loop.time()
        while not self._finished():
            await self._has_space.wait()
            if beyond_spans(self._spans, self._cursor):
                # An epoch handed out after the spans were fetched: its nodeset may have
                # grown, so it is read only once the spans cover it (``metadata_spans``).
                await self._refresh_spans(loop.time(), force=True)
                if beyond_spans(self._spans, self._cursor):
                    if (loop.time() - progress_s) * 1000 > self._stall_timeout_ms:
                        raise LogError(Status.NOTREADY, (
                            f"log {self.log_id}: no nodeset known for LSN {self._cursor}"))
                    await asyncio.sleep(retry_ms / 1000)
                    retry_ms = min(retry_ms * 2, RETRY_MS_MAX)
                    continue
            result = await self._round()
            self.rounds_count += 1
            self._release = Lsn(max(self._release, result.release_lsn))
            if result.end == "SHORT":
                self.short_rounds_count += 1
                if (loop.time() - progress_s) * 1000 > self._stall_timeout_ms:
                    failures = ", ".join(f"{n} {s.name}" for n, s in result.failures)
                    raise LogError(Status.NOTREADY, (
                        f"log {self.log_id}: {result.answered} storage nodes answered, "
                        f"{result.needed} needed to read on without skipping ({failures})"))
                await self._refresh_spans(loop.time())
                await asyncio.sleep(retry_ms / 1000)
                retry_ms = min(retry_ms * 2, RETRY_MS_MAX)
                continue
            retry_ms = RETRY_MS_MIN
            if result.merged is None:
                continue  # RELEASE_MOVED: ask again at once with the newer pointer
            progress_s = loop.time()
            if result.merged.next_lsn > self._cursor:
                self._deliver(entries_of(result.merged))
                self._cursor = result.merged.next_lsn
            elif self._cursor > self._release and not self._follow:
                return  # caught up with everything released
            elif self._cursor <= self._release or self._wait_ms == 0:
                await asyncio.sleep(IDLE_MS / 1000)

    async def _refresh_spans(self, now_s: float, *, force: bool = False) -> None:
        """Fetch the nodesets again (at most every ``SPANS_REFRESH_MS`` unless ``force``: the
        cursor passed the last span): spans made before a drain still count the drained
        node, which may be gone now. Failures keep the spans (they stay correct: a span only
        ever loses nodes whose copies are elsewhere)."""
        if self._refresh is None or (
                not force and (now_s - self._refreshed_s) * 1000 < SPANS_REFRESH_MS):
            return
        self._refreshed_s = now_s
        try:
            spans, addresses = await self._refresh()
        except (TimeoutError, LogError, OSError):
            return
        if not spans:
            return
        self._spans = spans
        self._addresses.update(addresses)
        fresh = dict.fromkeys(n for span in spans for n in span.nodeset)
        self._order = [*(n for n in self._order if n in fresh),
                       *(n for n in fresh if n not in self._order)]

    def _finished(self) -> bool:
        return self._until_lsn is not None and self._cursor > self._until_lsn

    async def _round(self) -> RoundResult:
        span = span_of(self._spans, self._cursor)
        space = self._records_max - len(self._buffer)
        # Long-poll only when tailing and nothing past the cursor is known to be released.
        wait_ms = self._wait_ms if self._follow and self._release < self._cursor else 0
        read_round = ReadRound(
            log_id=self.log_id, span=span, from_lsn=self._cursor, release_lsn=self._release,
            records_max=max(1, min(self._round_records_max, space)),
            bytes_max=max(1, self._bytes_max - self._buffered_bytes), wait_ms=wait_ms,
            speculative_delay_ms=self._speculative_delay_ms,
            started_ms=int(asyncio.get_running_loop().time() * 1000), order=self._order)
        result = await run_round(self._pool, read_round, READ_REQUEST_TIMEOUT_MS)
        # Nodes that failed or lagged are asked last next time; the others keep their place.
        late = read_round.stragglers()
        if late:
            self._order = [*(n for n in self._order if n not in late), *late]
        return result

    def _deliver(self, entries: list[Entry]) -> None:
        for entry in entries:
            if self._until_lsn is not None:
                first = entry.lsn if isinstance(entry, Record) else entry.lo
                if first > self._until_lsn:
                    break
                if isinstance(entry, Gap) and entry.hi > self._until_lsn:
                    entry = Gap(type=entry.type, lo=entry.lo, hi=self._until_lsn)
            self._buffer.append(entry)
            if isinstance(entry, Record):
                self._buffered_bytes += len(entry.payload)
        if self._buffer:
            self._has_data.set()
        if len(self._buffer) >= self._records_max or self._buffered_bytes >= self._bytes_max:
            self._has_space.clear()

