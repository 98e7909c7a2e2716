"""A scriptable in-memory stand-in for Seqlog nodes' HTTP API, for testing the client alone.

Several ``FakeNode``s share one ``FakeCluster`` (the logs). Each node counts the requests it
served and can be told to answer the next requests with a canned error or a delay.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
from aiohttp import web

from shared.compression import CODEC_NAMES, decompress_batch

SEQ_HEADER = "X-Seqlog-Sequencer"


@dataclass
class Canned:
    http_status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class FakeCluster:
    def __init__(self) -> None:
        self.logs: dict[int, list[tuple[int, bytes, str | None]]] = {}
        self.sequencer = "n2"
        """The node id every answer names as the logs' sequencer."""
        self.nodes: dict[str, FakeNode] = {}
        self.release_delay = False

    def append(self, log_id: int, payloads: list[bytes], key: str | None) -> tuple[int, int]:
        records = self.logs.setdefault(log_id, [])
        first = (1 << 32) + len(records) + 1
        for p in payloads:
            records.append(((1 << 32) + len(records) + 1, p, key))
        return first, first + len(payloads) - 1


class FakeNode:
    def __init__(self, cluster: FakeCluster, node_id: str) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.hits: Counter[str] = Counter()
        self.canned: list[Canned] = []
        self.delay_s = 0.0
        self.json_answers = False
        self.url = ""
        self.batch_bodies: list[dict[str, Any]] = []
        """Every append-batch body this node took, as decoded (compressed ones unexpanded)."""
        self._runner: web.AppRunner | None = None
        cluster.nodes[node_id] = self

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/logs/{log_id}/append", self._append)
        app.router.add_post("/v1/logs/{log_id}/append-batch", self._append_batch)
        app.router.add_get("/v1/logs/{log_id}/records", self._records)
        app.router.add_get("/v1/logs/{log_id}/tail", self._tail)
        app.router.add_get("/v1/cluster", self._cluster)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _answer(self, body: dict[str, Any]) -> web.Response:
        headers = {SEQ_HEADER: self.cluster.sequencer}
        if self.json_answers:
            return web.Response(body=json.dumps(body).encode(), headers=headers,
                                content_type="application/json")
        return web.Response(body=msgpack.packb(body), headers=headers,
                            content_type="application/msgpack")

    async def _prelude(self, request: web.Request, name: str) -> web.Response | None:
        self.hits[name] += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.canned:
            c = self.canned.pop(0)
            return web.Response(status=c.http_status, body=c.body, headers=c.headers,
                                content_type=c.content_type)
        return None

    async def _append(self, request: web.Request) -> web.Response:
        canned = await self._prelude(request, "append")
        if canned is not None:
            return canned
        body = msgpack.unpackb(await request.read())
        first, _ = self.cluster.append(int(request.match_info["log_id"]), [body["payload"]],
                                       body.get("key"))
        return self._answer({"lsn": first, "timestamp_ms": 1000})

    async def _append_batch(self, request: web.Request) -> web.Response:
        canned = await self._prelude(request, "append-batch")
        if canned is not None:
            return canned
        body = msgpack.unpackb(await request.read())
        self.batch_bodies.append(body)
        payloads = body.get("payloads")
        if "compressed_payloads" in body:
            # The compressed form (docs/API-EXTENSIONS.md), expanded as the real nodes do.
            expanded = decompress_batch(body["compressed_payloads"],
                                        CODEC_NAMES[body["compression"]], body["records"],
                                        bytes_max=1 << 26)
            if not isinstance(expanded, tuple) or payloads is not None:
                return web.Response(status=400, body=b'{"status": "BADMSG"}',
                                    content_type="application/json")
            payloads = list(expanded)
        first, last = self.cluster.append(int(request.match_info["log_id"]), payloads,
                                          body.get("key"))
        return self._answer({"first_lsn": first, "last_lsn": last,
                             "count": len(payloads), "timestamp_ms": 1000})

    async def _records(self, request: web.Request) -> web.Response:
        canned = await self._prelude(request, "records")
        if canned is not None:
            return canned
        records = self.cluster.logs.get(int(request.match_info["log_id"]), [])
        from_lsn = int(request.query.get("from", "1"))
        limit = int(request.query.get("limit", "1000"))
        release = records[-1][0] if records else 0
        gaps: list[dict[str, Any]] = []
        next_lsn = from_lsn
        if records and from_lsn < records[0][0]:
            gaps.append({"type": "BRIDGE", "lo": from_lsn, "hi": records[0][0] - 1})
            next_lsn = records[0][0]
        out = [r for r in records if r[0] >= from_lsn][:limit]
        encode = (lambda p: base64.b64encode(p).decode()) if self.json_answers else bytes
        items = [{"lsn": lsn, "timestamp_ms": 1000, "payload": encode(p), "key": k}
                 for lsn, p, k in out]
        if out:
            next_lsn = out[-1][0] + 1
        return self._answer({"records": items, "gaps": gaps, "next_lsn": next_lsn,
                             "release_lsn": release})

    async def _tail(self, request: web.Request) -> web.Response:
        canned = await self._prelude(request, "tail")
        if canned is not None:
            return canned
        records = self.cluster.logs.get(int(request.match_info["log_id"]), [])
        return self._answer({"release_lsn": records[-1][0] if records else 0, "trim_lsn": 0,
                             "epoch": 1, "sequencer": self.cluster.sequencer})

    async def _cluster(self, request: web.Request) -> web.Response:
        self.hits["cluster"] += 1
        nodes = [{"node_id": n.node_id, "roles": ["sequencer"], "http": n.url[len("http://"):],
                  "state": "ALIVE", "sequencer_weight": 1.0, "storage_capacity": 0.0}
                 for n in self.cluster.nodes.values()]
        return self._answer({"cluster": "fake", "nodes": nodes})


def error(http_status: int, status: str, message: str = "canned",
          headers: dict[str, str] | None = None) -> Canned:
    body = json.dumps({"status": status, "message": message}).encode()
    return Canned(http_status, body, headers=headers or {})
