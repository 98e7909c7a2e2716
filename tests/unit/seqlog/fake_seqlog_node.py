"""A scriptable in-memory stand-in for Seqlog nodes' HTTP API and binary append protocol, for
testing the client alone.

Several ``FakeNode``s share one ``FakeCluster`` (the logs). Each node counts the requests it
served and can be told to answer the next requests with a canned error or a delay. With
``binary`` (the default) a node also serves APPENDs on a data port (the real transport server,
``shared.net.server``) and lists it in ``GET /v1/cluster``; there, like a real node, it answers
a ``no_forward`` append for a log it does not sequence with a redirect (counted as
``hits["redirect"]``), and turns canned HTTP errors into the same status.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
from aiohttp import web

from shared.compression import CODEC_NAMES, decompress_batch
from shared.config import TransportConfig
from shared.net.server import Server, start_server
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.append import Append, Appended
from shared.wire.codec import Message

SEQ_HEADER = "X-Seqlog-Sequencer"
FINGERPRINT = "fake-fingerprint"


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
    def __init__(self, cluster: FakeCluster, node_id: str, *, binary: bool = True,
                 transport: TransportConfig | None = None) -> None:
        self.transport = transport or TransportConfig()
        self.fingerprint_told = FINGERPRINT
        """What ``GET /v1/cluster`` tells clients to HELLO with."""
        self.cluster = cluster
        self.node_id = node_id
        self.binary = binary
        self.data = ""
        self._server: Server | None = None
        self.hits: Counter[str] = Counter()
        self.canned: list[Canned] = []
        self.canned_batches: list[Canned] = []
        """Like ``canned``, for binary APPENDs of more than one payload only."""
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
        if self.binary:
            self._server = await start_server(
                "127.0.0.1", 0, node_id=NodeId(self.node_id), cluster_fingerprint=FINGERPRINT,
                handler=self, config=self.transport)
            self.data = f"127.0.0.1:{self._server.port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- binary protocol

    def on_message(self, peer: NodeId, message: Message, reply: Callable[[Message], None]
                   ) -> None:
        assert type(message) is Append and message.hops == 0, message
        sequencer = self.cluster.sequencer
        if message.no_forward and sequencer != self.node_id:
            self.hits["redirect"] += 1
            owner = self.cluster.nodes[sequencer]
            reply(_appended(message, Status.NOSEQUENCER, sequencer, redirect_data=owner.data))
            return
        batch = len(message.payloads) > 1 or message.compression
        self.hits["append-batch" if batch else "append"] += 1
        self.hits["binary"] += 1
        if message.compression:
            # The compressed form, expanded as the real nodes do; recorded like an HTTP body.
            name = next(n for n, c in CODEC_NAMES.items() if c == message.compression)
            self.batch_bodies.append({"compression": name, "records": message.records,
                                      "compressed_payloads": message.payloads[0],
                                      **_binary_options(message)})
            expanded = decompress_batch(message.payloads[0], message.compression,
                                        message.records, bytes_max=1 << 26)
            if not isinstance(expanded, tuple):
                reply(_appended(message, Status.BADMSG, sequencer))
                return
            message = replace(message, payloads=expanded, compression=0, records=0)
        elif len(message.payloads) > 1:
            self.batch_bodies.append({"payloads": list(message.payloads),
                                      **_binary_options(message)})
        if self.delay_s:
            asyncio.get_running_loop().call_later(self.delay_s, self._append_now, message,
                                                  reply)
        else:
            self._append_now(message, reply)

    def _append_now(self, message: Append, reply: Callable[[Message], None]) -> None:
        if self.canned_batches and len(message.payloads) > 1:
            reply(_appended(message, _canned_status(self.canned_batches.pop(0)),
                            self.cluster.sequencer))
            return
        if self.canned:
            reply(_appended(message, _canned_status(self.canned.pop(0)), self.cluster.sequencer))
            return
        first, last = self.cluster.append(message.log_id, list(message.payloads), message.key)
        reply(Appended(status=Status.OK, log_id=message.log_id, first_lsn=Lsn(first),
                       last_lsn=Lsn(last), timestamp_ms=1000,
                       sequencer_node=NodeId(self.cluster.sequencer), message=""))

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
                  "state": "ALIVE", "sequencer_weight": 1.0, "storage_capacity": 0.0,
                  **({"data": n.data} if n.data else {})}
                 for n in self.cluster.nodes.values()]
        answer: dict[str, Any] = {"cluster": "fake", "nodes": nodes}
        if self.binary:
            answer.update(cluster_fingerprint=self.fingerprint_told, protocol_version=2)
        return self._answer(answer)


def _binary_options(message: Append) -> dict[str, Any]:
    """An APPEND's key and producer pair as an HTTP body would carry them."""
    options: dict[str, Any] = {"key": message.key}
    if message.producer_id is not None:
        options.update(producer_id=message.producer_id, producer_seq=message.producer_seq)
    return options


def _appended(message: Append, status: Status, sequencer: str,
              redirect_data: str | None = None) -> Appended:
    return Appended(status=status, log_id=LogId(message.log_id), first_lsn=Lsn(0),
                    last_lsn=Lsn(0), timestamp_ms=0, sequencer_node=NodeId(sequencer),
                    message="canned", redirect_data=redirect_data)


_HTTP_STATUS = {429: Status.SEQNOBUFS, 504: Status.TIMEDOUT, 500: Status.INTERNAL,
                503: Status.NOTREADY, 400: Status.BADMSG, 413: Status.TOOBIG}


def _canned_status(canned: Canned) -> Status:
    """The status a canned HTTP error stands for, as a binary answer."""
    try:
        name = json.loads(canned.body).get("status")
    except ValueError:
        name = None
    status = Status.__members__.get(name) if isinstance(name, str) else None
    return status or _HTTP_STATUS.get(canned.http_status, Status.INTERNAL)


def error(http_status: int, status: str, message: str = "canned",
          headers: dict[str, str] | None = None) -> Canned:
    body = json.dumps({"status": status, "message": message}).encode()
    return Canned(http_status, body, headers=headers or {})
