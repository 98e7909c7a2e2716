"""The public HTTP API (API.md) as an aiohttp application over a ``LogService``.

Handlers parse (``services.http_parse``), call the service once, map the returned ``Status``
through ``shared.http_contract`` and answer; they make no other decision. One middleware
wraps every request: it counts and times it (``services.metrics``), turns router errors (404,
405) into JSON error bodies and any unexpected exception into a logged 500 ``INTERNAL``.

Request bodies are capped at ``ApiConfig.request_bytes_max``: a larger Content-Length is
refused before reading, and a chunked body is refused as soon as it grows past the cap. A body
that does not arrive within ``body_read_timeout_ms`` is refused too, so a stalled client
cannot hold a handler forever. Either way the connection is closed after the answer.

Lifecycle: ``create_api_app`` builds the app; the caller runs it and owns the service's
lifetime. A node runs it behind the lean edge (``services.http_edge.EdgeRunner``), which
serves the hot routes itself and hands every other connection to this app; the app still
serves every route, so it also answers hot routes on connections handed to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import ClientPayloadError, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from frontend.outcomes import AppendOutcome, LogService, ReadOutcome, TailOutcome
from services.http_auth import authorize
from services.http_parse import (
    AppendRequest,
    Rejection,
    body_media_type,
    decode_body,
    encode_body,
    parse_append,
    parse_append_batch,
    parse_find_time_query,
    parse_log_id,
    parse_no_forward,
    parse_read_query,
    parse_trim,
    response_media_type,
)
from services.log_stats import LOGS_PAGE_DEFAULT, LOGS_PAGE_MAX, LogsSource
from services.metrics import UNMATCHED_ROUTE, HttpMetrics
from services.openapi import build_openapi
from shared.config import ApiConfig, LimitsConfig
from shared.http_contract import (
    AUTHORIZATION_HEADER,
    BEARER_PREFIX,
    NO_FORWARD_HEADER,
    NO_FORWARD_QUERY,
    SEQUENCER_HEADER,
    WWW_AUTHENTICATE_HEADER,
    MediaType,
    http_code,
    wants_retry_after,
)
from shared.security.auth import Authenticator, Denied, Identity
from shared.security.quotas import retry_after_header_s
from shared.status import Status
from shared.types import LOG_ID_MAX, LogId, Lsn, NodeId, format_lsn
from shared.wire.hello import PROTOCOL_VERSION

logger = logging.getLogger(__name__)

BODY_READ_TIMEOUT_MS_DEFAULT = 30_000
_CLIENT_CLOSED_CODE = 499
"""Recorded in metrics for requests whose client went away before the answer (nginx's code)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
BodyParser = Callable[[dict[str, Any], MediaType, ApiConfig], T | Rejection]


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    """Everything a handler needs besides the service."""

    api: ApiConfig
    registry: CollectorRegistry
    metrics: HttpMetrics
    openapi_json: bytes
    body_read_timeout_ms: int
    logs: LogsSource | None = None
    """``GET /v1/logs`` (``services.log_stats``); None: an empty list."""
    auth: Authenticator | None = None
    """Client authentication and quotas (docs/SECURITY.md); None or disabled: open."""
    limits: LimitsConfig = LimitsConfig()
    """Connection bounds and the request head deadline of the lean edge."""
    handed: dict[object, list[float]] = field(default_factory=dict)
    """Connections the lean edge handed to aiohttp, by transport: [last activity (loop
    time), requests in progress]; the middleware keeps it, the edge's sweep closes those
    that stall (docs/SECURITY.md)."""


SERVICE_KEY = web.AppKey[LogService]("log_service")
SHARDS_KEY = web.AppKey[Callable[[], Awaitable[list[dict[str, Any]] | None]]]("shards")
"""The cluster's storage shards (``shared.cluster_state``), read from the epoch store."""
IDENTITY_KEY = "seqlog_identity"
"""Request key: the ``Identity`` an authenticated request runs as."""
EDGE_KEY = web.AppKey("http_edge", Edge)
"""The edge settings and metrics of an API app, which the lean edge (``services.http_edge``)
shares."""


_MEDIA_CACHED_MAX = 256
_media_cache: dict[tuple[str | None, str | None], MediaType] = {}
"""Answers of ``response_media_type`` by (Accept, Content-Type): clients send the same few
header values over and over, and negotiating costs more than a dictionary lookup."""


def _media(request: web.Request) -> MediaType:
    headers = request.headers
    return answer_media(headers.get("Accept"), headers.get("Content-Type"))


def answer_media(accept: str | None, content_type: str | None) -> MediaType:
    """``response_media_type``, remembered for the header values clients repeat."""
    key = (accept, content_type)
    media = _media_cache.get(key)
    if media is None:
        media = response_media_type(*key)
        if len(_media_cache) < _MEDIA_CACHED_MAX and all(
                v is None or len(v) <= 200 for v in key):
            _media_cache[key] = media
    return media


def _answer(
    request: web.Request, doc: object, *, code: int = 200, sequencer: NodeId | None = None
) -> web.Response:
    media = _media(request)
    response = web.Response(body=encode_body(doc, media), status=code, content_type=media)
    if sequencer is not None:
        response.headers[SEQUENCER_HEADER] = sequencer
    return response


def _error(
    request: web.Request,
    status: Status,
    message: str = "",
    *,
    code: int | None = None,
    sequencer: NodeId | None = None,
) -> web.Response:
    assert status is not Status.OK
    body = {"status": status.name, "message": message or status.description}
    response = _answer(request, body, code=code or http_code(status), sequencer=sequencer)
    if wants_retry_after(status):
        response.headers["Retry-After"] = str(request.app[EDGE_KEY].api.retry_after_s)
    return response


def denied_response(request: web.Request, denied: Denied) -> web.Response:
    """401, 403 or 429 for a request refused by ``services.http_auth`` or a quota."""
    response = _error(request, denied.status, denied.message)
    if denied.status is Status.UNAUTHENTICATED:
        response.headers[WWW_AUTHENTICATE_HEADER] = BEARER_PREFIX.strip()
    if denied.retry_after_s > 0:
        response.headers["Retry-After"] = str(retry_after_header_s(denied.retry_after_s))
    if request.can_read_body and not request.content.is_eof():
        # The body is unread and stays so: the connection cannot carry another request.
        response.force_close()
    return response


def _quota_denied(request: web.Request, append: AppendRequest) -> web.Response | None:
    """RATE_LIMITED (429, nothing written) when the principal's append quota is used up."""
    identity: Identity | None = request.get(IDENTITY_KEY)
    auth = request.app[EDGE_KEY].auth
    if identity is None or auth is None:
        return None
    records = append.records if append.compression else len(append.payloads)
    denied = auth.admit_append(identity, records, sum(len(p) for p in append.payloads))
    return None if denied is None else denied_response(request, denied)


def _rejected(request: web.Request, rejection: Rejection) -> web.Response:
    return _error(request, rejection.status, rejection.message)


class ClientGone(Exception):
    """The client closed the connection before its request body arrived: nothing to answer,
    counted as ``CLIENT_CLOSED_CODE`` and logged as one line (no traceback: it is the
    client's doing, not the node's)."""


async def _read_body(request: web.Request, edge: Edge) -> bytes | Rejection:
    size_max = edge.api.request_bytes_max
    too_big = Rejection(Status.TOOBIG, f"request body over request_bytes_max={size_max}")
    if request.content_length is not None and request.content_length > size_max:
        return too_big
    try:
        if request.content.is_eof():
            # The whole body has arrived (the usual case for small bodies): nothing to wait
            # for, so no timer to arm.
            return await request.read()
        async with asyncio.timeout(edge.body_read_timeout_ms / 1000):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return too_big
    except TimeoutError:
        return Rejection(
            Status.BADMSG, f"request body not received within {edge.body_read_timeout_ms} ms"
        )
    except (ConnectionError, ClientPayloadError) as exc:
        raise ClientGone(str(exc)) from None


async def _body_request(
    request: web.Request, parse: BodyParser[T]
) -> tuple[LogId, T] | web.Response:
    edge = request.app[EDGE_KEY]
    log_id = parse_log_id(request.match_info["log_id"])
    if isinstance(log_id, Rejection):
        return _rejected(request, log_id)
    media = body_media_type(request.headers.get("Content-Type"))
    if isinstance(media, Rejection):
        return _rejected(request, media)
    body = await _read_body(request, edge)
    if isinstance(body, Rejection):
        response = _rejected(request, body)
        # The rest of the body is unread: the connection cannot carry another request.
        response.force_close()
        return response
    doc = decode_body(body, media)
    if isinstance(doc, Rejection):
        return _rejected(request, doc)
    parsed = parse(doc, media, edge.api)
    if isinstance(parsed, Rejection):
        return _rejected(request, parsed)
    return log_id, parsed


def _no_forward(request: web.Request) -> bool | Rejection:
    """docs/API-EXTENSIONS.md: ``?no_forward=1`` or ``X-Seqlog-No-Forward: 1``."""
    query = request.query.get(NO_FORWARD_QUERY) if request.query_string else None
    return parse_no_forward(query, request.headers.get(NO_FORWARD_HEADER))


async def _run_append(request: web.Request, log_id: LogId, append: AppendRequest,
                      no_forward: bool) -> AppendOutcome:
    service = request.app[SERVICE_KEY]
    producer = (None if append.producer_id is None or append.producer_seq is None
                else (append.producer_id, append.producer_seq))
    if append.compression:
        return await service.append(log_id, append.payloads, append.key, producer=producer,
                                    no_forward=no_forward,
                                    compression=append.compression, records=append.records)
    if no_forward:
        return await service.append(log_id, append.payloads, append.key, producer=producer,
                                    no_forward=True)
    return await service.append(log_id, append.payloads, append.key, producer=producer)


def reused_pair(first_lsn: int, last_lsn: int, count: int) -> str | None:
    """Why an OK append answer spanning ``first_lsn..last_lsn`` cannot answer a request of
    ``count`` records, or None when it can. It cannot when an idempotent append's producer
    pair names an earlier append of another size: the sequencer answers with that append's
    LSNs (nothing written), and the client reused the pair for different records."""
    assert first_lsn > 0, (first_lsn, last_lsn)
    span = last_lsn - first_lsn + 1
    if span == count:
        return None
    return (f"the producer pair names an earlier append of {span} records "
            f"({format_lsn(Lsn(first_lsn))}..{format_lsn(Lsn(last_lsn))}), not one of {count}: "
            "a retry must repeat the same append; nothing written")


def _append_failed(request: web.Request, outcome: AppendOutcome) -> web.Response:
    if outcome.redirect_http is not None:
        # 307 keeps the method and body; the client re-sends to the log's sequencer node.
        doc = {"status": outcome.status.name, "message": outcome.message,
               "sequencer_node": outcome.sequencer_node, "sequencer_http": outcome.redirect_http}
        response = _answer(request, doc, code=307, sequencer=outcome.sequencer_node)
        response.headers["Location"] = (f"{request.scheme}://{outcome.redirect_http}"
                                        f"{request.path_qs}")
        return response
    return _error(request, outcome.status, outcome.message, sequencer=outcome.sequencer_node)


async def on_append(request: web.Request) -> web.StreamResponse:
    parsed = await _body_request(request, parse_append)
    if isinstance(parsed, web.StreamResponse):
        return parsed
    log_id, append = parsed
    no_forward = _no_forward(request)
    if isinstance(no_forward, Rejection):
        return _rejected(request, no_forward)
    limited = _quota_denied(request, append)
    if limited is not None:
        return limited
    outcome = await _run_append(request, log_id, append, no_forward)
    if outcome.status is not Status.OK:
        return _append_failed(request, outcome)
    reused = reused_pair(outcome.first_lsn, outcome.last_lsn, 1)
    if reused is not None:
        return _error(request, Status.STALE, reused, sequencer=outcome.sequencer_node)
    doc = {"lsn": outcome.first_lsn, "timestamp_ms": outcome.timestamp_ms}
    return _answer(request, doc, sequencer=outcome.sequencer_node)


async def on_append_batch(request: web.Request) -> web.StreamResponse:
    parsed = await _body_request(request, parse_append_batch)
    if isinstance(parsed, web.StreamResponse):
        return parsed
    log_id, append = parsed
    no_forward = _no_forward(request)
    if isinstance(no_forward, Rejection):
        return _rejected(request, no_forward)
    limited = _quota_denied(request, append)
    if limited is not None:
        return limited
    outcome = await _run_append(request, log_id, append, no_forward)
    if outcome.status is not Status.OK:
        return _append_failed(request, outcome)
    count = append.records_count
    reused = reused_pair(outcome.first_lsn, outcome.last_lsn, count)
    if reused is not None:
        return _error(request, Status.STALE, reused, sequencer=outcome.sequencer_node)
    doc = {
        "first_lsn": outcome.first_lsn,
        "last_lsn": outcome.last_lsn,
        "count": count,
        "timestamp_ms": outcome.timestamp_ms,
    }
    return _answer(request, doc, sequencer=outcome.sequencer_node)


def read_doc(outcome: ReadOutcome) -> dict[str, Any]:
    return {
        "records": [
            {"lsn": r.lsn, "timestamp_ms": r.timestamp_ms, "payload": r.payload, "key": r.key}
            for r in outcome.records
        ],
        "gaps": [{"type": g.type, "lo": g.lo, "hi": g.hi} for g in outcome.gaps],
        "next_lsn": outcome.next_lsn,
        "release_lsn": outcome.release_lsn,
    }


async def on_records(request: web.Request) -> web.StreamResponse:
    edge = request.app[EDGE_KEY]
    log_id = parse_log_id(request.match_info["log_id"])
    if isinstance(log_id, Rejection):
        return _rejected(request, log_id)
    params = parse_read_query(request.query.items(), edge.api)
    if isinstance(params, Rejection):
        return _rejected(request, params)
    outcome = await request.app[SERVICE_KEY].read(
        log_id, params.from_lsn, params.records_max, params.bytes_max, params.wait_ms
    )
    if outcome.status is not Status.OK:
        return _error(request, outcome.status, outcome.message)
    assert outcome.next_lsn >= params.from_lsn, outcome
    return _answer(request, read_doc(outcome))


def tail_doc(outcome: TailOutcome) -> dict[str, Any]:
    return {
        "release_lsn": outcome.release_lsn,
        "trim_lsn": outcome.trim_lsn,
        "epoch": outcome.epoch,
        "sequencer": outcome.sequencer_node or "",
    }


async def on_tail(request: web.Request) -> web.StreamResponse:
    log_id = parse_log_id(request.match_info["log_id"])
    if isinstance(log_id, Rejection):
        return _rejected(request, log_id)
    outcome = await request.app[SERVICE_KEY].tail_ready(log_id)
    if outcome.status is not Status.OK:
        return _error(request, outcome.status, outcome.message, sequencer=outcome.sequencer_node)
    return _answer(request, tail_doc(outcome), sequencer=outcome.sequencer_node)


async def on_find_time(request: web.Request) -> web.StreamResponse:
    log_id = parse_log_id(request.match_info["log_id"])
    if isinstance(log_id, Rejection):
        return _rejected(request, log_id)
    timestamp_ms = parse_find_time_query(request.query.items())
    if isinstance(timestamp_ms, Rejection):
        return _rejected(request, timestamp_ms)
    outcome = await request.app[SERVICE_KEY].find_time(log_id, timestamp_ms)
    if outcome.status is not Status.OK:
        return _error(request, outcome.status, outcome.message)
    return _answer(request, {"lsn": outcome.lsn})


async def on_nodesets(request: web.Request) -> web.StreamResponse:
    log_id = parse_log_id(request.match_info["log_id"])
    if isinstance(log_id, Rejection):
        return _rejected(request, log_id)
    outcome = await request.app[SERVICE_KEY].nodesets(log_id)
    if outcome.status is not Status.OK:
        return _error(request, outcome.status, outcome.message)
    return _answer(request, {
        "cluster_fingerprint": outcome.cluster_fingerprint,
        "protocol_version": outcome.protocol_version,
        "release_lsn": outcome.release_lsn,
        "nodesets": [
            {"first_epoch": n.first_epoch, "last_epoch": n.last_epoch,
             "replication_factor": n.replication_factor,
             "nodes": [{"node_id": node, "data": address} for node, address in n.nodes]}
            for n in outcome.nodesets],
    })


async def on_trim(request: web.Request) -> web.StreamResponse:
    parsed = await _body_request(request, parse_trim)
    if isinstance(parsed, web.StreamResponse):
        return parsed
    log_id, trim_lsn = parsed
    outcome = await request.app[SERVICE_KEY].trim(log_id, trim_lsn)
    if outcome.status is not Status.OK:
        return _error(request, outcome.status, outcome.message)
    return _answer(request, {"trim_lsn": outcome.lsn})


async def on_cluster(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE_KEY]
    nodes = [
        {
            "node_id": n.node_id,
            "roles": list(n.roles),
            "http": n.http,
            "state": n.state,
            "sequencer_weight": n.sequencer_weight,
            "storage_capacity": n.storage_capacity,
            "data": n.data,
        }
        for n in service.cluster_nodes()
    ]
    # What a binary client's HELLO must carry (docs/PROTOCOL.md).
    answer: dict[str, Any] = {"cluster": service.cluster_name, "nodes": nodes,
                              "cluster_fingerprint": service.cluster_fingerprint,
                              "protocol_version": PROTOCOL_VERSION}
    shards = request.app.get(SHARDS_KEY)
    if shards is not None:
        # Disk generations and rebuilding/drain state; absent when the store is unreadable.
        found = await shards()
        if found is not None:
            answer["shards"] = found
    return _answer(request, answer)


def _query_int(request: web.Request, name: str, default: int, low: int, high: int
               ) -> int | Rejection:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or len(text) > 19 or not low <= int(text) <= high:
        return Rejection(Status.INVALID_PARAM,
                         f"{name}={text[:40]!r} is not an integer in {low}..{high}")
    return int(text)


async def on_logs(request: web.Request) -> web.StreamResponse:
    """docs/API-EXTENSIONS.md: the logs this node sequences, paged."""
    after = _query_int(request, "after", 0, 0, LOG_ID_MAX)
    if isinstance(after, Rejection):
        return _rejected(request, after)
    limit = _query_int(request, "limit", LOGS_PAGE_DEFAULT, 1, 2**63 - 1)
    if isinstance(limit, Rejection):
        return _rejected(request, limit)
    source = request.app[EDGE_KEY].logs
    if source is None:
        return _answer(request, {"node_id": request.app[SERVICE_KEY].node_id or "",
                                 "logs": [], "total": 0, "next_after": None})
    return _answer(request, source(after, min(limit, LOGS_PAGE_MAX)))


async def on_healthz(request: web.Request) -> web.StreamResponse:
    return _answer(request, {"status": "OK"})


async def on_readyz(request: web.Request) -> web.StreamResponse:
    if not request.app[SERVICE_KEY].ready():
        return _error(request, Status.NOTREADY)
    return _answer(request, {"status": "OK"})


async def on_metrics(request: web.Request) -> web.StreamResponse:
    text = generate_latest(request.app[EDGE_KEY].registry)
    return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def on_openapi(request: web.Request) -> web.StreamResponse:
    body = request.app[EDGE_KEY].openapi_json
    return web.Response(body=body, content_type="application/json")


def _http_exception_status(exc: web.HTTPException) -> Status:
    return {404: Status.NOTFOUND, 413: Status.TOOBIG}.get(
        exc.status, Status.BADMSG if exc.status < 500 else Status.INTERNAL
    )


def _router_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    allow = exc.headers.get("Allow")
    if exc.status == 404:
        message = f"no route {request.method} {request.path[:200]}"
    elif allow is not None:
        message = f"method {request.method[:20]} not allowed here; allowed: {allow}"
    else:
        message = exc.reason
    response = _error(request, _http_exception_status(exc), message, code=exc.status)
    if allow is not None:
        response.headers["Allow"] = allow
    return response


@web.middleware
async def _edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts and times every request, turns router errors (404, 405) into JSON error bodies
    and any unexpected exception into a logged 500 ``INTERNAL``. One middleware, not two: each
    layer costs a coroutine frame per request."""
    edge = request.app[EDGE_KEY]
    metrics = edge.metrics
    started_s = time.perf_counter()
    code = 500
    metrics.in_flight += 1
    handed = edge.handed.get(request.transport) if edge.handed else None
    if handed is not None:
        handed[1] += 1
    try:
        try:
            auth = edge.auth
            checked = None if auth is None else authorize(
                auth, request.path, request.match_info.route.resource.canonical
                if request.match_info.route.resource is not None else None,
                request.match_info.get("log_id"), request.headers.get(AUTHORIZATION_HEADER))
            if isinstance(checked, Denied):
                refused = denied_response(request, checked)
                code = refused.status
                return refused
            if checked is not None:
                request[IDENTITY_KEY] = checked
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _router_error(request, exc)
        except asyncio.CancelledError:
            code = _CLIENT_CLOSED_CODE
            raise
        except ClientGone as exc:
            code = _CLIENT_CLOSED_CODE
            logger.info("client went away during %s %s: %s", request.method,
                        request.path[:200], exc)
            response = _error(request, Status.BADMSG, "request body incomplete")
            response.force_close()
            return response
        except Exception:
            logger.exception("unhandled error answering %s %s", request.method, request.path)
            response = _error(request, Status.INTERNAL, "internal error; the outcome is unknown")
        code = response.status
        return response
    finally:
        metrics.in_flight -= 1
        if handed is not None:
            handed[1] -= 1
            handed[0] = asyncio.get_running_loop().time()
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else UNMATCHED_ROUTE
        metrics.observe(route, request.method, code,
                        time.perf_counter() - started_s)


def create_api_app(
    service: LogService,
    api: ApiConfig,
    registry: CollectorRegistry,
    *,
    body_read_timeout_ms: int = BODY_READ_TIMEOUT_MS_DEFAULT,
    logs: LogsSource | None = None,
    auth: Authenticator | None = None,
    limits: LimitsConfig | None = None,
) -> web.Application:
    """The API app over ``service``; registers its HTTP metrics in ``registry`` (so one
    registry serves one app)."""
    assert body_read_timeout_ms > 0
    app = web.Application(
        middlewares=[_edge_middleware],
        client_max_size=api.request_bytes_max,
    )
    app[SERVICE_KEY] = service
    app[EDGE_KEY] = Edge(
        api=api,
        registry=registry,
        metrics=HttpMetrics(registry),
        openapi_json=encode_body(build_openapi(
            api, auth.config if auth is not None else None), "application/json"),
        body_read_timeout_ms=body_read_timeout_ms,
        logs=logs,
        auth=auth if auth is not None and auth.enabled else None,
        limits=limits or LimitsConfig(),
    )
    app.router.add_post("/v1/logs/{log_id}/append", on_append)
    app.router.add_post("/v1/logs/{log_id}/append-batch", on_append_batch)
    app.router.add_get("/v1/logs/{log_id}/records", on_records)
    app.router.add_get("/v1/logs/{log_id}/tail", on_tail)
    app.router.add_post("/v1/logs/{log_id}/trim", on_trim)
    app.router.add_get("/v1/logs/{log_id}/find-time", on_find_time)
    app.router.add_get("/v1/logs/{log_id}/nodesets", on_nodesets)
    app.router.add_get("/v1/cluster", on_cluster)
    app.router.add_get("/v1/logs", on_logs)
    app.router.add_get("/healthz", on_healthz)
    app.router.add_get("/readyz", on_readyz)
    app.router.add_get("/metrics", on_metrics)
    app.router.add_get("/openapi.json", on_openapi)
    return app
