"""An in-memory ``LogService`` for testing the HTTP edge alone: one epoch, records in a list.

It records the calls it gets so tests can check what the HTTP layer passed on (clamped read
parameters, payloads, keys) and can be told to fail every call with a given ``Status`` or to
raise, to check how the edge maps outcomes.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner
from prometheus_client import CollectorRegistry

from frontend.outcomes import (
    AppendOutcome,
    GapOut,
    GapType,
    LsnOutcome,
    NodeOut,
    NodesetOut,
    NodesetsOutcome,
    ReadOutcome,
    RecordOut,
    TailOutcome,
)
from services.http_api import create_api_app
from services.http_edge import EdgeRunner
from shared.compression import decompress_batch
from shared.config import ApiConfig
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn

EPOCH = Epoch(1)
TIMESTAMP_MS = 1_700_000_000_000
FIRST_LSN = compose_lsn(EPOCH, Esn(1))
JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"

# Small limits so that every "over the limit" case is cheap to build.
API = ApiConfig(
    payload_bytes_max=1024,
    request_bytes_max=64 * 1024,
    batch_records_max=10,
    read_records_max=50,
    read_bytes_max=4096,
    long_poll_ms_max=2000,
    retry_after_s=3,
)

ApiClient = TestClient[web.Request, web.Application]

APPEND = "/v1/logs/7/append"
BATCH = "/v1/logs/7/append-batch"
RECORDS = "/v1/logs/7/records"
DEADLINE_S = 5.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class EdgeTestServer(TestServer):
    """aiohttp's test server, serving the lean edge in front of the app as a node does."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return EdgeRunner(self.app, **kwargs)


@asynccontextmanager
async def serve(service: FakeLogService, **app_options: Any) -> AsyncIterator[ApiClient]:
    """A client of the API app over ``service``, served on 127.0.0.1 by the lean edge
    (``aiohttp_only=True``: by aiohttp alone, as before the lean edge)."""
    aiohttp_only = app_options.pop("aiohttp_only", False)
    app = create_api_app(service, app_options.pop("api", API), CollectorRegistry(), **app_options)
    server = (TestServer(app, host="127.0.0.1") if aiohttp_only
              else EdgeTestServer(app, host="127.0.0.1"))
    async with TestClient(server) as client:
        yield client


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadCall:
    log_id: LogId
    from_lsn: Lsn
    records_max: int
    bytes_max: int
    wait_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendCall:
    log_id: LogId
    payloads: tuple[bytes, ...]
    key: str | None
    producer: tuple[str, int] | None = None


