"""The web console at ``/ui`` (every node serves it): static assets shipped in the package
(``services/console/``, no CDN, no build step) and three JSON endpoints the pages poll.

- ``GET /ui/api/stats``: this node's own counters for the live charts, read from its metrics
  registry in process (no Prometheus): HTTP append and read requests with their latency
  buckets, and, on a storage node, records stored and read.
- ``GET /ui/api/cluster-stats``: the sum of every reachable node's ``/ui/api/stats``, with the
  nodes that did not answer.
- ``GET /ui/api/logs?q=&page=&page_size=``: the logs of the whole cluster, merged from every
  sequencer node's ``GET /v1/logs`` (docs/API-EXTENSIONS.md), filtered by ``q`` (a substring of
  the log id), in log id order, one page at a time; nodes that did not answer are listed so that
  the page can say its table is partial.

A node that is down degrades the answers instead of failing them: each node gets
``PEER_TIMEOUT_S`` and its absence is reported. The pages use the public API (``/v1/cluster``,
``/v1/logs/{id}/tail``, ``/records``, ``/nodesets``) for everything else.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from frontend.outcomes import LogService, NodeOut

ASSETS_DIR = Path(__file__).resolve().parent / "console"
ASSETS: dict[str, str] = {"console.js": "text/javascript", "console.css": "text/css",
                          "index.html": "text/html"}
PEER_TIMEOUT_S = 2.0
LOGS_PAGE_SIZE_MAX = 500
LOGS_FETCHED_MAX = 100_000
"""Rows gathered per node for one answer (10 pages of ``GET /v1/logs``)."""
_NODE_PAGES_MAX = 10
APPEND_ROUTES = ("/v1/logs/{log_id}/append", "/v1/logs/{log_id}/append-batch")
READ_ROUTES = ("/v1/logs/{log_id}/records",)
STORAGE_SAMPLES = ("seqlog_storage_store_records", "seqlog_storage_read_records")
SESSION_KEY = web.AppKey("console_session", dict)


def _route_totals(registry: CollectorRegistry, routes: Iterable[str]) -> dict[str, Any]:
    """Requests, 5xx answers, latency sum and cumulative buckets of ``routes`` together."""
    wanted = set(routes)
    count = 0.0
    errors = 0.0
    sum_s = 0.0
    buckets: dict[str, float] = {}
    for family in registry.collect():
        if family.name == "seqlog_http_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("route") in wanted:
                    count += sample.value
                    if sample.labels.get("code", "").startswith("5"):
                        errors += sample.value
        elif family.name == "seqlog_http_request_duration_seconds":
            for sample in family.samples:
                if sample.labels.get("route") not in wanted:
                    continue
                if sample.name.endswith("_bucket"):
                    le = sample.labels["le"]
                    buckets[le] = buckets.get(le, 0.0) + sample.value
                elif sample.name.endswith("_sum"):
                    sum_s += sample.value
    return {"count": count, "errors": errors, "sum_s": sum_s, "buckets": buckets}


def node_stats(registry: CollectorRegistry, node_id: str) -> dict[str, Any]:
    samples: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in STORAGE_SAMPLES:
                samples[sample.name] = sample.value
    return {"node_id": node_id, "time_ms": int(time.time() * 1000),
            "appends": _route_totals(registry, APPEND_ROUTES),
            "reads": _route_totals(registry, READ_ROUTES),
            "records_stored": samples.get("seqlog_storage_store_records", 0.0),
            "records_read": samples.get("seqlog_storage_read_records", 0.0)}


def _add_totals(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key in ("count", "errors", "sum_s"):
        into[key] += more.get(key, 0.0)
    for le, value in more.get("buckets", {}).items():
        into["buckets"][le] = into["buckets"].get(le, 0.0) + value


def sum_stats(answers: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {
        "time_ms": int(time.time() * 1000),
        "appends": {"count": 0.0, "errors": 0.0, "sum_s": 0.0, "buckets": {}},
        "reads": {"count": 0.0, "errors": 0.0, "sum_s": 0.0, "buckets": {}},
        "records_stored": 0.0, "records_read": 0.0}
    for answer in answers:
        _add_totals(total["appends"], answer["appends"])
        _add_totals(total["reads"], answer["reads"])
        total["records_stored"] += answer["records_stored"]
        total["records_read"] += answer["records_read"]
    return total


def filter_logs(rows: list[dict[str, Any]], query: str, page: int, page_size: int
                ) -> dict[str, Any]:
    """One page of ``rows`` (sorted by log id) whose log id contains ``query``."""
    matching = [r for r in rows if query in str(r["log_id"])] if query else rows
    matching.sort(key=lambda r: r["log_id"])
    start = page * page_size
    return {"total": len(matching), "page": page, "page_size": page_size,
            "logs": matching[start:start + page_size]}


class _Peers:
    """Asks other nodes over HTTP; one client session per app."""

    def __init__(self, app: web.Application,
                 peer_ssl: Callable[[], ssl.SSLContext] | None = None) -> None:
        self.app = app
        self.peer_ssl = peer_ssl
        """With TLS on: the node's (current) context for other nodes' HTTPS API."""

    def session(self) -> aiohttp.ClientSession:
        holder = self.app[SESSION_KEY]
        session = holder.get("session")
        if session is None or session.closed:
            session = holder["session"] = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        assert isinstance(session, aiohttp.ClientSession)
        return session

    async def get(self, node: NodeOut, path: str, authorization: str | None = None) -> Any:
        """``authorization``: the console request's own credentials (docs/SECURITY.md),
        passed on so that a node with auth on answers its peers' consoles."""
        headers = {"Accept": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        scheme, context = ("http", None) if self.peer_ssl is None else ("https", self.peer_ssl())
        async with self.session().get(f"{scheme}://{node.http}{path}", ssl=context or True,
                                      headers=headers) as answer:
            answer.raise_for_status()
            return await answer.json()

    async def node_logs(self, node: NodeOut, authorization: str | None = None
                        ) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        after = 0
        for _ in range(_NODE_PAGES_MAX):
            page = await self.get(node, f"/v1/logs?after={after}&limit=10000", authorization)
            for row in page["logs"]:
                row["sequencer"] = node.node_id
            rows.extend(page["logs"])
            if page.get("next_after") is None or len(rows) >= LOGS_FETCHED_MAX:
                break
            after = int(page["next_after"])
        return rows


def _int_query(request: web.Request, name: str, default: int, high: int) -> int:
    text = request.query.get(name, "")
    return min(int(text), high) if text.isdigit() and len(text) < 10 else default


def add_console(app: web.Application, service: LogService, registry: CollectorRegistry, *,
                peer_ssl: Callable[[], ssl.SSLContext] | None = None) -> None:
    """Serves the console and its JSON endpoints on ``app``; ``peer_ssl``: how to reach the
    other nodes' API over TLS."""
    app[SESSION_KEY] = {}
    peers = _Peers(app, peer_ssl)

    async def close_session(_: web.Application) -> None:
        session = app[SESSION_KEY].get("session")
        if session is not None:
            await session.close()

    app.on_cleanup.append(close_session)

    async def on_root(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/ui/")

    async def on_asset(request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name") or "index.html"
        media = ASSETS.get(name)
        if media is None:
            raise web.HTTPNotFound()
        body = await asyncio.to_thread((ASSETS_DIR / name).read_bytes)
        return web.Response(body=body, content_type=media,
                            headers={"Cache-Control": "no-cache"})

    async def on_stats(request: web.Request) -> web.StreamResponse:
        return web.json_response(node_stats(registry, service.node_id or ""))

    def others(role: str | None = None) -> list[NodeOut]:
        return [n for n in service.cluster_nodes()
                if n.state != "DEAD" and (role is None or role in n.roles)]

    async def on_cluster_stats(request: web.Request) -> web.StreamResponse:
        nodes = others()
        authorization = request.headers.get("Authorization")
        answers = await asyncio.gather(*(peers.get(n, "/ui/api/stats", authorization)
                                         for n in nodes), return_exceptions=True)
        good = [a for a in answers if isinstance(a, dict)]
        doc = sum_stats(good)
        doc["unreachable"] = [n.node_id for n, a in zip(nodes, answers, strict=True)
                              if not isinstance(a, dict)]
        doc["nodes"] = len(good)
        return web.json_response(doc)

    async def on_logs(request: web.Request) -> web.StreamResponse:
        nodes = others("sequencer")
        authorization = request.headers.get("Authorization")
        answers = await asyncio.gather(*(peers.node_logs(n, authorization) for n in nodes),
                                       return_exceptions=True)
        merged: dict[int, dict[str, Any]] = {}
        unreachable = []
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException):
                unreachable.append(node.node_id)
                continue
            for row in answer:
                known = merged.get(row["log_id"])
                if known is None or row["epoch"] > known["epoch"]:
                    merged[row["log_id"]] = row
        doc = filter_logs(list(merged.values()), request.query.get("q", "").strip()[:20],
                          _int_query(request, "page", 0, 1_000_000),
                          max(1, _int_query(request, "page_size", 50, LOGS_PAGE_SIZE_MAX)))
        doc["unreachable"] = unreachable
        doc["dead"] = [n.node_id for n in service.cluster_nodes()
                       if n.state == "DEAD" and "sequencer" in n.roles]
        return web.json_response(doc)

    app.router.add_get("/ui", on_root)
    app.router.add_get("/ui/", on_asset)
    app.router.add_get("/ui/static/{name}", on_asset)
    app.router.add_get("/ui/api/stats", on_stats)
    app.router.add_get("/ui/api/cluster-stats", on_cluster_stats)
    app.router.add_get("/ui/api/logs", on_logs)