class FakeLogService:
    """Every log lives in epoch 1; appends are released at once."""

    def __init__(self) -> None:
        self.node_id = NodeId("n1")
        self.cluster_name = "test-cluster"
        self.cluster_fingerprint = "fp"
        self.is_ready = True
        self.fail_with: Status | None = None
        self.raise_error = False
        self.redirect_to: str | None = None
        """When set, appends answer as a node that does not sequence the log under
        no_forward: a redirect to this ``host:port``."""
        self.appends: list[AppendCall] = []
        self.reads: list[ReadCall] = []
        self.trims: list[tuple[LogId, Lsn]] = []
        self.waiters_count = 0
        self.waiter_arrived = asyncio.Event()
        self._records: dict[LogId, list[RecordOut]] = {}
        self._gaps: dict[LogId, list[GapOut]] = {}
        self._tail_lsn: dict[LogId, Lsn] = {}
        self._changed = asyncio.Condition()

    def add_gap(self, log_id: LogId, gap_type: GapType, count: int) -> None:
        lo = self._next(log_id)
        hi = Lsn(lo + count - 1)
        self._gaps.setdefault(log_id, []).append(GapOut(type=gap_type, lo=lo, hi=hi))
        self._tail_lsn[log_id] = hi

    def _tail(self, log_id: LogId) -> Lsn:
        return self._tail_lsn.get(log_id, Lsn(0))

    def _next(self, log_id: LogId) -> Lsn:
        return Lsn(max(self._tail(log_id) + 1, compose_lsn(EPOCH, Esn(1))))

    def _check(self) -> Status | None:
        if self.raise_error:
            raise RuntimeError("fake service failure")
        return self.fail_with

    async def append(
        self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
        producer: tuple[str, int] | None = None, no_forward: bool = False,
        compression: int = 0, records: int = 0,
    ) -> AppendOutcome:
        if compression:
            # The edge checked the batch; the fake stores it plain, as readers see it.
            expanded = decompress_batch(payloads[0], compression, records, bytes_max=1 << 26)
            assert isinstance(expanded, tuple), expanded
            payloads = expanded
        failed = self._check()
        if failed is not None:
            return AppendOutcome(status=failed, sequencer_node=self.node_id, message="forced")
        if self.redirect_to is not None and no_forward:
            return AppendOutcome(status=Status.NOSEQUENCER, sequencer_node=NodeId("n2"),
                                 message="sequenced elsewhere", redirect_http=self.redirect_to)
        self.appends.append(AppendCall(log_id=log_id, payloads=payloads, key=key,
                                       producer=producer))
        first = self._next(log_id)
        records = self._records.setdefault(log_id, [])
        for offset, payload in enumerate(payloads):
            lsn = Lsn(first + offset)
            records.append(RecordOut(lsn=lsn, timestamp_ms=TIMESTAMP_MS, key=key, payload=payload))
        self._tail_lsn[log_id] = Lsn(first + len(payloads) - 1)
        async with self._changed:
            self._changed.notify_all()
        return AppendOutcome(
            status=Status.OK,
            first_lsn=first,
            last_lsn=self._tail_lsn[log_id],
            timestamp_ms=TIMESTAMP_MS,
            sequencer_node=self.node_id,
        )

    async def read(
        self, log_id: LogId, from_lsn: Lsn, records_max: int, bytes_max: int, wait_ms: int
    ) -> ReadOutcome:
        self.reads.append(
            ReadCall(log_id=log_id, from_lsn=from_lsn, records_max=records_max,
                     bytes_max=bytes_max, wait_ms=wait_ms)
        )
        failed = self._check()
        if failed is not None:
            return ReadOutcome(status=failed, message="forced")
        if self._tail(log_id) < from_lsn and wait_ms > 0:
            await self._wait_for(log_id, from_lsn, wait_ms)
        return self._collect(log_id, from_lsn, records_max, bytes_max)

    async def _wait_for(self, log_id: LogId, from_lsn: Lsn, wait_ms: int) -> None:
        self.waiters_count += 1
        self.waiter_arrived.set()
        try:
            async with asyncio.timeout(wait_ms / 1000), self._changed:
                await self._changed.wait_for(lambda: self._tail(log_id) >= from_lsn)
        except TimeoutError:
            pass
        finally:
            self.waiters_count -= 1

    def _collect(
        self, log_id: LogId, from_lsn: Lsn, records_max: int, bytes_max: int
    ) -> ReadOutcome:
        items: list[RecordOut | GapOut] = [
            *(r for r in self._records.get(log_id, []) if r.lsn >= from_lsn),
            *(g for g in self._gaps.get(log_id, []) if g.hi >= from_lsn),
        ]
        items.sort(key=lambda item: item.lsn if isinstance(item, RecordOut) else item.lo)
        records: list[RecordOut] = []
        gaps: list[GapOut] = []
        next_lsn = from_lsn
        size_bytes = 0
        for item in items:
            if isinstance(item, RecordOut):
                if len(records) >= records_max or (records and size_bytes >= bytes_max):
                    break
                records.append(item)
                size_bytes += len(item.payload)
                next_lsn = Lsn(item.lsn + 1)
            else:
                gaps.append(GapOut(type=item.type, lo=max(item.lo, from_lsn), hi=item.hi))
                next_lsn = Lsn(item.hi + 1)
        return ReadOutcome(
            status=Status.OK, records=records, gaps=gaps, next_lsn=next_lsn,
            release_lsn=self._tail(log_id),
        )

    async def tail_ready(self, log_id: LogId) -> TailOutcome:
        return await self.tail(log_id)

    async def tail(self, log_id: LogId) -> TailOutcome:
        failed = self._check()
        if failed is not None:
            return TailOutcome(status=failed, sequencer_node=self.node_id, message="forced")
        return TailOutcome(
            status=Status.OK, release_lsn=self._tail(log_id), trim_lsn=Lsn(0), epoch=EPOCH,
            sequencer_node=self.node_id,
        )

    async def find_time(self, log_id: LogId, timestamp_ms: int) -> LsnOutcome:
        failed = self._check()
        if failed is not None:
            return LsnOutcome(status=failed, message="forced")
        records = self._records.get(log_id, [])
        found = [r.lsn for r in records if r.timestamp_ms >= timestamp_ms]
        return LsnOutcome(status=Status.OK, lsn=found[0] if found else Lsn(self._tail(log_id) + 1))

    async def trim(self, log_id: LogId, trim_lsn: Lsn) -> LsnOutcome:
        failed = self._check()
        if failed is not None:
            return LsnOutcome(status=failed, message="forced")
        if trim_lsn > self._tail(log_id):
            return LsnOutcome(status=Status.INVALID_PARAM, message="beyond the release")
        self.trims.append((log_id, trim_lsn))
        return LsnOutcome(status=Status.OK, lsn=trim_lsn)

    async def nodesets(self, log_id: LogId) -> NodesetsOutcome:
        failed = self._check()
        if failed is not None:
            return NodesetsOutcome(status=failed, message="forced")
        if log_id not in self._records:
            return NodesetsOutcome(status=Status.NOTFOUND, message="no such log")
        return NodesetsOutcome(
            status=Status.OK, cluster_fingerprint="fp", protocol_version=1,
            nodesets=(NodesetOut(first_epoch=Epoch(1), last_epoch=Epoch(2**32 - 2),
                                 replication_factor=1,
                                 nodes=((NodeId("s1"), "127.0.0.1:3"),)),))

    def cluster_nodes(self) -> list[NodeOut]:
        return [
            NodeOut(node_id=self.node_id, roles=("sequencer",), http="127.0.0.1:1",
                    state="ALIVE", sequencer_weight=1.0, storage_capacity=0.0),
            NodeOut(node_id=NodeId("s1"), roles=("storage",), http="127.0.0.1:2",
                    state="SUSPECT", sequencer_weight=0.0, storage_capacity=1.0,
                    data="127.0.0.1:3"),
        ]

    def ready(self) -> bool:
        return self.is_ready
