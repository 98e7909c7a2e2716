"""The lean HTTP/1.1 edge: the hot routes (append, append-batch, records, tail) served by an
``asyncio.Protocol`` over httptools, on the same port as the rest of the API.

Why: aiohttp's web stack costs a Task, a middleware frame and a few hundred Python calls per
request, and serves pipelined requests one at a time. Here a request is parsed by httptools'
callbacks, validated by the same functions (``services.http_parse``), handed to the front end
with a completion callback (``append_nowait``: no Task per append) and answered with one
write; pipelined requests are all dispatched as they arrive and answered in request order.

Everything else stays with aiohttp (``services.http_api``): when a connection's next request
is not a hot route (or is one in a form the lean path does not take: HEAD, an upgrade, a
percent-encoded path), the connection waits until its earlier answers are written and is then
handed to aiohttp's own protocol, with the bytes from the start of that request on. It stays
there. The answers, headers, metrics (``HttpMetrics``, same route labels), size caps and body
timeout are the same on both paths; both read the settings of the API app (``EDGE_KEY``).

Bounds: request head (URL and headers) ``REQUEST_HEAD_BYTES_MAX`` and ``HEADERS_COUNT_MAX``
(400 ``BADMSG``, as aiohttp answers over-long header lines), body
``ApiConfig.request_bytes_max`` (413, Content-Length checked before reading, chunked bodies
as they grow), a request not complete within ``body_read_timeout_ms`` (400),
``PIPELINED_MAX`` parsed requests waiting for their answers per connection (reading pauses
past it), idle keep-alive connections closed after ``KEEPALIVE_TIMEOUT_S``. A malformed
request is answered 400 and its connection closed after the earlier answers.

Lifecycle: ``EdgeRunner`` replaces ``web.AppRunner``; its sites (``TCPSite``, ``SockSite``)
serve the lean edge. Its graceful shutdown stops reading, lets in-flight requests finish
within the runner's shutdown timeout, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Coroutine
from email.utils import formatdate
from typing import Any, Protocol, cast
from urllib.parse import parse_qsl

import httptools
import msgpack
from aiohttp import web

from frontend.outcomes import AppendOutcome, LogService, ReadOutcome, TailOutcome
from frontend.ports import AppendAnswer
from services.http_api import (
    EDGE_KEY,
    SERVICE_KEY,
    Edge,
    answer_media,
    read_doc,
    reused_pair,
    tail_doc,
)
from services.http_auth import LOG_ROUTE_ACTIONS
from services.http_parse import (
    NO_FORWARD_VALUES,
    AppendRequest,
    ReadParams,
    Rejection,
    body_media_type,
    decode_body,
    encode_body,
    parse_append,
    parse_append_batch,
    parse_log_id,
    parse_no_forward,
    parse_read_query,
    plain_payload,
)
from services.metrics import UNMATCHED_ROUTE
from shared.config import LimitsConfig
from shared.http_contract import (
    BEARER_PREFIX,
    MSGPACK,
    NO_FORWARD_QUERY,
    SEQUENCER_HEADER,
    MediaType,
    http_code,
    wants_retry_after,
)
from shared.security.auth import Authenticator, Denied, Identity, bearer_token
from shared.security.quotas import retry_after_header_s
from shared.status import Status
from shared.types import LogId

logger = logging.getLogger(__name__)

REQUEST_HEAD_BYTES_MAX = 16 * 1024
"""Longest request line plus headers the lean path parses (400 past it)."""
HEADERS_COUNT_MAX = 128
PIPELINED_MAX = 256
"""Requests of one connection parsed and not yet answered; reading pauses past it."""
KEEPALIVE_TIMEOUT_S = 75.0
"""An idle keep-alive connection is closed after this long (aiohttp's default)."""
SWEEP_INTERVAL_S = 5.0
REFUSING_MAX = 256
"""Connections over the bound that are being answered 503 (each lives until its request
head arrives or the head deadline); past it new ones are reset at once."""
FRESH_GRACE_S = 0.5
"""A new connection is not evicted for a newer one before this (its client is sending its
request): a reconnecting flood cannot cycle a client's connection out before it is served."""
_FULL = "the node is at its connection limit; nothing written, retry"
EVICT_GRACE_S = 1.0
"""A connection handed to aiohttp is evicted for a new one only after this long without a
request in progress (a client between two requests keeps it)."""
ANCHOR_BYTES_MAX = 1024 * 1024
"""Raw bytes kept since the last known request boundary, for a handover to aiohttp."""
CLIENT_CLOSED_CODE = 499
"""Recorded in metrics for requests whose client went away before the answer."""

ROUTE_APPEND = "/v1/logs/{log_id}/append"
ROUTE_APPEND_BATCH = "/v1/logs/{log_id}/append-batch"
ROUTE_RECORDS = "/v1/logs/{log_id}/records"
ROUTE_TAIL = "/v1/logs/{log_id}/tail"
_HOT_ROUTES: dict[tuple[bytes, bytes], str] = {
    (b"POST", b"append"): ROUTE_APPEND,
    (b"POST", b"append-batch"): ROUTE_APPEND_BATCH,
    (b"GET", b"records"): ROUTE_RECORDS,
    (b"GET", b"tail"): ROUTE_TAIL,
}
_LOGS_PREFIX = b"/v1/logs/"
_OTHER, _CONTENT_TYPE, _ACCEPT, _NO_FORWARD, _CONTENT_LENGTH, _EXPECT, _AUTHORIZATION = range(7)
_HEADER_KINDS: dict[bytes, int] = {
    b"content-type": _CONTENT_TYPE, b"accept": _ACCEPT, b"x-seqlog-no-forward": _NO_FORWARD,
    b"content-length": _CONTENT_LENGTH, b"expect": _EXPECT, b"authorization": _AUTHORIZATION,
    b"host": _OTHER,
    b"user-agent": _OTHER, b"connection": _OTHER, b"accept-encoding": _OTHER,
}
"""What ``on_header`` keeps, by lower-cased name; the usual spellings are added below, so
that a request's headers are found without lower-casing each name."""
_HEADER_KINDS.update({b"-".join(part.capitalize() for part in name.split(b"-")): kind
                      for name, kind in list(_HEADER_KINDS.items())})
_METHOD_NAMES = {b"GET": "GET", b"POST": "POST"}
_NO_FORWARD_BYTES: dict[bytes, bool] = {
    value.encode(): flag for value, flag in NO_FORWARD_VALUES.items()}
_REASONS: dict[int, bytes] = {
    200: b"OK", 307: b"Temporary Redirect", 400: b"Bad Request", 401: b"Unauthorized",
    403: b"Forbidden", 404: b"Not Found",
    409: b"Conflict", 413: b"Payload Too Large", 429: b"Too Many Requests",
    500: b"Internal Server Error",
    503: b"Service Unavailable", 504: b"Gateway Timeout",
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LSN_ANSWER = struct.Struct(">6sQ14sQ")
"""An append's msgpack answer ``{"lsn": L, "timestamp_ms": T}`` as msgpack packs it when
both are at least ``_UINT64_MIN`` (LSNs are epoch << 32 | ESN with epoch >= 1; timestamps
are past 1970-02-19): a 2-entry map, each value a uint 64 (``0xcf``)."""
_UINT64_MIN = 2**32
_UINT64_END = 2**64
_LSN_KEY = b"\x82\xa3lsn\xcf"
_TIMESTAMP_KEY = b"\xactimestamp_ms\xcf"
_QUERY_MARK = ord("?")
_PERCENT = ord("%")
"""Bytes searched for as ints: ``b"?" in url`` first tries the needle as an integer and
builds (and drops) a TypeError, ~10x the cost of ``ord("?") in url`` on Python 3.11."""
_OK = Status.OK
"""A module global: ``Status.OK`` goes through ``EnumType.__getattr__``'s slow attribute
path on Python 3.11 (about 4x a global's cost), once per append here."""
_WWW_AUTHENTICATE = b"WWW-Authenticate: %s\r\n" % BEARER_PREFIX.strip().encode()


class AppendNowait(Protocol):
    """``FrontEnd.append_nowait``: the callback-style append (no Task per append)."""

    def __call__(self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
                 producer: tuple[str, int] | None = None, no_forward: bool = False,
                 done: Callable[[AppendOutcome], None], compression: int = 0,
                 records: int = 0) -> None: ...


class LocalAppendNowait(Protocol):
    """``FrontEnd.append_nowait`` with ``local_done``: an append this node sequences is
    answered from the local sequencer's answer as it is (no ``AppendOutcome`` per append)."""

    def __call__(self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
                 producer: tuple[str, int] | None = None, no_forward: bool = False,
                 done: Callable[[AppendOutcome], None], compression: int = 0,
                 records: int = 0,
                 local_done: Callable[[AppendAnswer], None] | None = None) -> None: ...


class _Stop(Exception):
    """Raised from a parser callback to stop parsing the rest of the bytes fed."""


_date_s = 0
_date_line = b""


def _date() -> bytes:
    """The Date header line, formatted once a second."""
    global _date_s, _date_line
    now_s = int(time.time())
    if now_s != _date_s:
        _date_s = now_s
        _date_line = b"Date: " + formatdate(now_s, usegmt=True).encode("ascii") + b"\r\n"
    return _date_line


_media_cache: dict[tuple[bytes | None, bytes | None], MediaType] = {}
_body_media_cache: dict[bytes | None, MediaType | Rejection] = {}


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _answer_media(accept: bytes | None, content_type: bytes | None) -> MediaType:
    """``answer_media`` by the raw header values (clients repeat the same few)."""
    key = (accept, content_type)
    media = _media_cache.get(key)
    if media is None:
        media = answer_media(_text(accept), _text(content_type))
        if len(_media_cache) < ROUTES_CACHED_MAX and all(
                v is None or len(v) <= 200 for v in key):
            _media_cache[key] = media
    return media


def _body_media(content_type: bytes | None) -> MediaType | Rejection:
    """``body_media_type`` by the raw Content-Type value."""
    media = _body_media_cache.get(content_type)
    if media is None:
        media = body_media_type(_text(content_type))
        if len(_body_media_cache) < ROUTES_CACHED_MAX and (
                content_type is None or len(content_type) <= 200):
            _body_media_cache[content_type] = media
    return media


_heads: dict[tuple[int, str], bytes] = {}
"""Status line and Content-Type of each (code, media type) answered so far (a handful)."""
_sequencer_headers: dict[str, bytes] = {}


def _sequencer_header(node: str | None) -> bytes:
    """The ``X-Seqlog-Sequencer`` header line naming ``node`` (one per node of the cluster)."""
    if node is None:
        return b""
    line = _sequencer_headers.get(node)
    if line is None:
        line = b"%s: %s\r\n" % (SEQUENCER_HEADER.encode(), node.encode("latin-1", "replace"))
        if len(_sequencer_headers) < ROUTES_CACHED_MAX:
            _sequencer_headers[node] = line
    return line


def _message_end(raw: bytes, count: int) -> int:
    """Where the ``count``-th complete request in ``raw`` ends (``raw`` starts at a request
    boundary): the shortest prefix a fresh parser completes ``count`` requests in. Only a
    handover or a re-anchoring needs it, at most once per ``ANCHOR_BYTES_MAX`` bytes."""
    if count == 0:
        return 0

    class _Counter:
        completed = 0

        def on_message_complete(self) -> None:
            self.completed += 1

    def completes(length: int) -> int:
        counter = _Counter()
        with contextlib.suppress(httptools.HttpParserError):
            httptools.HttpRequestParser(counter).feed_data(raw[:length])
        return counter.completed

    lo, hi = 0, len(raw)
    while lo < hi:
        mid = (lo + hi) // 2
        if completes(mid) >= count:
            hi = mid
        else:
            lo = mid + 1
    return lo


ROUTES_CACHED_MAX = 4096
PERMITTED_CACHED_MAX = 1024
"""(route, log) pairs a connection remembers as allowed for its identity."""
_routes_cache: dict[tuple[bytes, bytes], tuple[str | None, LogId | Rejection]] = {}
"""``_route_of`` answers by (method, path): clients send to the same few logs over and over."""


def _route_of(method: bytes, path: bytes) -> tuple[str | None, LogId | Rejection]:
    """The hot route of a request and its parsed log id, or ``(None, ...)`` for aiohttp's."""
    if not path.startswith(_LOGS_PREFIX) or _PERCENT in path:
        return None, _NO_LOG
    log_part, _, action = path[len(_LOGS_PREFIX):].partition(b"/")
    route = _HOT_ROUTES.get((method, action)) if log_part else None
    if route is None:
        return None, _NO_LOG
    return route, parse_log_id(log_part.decode("latin-1"))


_NO_LOG = Rejection(Status.INVALID_PARAM, "no log id")


class _Request:
    """One parsed request of a connection, from dispatch until its answer is written."""

    __slots__ = ("close", "conn", "count", "data", "media", "method", "route", "started_s",
                 "url")

    def __init__(self, conn: _Connection, route: str, method: str, media: MediaType,
                 url: bytes, started_s: float, close: bool) -> None:
        self.conn = conn
        self.route = route
        self.method = method
        self.media = media
        self.url = url
        self.started_s = started_s
        self.close = close
        self.count = 1
        self.data: bytes | None = None

    def answer(self, code: int, doc: object, headers: bytes = b"") -> None:
        media = self.media
        # The edge's own Packer: ``msgpack.packb`` builds one per call, 5x the cost.
        body = (self.conn.edge.packer.pack(doc) if media == MSGPACK
                else encode_body(doc, media))
        self.answer_bytes(code, body, media, headers)

    def answer_bytes(self, code: int, body: bytes, media: str, headers: bytes = b"") -> None:
        if self.data is not None:
            return
        conn = self.conn
        metrics = conn.edge.metrics
        metrics.in_flight -= 1
        metrics.observe(self.route, self.method, code if not conn.lost else CLIENT_CLOSED_CODE,
                        time.perf_counter() - self.started_s)
        head = _heads.get((code, media))
        if head is None:
            head = _heads[(code, media)] = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n" % (
                code, _REASONS.get(code, b"Unknown"), media.encode("ascii"))
        self.data = b"".join((
            head, b"Content-Length: %d\r\n" % len(body), _date(), headers,
            b"Connection: close\r\n\r\n" if self.close else b"\r\n", body))
        conn.answered()

    def dropped(self) -> None:
        """The request was cancelled (its client went away, or the node shuts down)."""
        if self.data is None:
            self.data = b""
            metrics = self.conn.edge.metrics
            metrics.in_flight -= 1
            metrics.observe(self.route, self.method, CLIENT_CLOSED_CODE,
                            time.perf_counter() - self.started_s)

    def error(self, status: Status, message: str = "", *, code: int | None = None,
              headers: bytes = b"", retry_after_s: int | None = None) -> None:
        if wants_retry_after(status):
            headers += b"Retry-After: %d\r\n" % (
                self.conn.edge.api.retry_after_s if retry_after_s is None else retry_after_s)
        self.answer(code or http_code(status),
                    {"status": status.name, "message": message or status.description}, headers)

    def rejected(self, rejection: Rejection) -> None:
        self.error(rejection.status, rejection.message)

    def denied(self, denied: Denied) -> None:
        """401, 403 or 429 (``services.http_auth``, quotas): nothing was done."""
        self.error(denied.status, denied.message,
                   headers=_WWW_AUTHENTICATE if denied.status is Status.UNAUTHENTICATED
                   else b"",
                   retry_after_s=retry_after_header_s(denied.retry_after_s)
                   if denied.retry_after_s > 0 else None)

    def internal(self) -> None:
        logger.exception("unhandled error answering %s %s", self.method,
                         self.url[:200].decode("latin-1"))
        self.error(Status.INTERNAL, "internal error; the outcome is unknown")

    # ---- completions -------------------------------------------------------------------

    def on_appended(self, outcome: AppendOutcome) -> None:
        try:
            sequencer = _sequencer_header(outcome.sequencer_node)
            if outcome.status is not Status.OK:
                self._append_failed(outcome, sequencer)
            elif outcome.last_lsn - outcome.first_lsn + 1 != self.count:
                # (count is 1 for a single append.)
                self.error(Status.STALE, reused_pair(outcome.first_lsn, outcome.last_lsn,
                                                     self.count) or "", headers=sequencer)
            elif self.route is ROUTE_APPEND:
                self.answer(200, {"lsn": outcome.first_lsn, "timestamp_ms": outcome.timestamp_ms},
                            sequencer)
            else:
                count = self.count
                self.answer(200, {"first_lsn": outcome.first_lsn, "last_lsn": outcome.last_lsn,
                                  "count": count, "timestamp_ms": outcome.timestamp_ms},
                            sequencer)
        except Exception:
            self.internal()

    def on_local_append(self, answer: AppendAnswer) -> None:
        """The answer of an append this node's sequencer ran (``local_done``)."""
        if answer.status is not _OK or answer.last_lsn - answer.first_lsn + 1 != self.count:
            self.on_appended(AppendOutcome(
                status=answer.status, first_lsn=answer.first_lsn, last_lsn=answer.last_lsn,
                timestamp_ms=answer.timestamp_ms, sequencer_node=self.conn.edge.node_id,
                message=answer.message))
            return
        try:
            first_lsn = answer.first_lsn
            doc: dict[str, int]
            if self.route is ROUTE_APPEND:
                timestamp_ms = answer.timestamp_ms
                media = self.media
                if media == MSGPACK and _UINT64_MIN <= first_lsn < _UINT64_END and (
                        _UINT64_MIN <= timestamp_ms < _UINT64_END):
                    # Nearly every answer: msgpack's own bytes for this map, in one call.
                    self.answer_bytes(200, _LSN_ANSWER.pack(
                        _LSN_KEY, first_lsn, _TIMESTAMP_KEY, timestamp_ms), media,
                        self.conn.edge.node_header)
                    return
                doc = {"lsn": first_lsn, "timestamp_ms": timestamp_ms}
            else:
                count = self.count
                assert first_lsn > 0, answer
                doc = {"first_lsn": first_lsn, "last_lsn": answer.last_lsn, "count": count,
                       "timestamp_ms": answer.timestamp_ms}
            media, edge = self.media, self.conn.edge
            self.answer_bytes(200, edge.packer.pack(doc) if media == MSGPACK
                              else encode_body(doc, media), media, edge.node_header)
        except Exception:
            self.internal()

    def _append_failed(self, outcome: AppendOutcome, sequencer: bytes) -> None:
        if outcome.redirect_http is not None:
            # 307 keeps the method and body; the client re-sends to the log's sequencer node.
            doc = {"status": outcome.status.name, "message": outcome.message,
                   "sequencer_node": outcome.sequencer_node,
                   "sequencer_http": outcome.redirect_http}
            location = b"Location: %s://%s%s\r\n" % (
                self.conn.edge.scheme, outcome.redirect_http.encode("latin-1", "replace"),
                self.url)
            self.answer(307, doc, sequencer + location)
            return
        self.error(outcome.status, outcome.message, headers=sequencer)

    def on_read(self, task: asyncio.Task[ReadOutcome]) -> None:
        self.conn.tasks.discard(task)
        if task.cancelled():
            self.dropped()
            return
        try:
            outcome = task.result()
            if outcome.status is not Status.OK:
                self.error(outcome.status, outcome.message)
            else:
                self.answer(200, read_doc(outcome))
        except Exception:
            self.internal()

    def on_tail(self, task: asyncio.Task[TailOutcome]) -> None:
        self.conn.tasks.discard(task)
        if task.cancelled():
            self.dropped()
            return
        try:
            outcome = task.result()
            sequencer = _sequencer_header(outcome.sequencer_node)
            if outcome.status is not Status.OK:
                self.error(outcome.status, outcome.message, headers=sequencer)
            else:
                self.answer(200, tail_doc(outcome), sequencer)
        except Exception:
            self.internal()


class _Connection(asyncio.Protocol):
    """One client connection on the lean path (httptools parser callbacks are methods)."""

    # Slots: the parser callbacks set a dozen attributes per request.
    __slots__ = ("_accept", "_auth_header", "_auth_token", "_body", "_body_bytes", "_chunks",
                 "_chunks_bytes", "_closing",
                 "_completed", "_content_length", "_content_type", "_counted", "_expect",
                 "_feeding",
                 "_flush_scheduled", "_handover", "_head_bytes", "_headers_count",
                 "_identity", "_in_message", "_keep_alive", "_log_id", "_method",
                 "_no_forward", "_permitted",
                 "_read_paused", "_route", "_started_s", "_timer", "_url", "_write_paused",
                 "edge", "fresh", "idle_since_s", "lost", "opened_s", "parser", "peer_ip",
                 "queue", "refusing", "tasks", "transport")

    def __init__(self, edge: EdgeServer) -> None:
        self.edge = edge
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[_Request] = deque()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.lost = False
        self.idle_since_s: float | None = None
        self._closing = False
        """No more requests are read: the connection closes once its answers are written."""
        self._handover: bytes | None = None
        self._chunks: list[bytes] = []
        self._chunks_bytes = 0
        self._completed = 0
        """Requests completed since the start of ``_chunks`` (a request boundary)."""
        self._in_message = False
        self._timer: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._read_paused = False
        self._flush_scheduled = False
        self._feeding = False
        """Inside ``feed_data``: answers made now are written once it returns."""
        # The request being parsed.
        self._url = b""
        self._head_bytes = 0
        self._headers_count = 0
        self._route: str | None = None
        self._log_id: LogId | Rejection = _NO_LOG
        self._method = b""
        self._content_type: bytes | None = None
        self._accept: bytes | None = None
        self._no_forward: bytes | None = None
        """The X-Seqlog-No-Forward header's value, parsed with the query's at dispatch."""
        self._expect = False
        self._content_length: int | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._keep_alive = True
        self._started_s = 0.0
        # Credentials (docs/SECURITY.md): the last token seen on this connection and whom it
        # authenticated, so that a token is checked once per connection, not per request.
        self._auth_header: bytes | None = None
        self._auth_token: bytes | None = None
        self._identity: Identity | None = None
        self._counted = False
        """The connection counts under ``_identity``'s principal."""
        self._permitted: set[tuple[str, int]] = set()
        """(route, log id) pairs ``_identity`` was allowed on this connection."""
        self.fresh = True
        """No request completed yet: the first one evicted when the node is full."""
        self.opened_s = 0.0
        self.peer_ip = ""
        self.refusing = False
        """Over ``http_connections_max`` with nothing to evict: its request gets 503."""

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        edge = self.edge
        self.idle_since_s = self.opened_s = edge.loop.time()
        peer = transport.get_extra_info("peername")
        self.peer_ip = peer[0] if isinstance(peer, tuple) and peer else ""
        if (edge.ip_counts.get(self.peer_ip, 0) >= edge.limits.http_connections_per_ip_max
                or (edge.connections_count >= edge.limits.http_connections_max
                    and not edge.evict())):
            if edge.refusing_count >= REFUSING_MAX:
                self._closing = True
                self.transport.abort()
                return
            # Full, and nothing may be evicted: this connection's request is answered 503
            # OVERLOADED (nothing written; clients retry after Retry-After) and it closes.
            self.refusing = True
            edge.refusing_count += 1
            self._timer = edge.loop.call_later(edge.head_timeout_s, self._timed_out)
            return
        edge.track(self)
        # The first request's head must arrive in time (a slowloris client holds nothing).
        self._timer = edge.loop.call_later(edge.head_timeout_s, self._timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.refusing:
            self.refusing = False
            self.edge.refusing_count -= 1
        if self._in_message and self._route is not None and self._handover is None:
            # The client gave up in the middle of a request: counted as what it is.
            self.edge.metrics.observe(self._route, _METHOD_NAMES.get(self._method, "OTHER"),
                                      CLIENT_CLOSED_CODE, time.perf_counter() - self._started_s)
        self._closing = True
        self.edge.forget(self)
        self._uncount()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self.tasks:
            task.cancel()

    def _uncount(self) -> None:
        if self._counted and self._identity is not None and self.edge.auth is not None:
            self._counted = False
            self.edge.auth.connection_closed(self._identity)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing or self._handover is not None:
            return
        self.idle_since_s = None
        self._chunks.append(data)
        self._chunks_bytes += len(data)
        self._feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            # A callback stopped parsing and said why (a handover, a refusal, a close), or
            # failed: a bug, answered like any other unexpected error.
            if not self._closing and self._handover is None:
                logger.error("unhandled error parsing a request", exc_info=exc.__context__)
                self._refuse(Status.INTERNAL, "internal error; the outcome is unknown")
        except httptools.HttpParserError as exc:
            self._refuse(Status.BADMSG, f"malformed HTTP request: {exc}"[:300], code=400)
        finally:
            self._feeding = False
        # Answers made while parsing (refusals, instant outcomes) leave in one write.
        if self.queue and self.queue[0].data is not None:
            self.flush()
        if self._closing or self._handover is not None:
            return
        if not self._in_message:
            self._chunks.clear()
            self._chunks_bytes = 0
            self._completed = 0
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self.queue:
                self.idle_since_s = self.edge.loop.time()
            return
        if self._chunks_bytes > ANCHOR_BYTES_MAX and self._completed:
            raw = b"".join(self._chunks)
            end = _message_end(raw, self._completed)
            self._chunks = [raw[end:]]
            self._chunks_bytes = len(raw) - end
            self._completed = 0
        if self._timer is None:
            edge = self.edge
            self._timer = edge.loop.call_later(
                edge.head_timeout_s if self._route is None else edge.body_read_timeout_s,
                self._timed_out)

    def eof_received(self) -> bool | None:
        # A half-closed client still gets its answers; the connection closes after them.
        self._closing = True
        if not self.queue and self.transport is not None:
            self.transport.close()
        return True

    # ---- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._started_s = time.perf_counter()
        self._url = b""
        self._head_bytes = 0
        self._headers_count = 0
        self._route = None
        self._content_type = self._accept = None
        self._no_forward = None
        self._auth_header = None
        self._expect = False
        self._content_length = None
        self._body = []
        self._body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > REQUEST_HEAD_BYTES_MAX:
            self._head_too_big()

    def _pick_route(self) -> None:
        """Which hot route the request is for; anything else goes to aiohttp."""
        method = self.parser.get_method()
        path, _, _ = self._url.partition(b"?")
        key = (method, path)
        found = _routes_cache.get(key)
        if found is None:
            found = _route_of(method, path)
            if len(_routes_cache) < ROUTES_CACHED_MAX:
                _routes_cache[key] = found
        route, log_id = found
        if route is None and self.refusing:
            self._refuse(Status.OVERLOADED, _FULL)
            raise _Stop
        if route is None:
            self._hand_over()
        self._route = route
        self._log_id = log_id
        self._method = method

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._route is None:
            self._pick_route()
        head_bytes = self._head_bytes = self._head_bytes + len(name) + len(value)
        headers_count = self._headers_count = self._headers_count + 1
        if head_bytes > REQUEST_HEAD_BYTES_MAX or headers_count > HEADERS_COUNT_MAX:
            self._head_too_big()
        kind = _HEADER_KINDS.get(name)
        if kind is None:
            kind = _HEADER_KINDS.get(name.lower(), _OTHER)
        if kind == _OTHER:
            return
        if kind == _CONTENT_TYPE:
            self._content_type = value
        elif kind == _ACCEPT:
            self._accept = value
        elif kind == _NO_FORWARD:
            self._no_forward = value
        elif kind == _AUTHORIZATION:
            self._auth_header = value
        elif kind == _CONTENT_LENGTH:
            # llhttp has checked the digits; an absurd length is refused like any too big one.
            self._content_length = int(value) if len(value) <= 20 and value.isdigit() else 2**64
        else:
            self._expect = value.strip().lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        if self._route is None:
            self._pick_route()
        if self.parser.should_upgrade():
            self._hand_over()
        self._keep_alive = self.parser.should_keep_alive()
        timer = self._timer
        if timer is not None:
            # The head is in: the body gets its own (longer) deadline.
            timer.cancel()
            self._timer = self.edge.loop.call_later(self.edge.body_read_timeout_s,
                                                    self._timed_out)
        cap = self.edge.api.request_bytes_max
        if self._content_length is not None and self._content_length > cap:
            self._refuse(Status.TOOBIG, f"request body over request_bytes_max={cap}",
                         route=self._route)
            raise _Stop
        if (self._expect and self._content_length and not self.queue
                and self.transport is not None):
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.edge.api.request_bytes_max:
            self._refuse(Status.TOOBIG,
                         f"request body over request_bytes_max={self.edge.api.request_bytes_max}",
                         route=self._route)
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._completed += 1
        if self.fresh:
            self.fresh = False
            self.edge.fresh.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        route = self._route
        assert route is not None
        accept, content_type = self._accept, self._content_type
        media = (_media_cache.get((accept, content_type))
                 or _answer_media(accept, content_type))
        method = self._method
        request = _Request(self, route, _METHOD_NAMES.get(method) or method.decode("ascii"),
                           media, self._url, self._started_s,
                           not self._keep_alive or self.refusing)
        self.edge.metrics.in_flight += 1
        self.queue.append(request)
        try:
            self._dispatch(request)
        except Exception:
            request.internal()
        if not self._keep_alive:
            self._closing = True
            self._update_reading()
            raise _Stop
        if len(self.queue) >= PIPELINED_MAX:
            self._update_reading()

    # ---- requests --------------------------------------------------------------------------

    def _authorize(self, request: _Request) -> Identity | None:
        """Who the request runs as, or None once it is refused (401, 403, 429)."""
        auth = self.edge.auth
        assert auth is not None
        header = self._auth_header
        identity = self._identity
        if (header is None or header != self._auth_token or identity is None
                or identity.generation != auth.generation
                or identity.expires_s <= auth.now_s()):
            found = auth.authenticate(bearer_token(_text(header)))
            if isinstance(found, Denied):
                request.denied(found)
                return None
            if identity is None or found.principal != identity.principal:
                self._uncount()
                self._identity = found
                denied = auth.connection_opened(found)
                if denied is not None:
                    self._identity = None
                    request.denied(denied)
                    self._closing = True
                    return None
                self._counted = True
            self._identity = identity = found
            self._auth_token = header
            self._permitted = set()
        log_id = self._log_id
        if not isinstance(log_id, Rejection):
            # A connection writes and reads the same few logs: each (route, log) is checked
            # once per identity (keyed by the route's string: an Enum's hash is Python code).
            key = (request.route, log_id)
            if key not in self._permitted:
                denied = auth.permit(identity, LOG_ROUTE_ACTIONS[request.route], log_id)
                if denied is not None:
                    request.denied(denied)
                    return None
                if len(self._permitted) < PERMITTED_CACHED_MAX:
                    self._permitted.add(key)
        return identity

    def _dispatch(self, request: _Request) -> None:
        edge = self.edge
        if self.refusing:
            request.error(Status.OVERLOADED, _FULL)
            return
        if edge.auth is not None and self._authorize(request) is None:
            return
        log_id = self._log_id
        if isinstance(log_id, Rejection):
            request.rejected(log_id)
            return
        route = request.route
        if route is ROUTE_APPEND or route is ROUTE_APPEND_BATCH:
            content_type = self._content_type
            body_media = _body_media_cache.get(content_type) or _body_media(content_type)
            if isinstance(body_media, Rejection):
                request.rejected(body_media)
                return
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            doc = decode_body(body, body_media)
            if isinstance(doc, Rejection):
                request.rejected(doc)
                return
            if route is ROUTE_APPEND:
                payload = plain_payload(doc, body_media, edge.api)
                if payload is not None and self._plain_append(request, log_id, payload):
                    return
            parse = parse_append if route is ROUTE_APPEND else parse_append_batch
            append = parse(doc, body_media, edge.api)
            if isinstance(append, Rejection):
                request.rejected(append)
                return
            self._append(request, log_id, append)
        elif route is ROUTE_RECORDS:
            params = parse_read_query(self._query(), edge.api)
            if isinstance(params, Rejection):
                request.rejected(params)
                return
            self._start(request, self._read(log_id, params), request.on_read)
        else:
            self._start(request, edge.service.tail_ready(log_id), request.on_tail)

    def _query(self) -> list[tuple[str, str]]:
        _, _, query = self._url.partition(b"?")
        if not query:
            return []
        return parse_qsl(query.decode("latin-1"), keep_blank_values=True)

    def _plain_append(self, request: _Request, log_id: LogId, payload: bytes) -> bool:
        """Most appends: one payload and no options (``plain_payload``), the no-forward
        header absent or the seqlog client's, no query, no quota to meter, and a local
        sequencer to ask: what ``_append`` does for them, in one step. False (nothing done):
        anything else, which ``_append`` takes."""
        header = self._no_forward
        no_forward = False if header is None else _NO_FORWARD_BYTES.get(header)
        edge = self.edge
        local = edge.append_local
        if no_forward is None or local is None or _QUERY_MARK in self._url or (
                edge.auth is not None and self._identity is not None
                and self._identity.metered):
            return False
        local(log_id, (payload,), None, no_forward=no_forward, done=request.on_appended,
              local_done=request.on_local_append)
        return True

    def _append(self, request: _Request, log_id: LogId, append: AppendRequest) -> None:
        producer = (None if append.producer_id is None or append.producer_seq is None
                    else (append.producer_id, append.producer_seq))
        header = self._no_forward
        # The common cases (no header, or the seqlog client's "1", and no query) are one
        # dictionary lookup; anything else goes through the one parser.
        no_forward = False if header is None else _NO_FORWARD_BYTES.get(header)
        if no_forward is None or _QUERY_MARK in self._url:
            query = (next((v for n, v in self._query() if n == NO_FORWARD_QUERY), None)
                     if _QUERY_MARK in self._url else None)
            parsed = parse_no_forward(query, None if header is None else header.decode(
                "latin-1"))
            if isinstance(parsed, Rejection):
                request.rejected(parsed)
                return
            no_forward = parsed
        request.count = append.records if append.compression else len(append.payloads)
        auth = self.edge.auth
        if auth is not None and self._identity is not None and self._identity.metered:
            limited = auth.admit_append(self._identity, request.count,
                                        sum(len(p) for p in append.payloads))
            if limited is not None:
                request.denied(limited)
                return
        local = self.edge.append_local
        if local is not None and not append.compression:
            local(log_id, append.payloads, append.key, producer=producer,
                  no_forward=no_forward, done=request.on_appended,
                  local_done=request.on_local_append)
            return
        if append.compression:
            # A compressed batch (docs/API-EXTENSIONS.md): one blob of ``records`` records.
            self.edge.append_nowait(log_id, append.payloads, append.key, producer=producer,
                                    no_forward=no_forward, done=request.on_appended,
                                    compression=append.compression, records=append.records)
            return
        self.edge.append_nowait(log_id, append.payloads, append.key, producer=producer,
                                no_forward=no_forward, done=request.on_appended)

    async def _read(self, log_id: LogId, params: ReadParams) -> ReadOutcome:
        return await self.edge.service.read(log_id, params.from_lsn, params.records_max,
                                            params.bytes_max, params.wait_ms)

    def _start(self, request: _Request, coro: Coroutine[Any, Any, Any],
               done: Callable[[asyncio.Task[Any]], None]) -> None:
        task = self.edge.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(done)

    # ---- answers, refusals, handover -----------------------------------------------------

    def answered(self) -> None:
        """An answer is ready. The only one queued is written at once (or, while parsing,
        once the bytes read are parsed); with more queued (pipelining), the write waits for the
        end of this loop iteration, so that answers completed together (one storage ack ends
        many appends) leave in one write."""
        queue = self.queue
        if self._feeding or not queue or queue[0].data is None:
            return
        if len(queue) == 1:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.edge.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every answer at the head of the queue that is ready, in request order."""
        self._flush_scheduled = False
        queue = self.queue
        if not queue or queue[0].data is None:
            return
        first = queue.popleft()
        data = first.data
        close = first.close
        if queue and queue[0].data is not None:
            parts = [data]
            while queue and queue[0].data is not None and not close:
                request = queue.popleft()
                parts.append(request.data)
                close = request.close
            data = b"".join(cast(list[bytes], parts))
        transport = self.transport
        if transport is None or self.lost:
            queue.clear()
            return
        assert data is not None
        transport.write(data)
        if close:
            queue.clear()
            self._closing = True
            transport.close()
            return
        if not queue:
            if self._handover is not None:
                self._complete_handover()
                return
            if self._closing:
                transport.close()
                return
            if not self._in_message:
                self.idle_since_s = self.edge.loop.time()
        if self._read_paused:
            # Writing only ever un-pauses reading here: every change that pauses it (a
            # full queue, a paused transport, closing, a handover) calls _update_reading.
            self._update_reading()

    def _refuse(self, status: Status, message: str, *, code: int | None = None,
                route: str | None = None) -> None:
        """Answer (after the earlier answers) and close: the rest of the bytes cannot be
        trusted to start a request."""
        request = _Request(self, route or UNMATCHED_ROUTE, self._method_name(), answer_media(
            None if self._accept is None else self._accept.decode("latin-1"), None),
            self._url, self._started_s if self._in_message else time.perf_counter(), True)
        self._closing = True
        self._in_message = False
        self.edge.metrics.in_flight += 1
        self.queue.append(request)
        request.error(status, message, code=code)
        self._update_reading()

    def _method_name(self) -> str:
        try:
            return self.parser.get_method().decode("ascii")
        except Exception:
            return "OTHER"

    def _head_too_big(self) -> None:
        self._refuse(Status.BADMSG, f"request head over {REQUEST_HEAD_BYTES_MAX} bytes or "
                     f"{HEADERS_COUNT_MAX} headers", route=self._route)
        raise _Stop

    def _timed_out(self) -> None:
        self._timer = None
        if self._closing or self._handover is not None:
            return
        if not self._in_message:
            if self.fresh and not self.queue and self.transport is not None:
                # Connected and sent nothing within the head deadline.
                self._closing = True
                self.transport.close()
            return
        if self._route is None:
            self._refuse(Status.BADMSG, f"request head not received within "
                         f"{self.edge.head_timeout_s * 1000:.0f} ms", code=400)
            return
        self._refuse(Status.BADMSG, f"request body not received within "
                     f"{self.edge.body_read_timeout_s * 1000:.0f} ms", code=400,
                     route=self._route)

    def _hand_over(self) -> None:
        """From this request on, the connection is aiohttp's (once earlier answers are out)."""
        raw = b"".join(self._chunks)
        self._handover = raw[_message_end(raw, self._completed):]
        self._chunks.clear()
        self._update_reading()
        if not self.queue:
            self.edge.loop.call_soon(self._complete_handover)
        raise _Stop

    def _complete_handover(self) -> None:
        transport, data = self.transport, self._handover
        if transport is None or self.lost or transport.is_closing() or data is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.edge.forget(self)
        # aiohttp's connections are not counted per principal.
        self._uncount()
        self._closing = True
        handler = self.edge.inner()
        self.edge.hand_over(transport, self.peer_ip)
        transport.set_protocol(handler)
        handler.connection_made(transport)
        transport.resume_reading()
        if data:
            handler.data_received(data)

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            return
        pause = (self._write_paused or self._closing or self._handover is not None
                 or len(self.queue) >= PIPELINED_MAX)
        if pause and not self._read_paused:
            self._read_paused = True
            transport.pause_reading()
        elif not pause and self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    # ---- shutdown ---------------------------------------------------------------------------

    def shut(self) -> None:
        """Graceful shutdown: read no more requests; close once the answers are written."""
        self._closing = True
        self._update_reading()
        if not self.queue and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.transport is not None:
            self.transport.abort()


def _task_append(service: LogService) -> AppendNowait:
    """``append_nowait`` over a service that only has the async ``append`` (test doubles):
    one Task per append."""
    tasks: set[asyncio.Task[None]] = set()

    def append_nowait(log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
                      producer: tuple[str, int] | None = None, no_forward: bool = False,
                      done: Callable[[AppendOutcome], None], compression: int = 0,
                      records: int = 0) -> None:
        async def run() -> None:
            try:
                outcome = await (
                    service.append(log_id, payloads, key, producer=producer,
                                   no_forward=no_forward, compression=compression,
                                   records=records) if compression else
                    service.append(log_id, payloads, key, producer=producer,
                                   no_forward=no_forward))
            except Exception:
                logger.exception("unhandled error appending to log %d", log_id)
                outcome = AppendOutcome(status=Status.INTERNAL,
                                        message="internal error; the outcome is unknown")
            done(outcome)

        task = asyncio.get_running_loop().create_task(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return append_nowait


HTTPS_KEY = web.AppKey("https", bool)
"""Set by the composition root when the API is served over TLS (docs/SECURITY.md)."""


class EdgeServer(web.Server):
    """The protocol factory of the API port: lean connections first, aiohttp's
    ``RequestHandler`` (``inner``) for connections handed over."""

    def __init__(self, inner: web.Server, app: web.Application) -> None:
        super().__init__(inner.request_handler, request_factory=inner.request_factory,
                         handler_cancellation=inner.handler_cancellation)
        self.inner = inner
        self.loop = asyncio.get_running_loop()
        edge: Edge = app[EDGE_KEY]
        self.service: LogService = app[SERVICE_KEY]
        self.api = edge.api
        self.metrics = edge.metrics
        self.body_read_timeout_s = edge.body_read_timeout_ms / 1000
        self.auth: Authenticator | None = edge.auth
        self.limits: LimitsConfig = edge.limits
        self.head_timeout_s = min(self.limits.request_head_timeout_ms / 1000,
                                  self.body_read_timeout_s)
        """The request line and headers must arrive within this (never later than the body
        deadline would allow)."""
        nowait = getattr(self.service, "append_nowait", None)
        self.append_nowait: AppendNowait = (
            nowait if nowait is not None else _task_append(self.service))
        self.append_local: LocalAppendNowait | None = (
            nowait if nowait is not None and "local_done" in inspect.signature(
                nowait).parameters else None)
        self.node_id = self.service.node_id
        self.node_header = _sequencer_header(self.node_id)
        self.scheme = b"https" if app.get(HTTPS_KEY) else b"http"
        """Of the redirects' ``Location``: https when the node serves TLS."""
        self.packer = msgpack.Packer(use_bin_type=True)
        """Answers' msgpack encoder (one loop, one thread: ``pack`` is not re-entered)."""
        self.lean_connections: set[_Connection] = set()
        self.handed = edge.handed
        """Connections handed to aiohttp: [last activity, requests in progress]."""
        self.fresh: dict[_Connection, None] = {}
        """Lean connections that have not completed a request yet, oldest first."""
        self.refusing_count = 0
        inner_lost = inner.connection_lost

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            # aiohttp tells its server when a connection closes, before it lets go of the
            # transport: a handed-over connection stops counting at once.
            transport = handler.transport
            if transport is not None and transport in self.handed:
                self.drop_handed(transport)
            inner_lost(handler, exc)

        inner.connection_lost = connection_lost  # type: ignore[method-assign]
        self.ip_counts: dict[str, int] = {}
        self.handed_ips: dict[object, str] = {}
        """Lean connections by client address (``LimitsConfig.http_connections_per_ip_max``)."""
        self._all_closed = asyncio.Event()
        self._all_closed.set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._shutting_down = False

    def __call__(self) -> _Connection:  # type: ignore[override]
        if self._sweeper is None and not self._shutting_down:
            self._sweeper = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        return _Connection(self)

    def hand_over(self, transport: asyncio.Transport, peer_ip: str) -> None:
        """``transport`` is aiohttp's from now on; it still counts under its address."""
        self.handed[transport] = [self.loop.time(), 0.0]
        self.handed_ips[transport] = peer_ip
        self.ip_counts[peer_ip] = self.ip_counts.get(peer_ip, 0) + 1

    def drop_handed(self, transport: object) -> None:
        self.handed.pop(transport, None)
        peer_ip = self.handed_ips.pop(transport, None)
        if peer_ip is not None:
            self._uncount_ip(peer_ip)

    def _uncount_ip(self, peer_ip: str) -> None:
        count = self.ip_counts.get(peer_ip, 0) - 1
        if count > 0:
            self.ip_counts[peer_ip] = count
        else:
            self.ip_counts.pop(peer_ip, None)

    def track(self, conn: _Connection) -> None:
        self.lean_connections.add(conn)
        self.ip_counts[conn.peer_ip] = self.ip_counts.get(conn.peer_ip, 0) + 1
        if conn.fresh:
            self.fresh[conn] = None
        self._all_closed.clear()

    def forget(self, conn: _Connection) -> None:
        if conn in self.lean_connections:
            self._uncount_ip(conn.peer_ip)
        self.lean_connections.discard(conn)
        self.fresh.pop(conn, None)
        if not self.lean_connections:
            self._all_closed.set()

    def _sweep(self) -> None:
        """Close keep-alive connections idle for ``KEEPALIVE_TIMEOUT_S``."""
        self._sweeper = None
        now_s = self.loop.time()
        for conn in list(self.lean_connections):
            idle_since_s = conn.idle_since_s
            if idle_since_s is not None and now_s - idle_since_s > KEEPALIVE_TIMEOUT_S and (
                    conn.transport is not None):
                conn.transport.close()
        # aiohttp has no deadline for a request head: a handed-over connection with no
        # request in progress (idle, or dribbling a head) is closed after the keep-alive
        # timeout, and is the first evicted when the node is full (``evict``).
        for transport, (last_s, busy) in list(self.handed.items()):
            if transport.is_closing():  # type: ignore[attr-defined]
                self.drop_handed(transport)
            elif not busy and now_s - last_s > KEEPALIVE_TIMEOUT_S:
                self.drop_handed(transport)
                transport.close()  # type: ignore[attr-defined]
        if (self.lean_connections or self.handed) and not self._shutting_down:
            self._sweeper = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    def evict(self) -> bool:
        """Make room for a new connection (``LimitsConfig.http_connections_max``), so that a
        flood of silent or stalled connections cannot lock clients out. Closed, in this
        order: a connection handed to aiohttp with no request in progress for
        ``EVICT_GRACE_S`` (idle, or still sending a request's head: aiohttp has no head
        deadline), the one quiet the longest; the oldest lean connection that has completed
        no request; the longest idle lean keep-alive connection."""
        now_s = self.loop.time()
        handed = min((t for t, (last_s, busy) in self.handed.items()
                      if not busy and now_s - last_s > EVICT_GRACE_S
                      and not t.is_closing()),  # type: ignore[attr-defined]
                     key=lambda t: self.handed[t][0], default=None)
        if handed is not None:
            self.drop_handed(handed)
            handed.abort()  # type: ignore[attr-defined]
            return True
        victim = next(iter(self.fresh), None)
        if victim is not None and now_s - victim.opened_s < min(FRESH_GRACE_S,
                                                                 self.head_timeout_s / 2):
            victim = None
        if victim is None:
            idle = [c for c in self.lean_connections if c.idle_since_s is not None
                    and now_s - c.idle_since_s > EVICT_GRACE_S]
            victim = min(idle, key=lambda c: c.idle_since_s or 0.0, default=None)
        if victim is None or victim.transport is None:
            return False
        self.forget(victim)
        victim.abort()
        return True

    @property
    def connections_count(self) -> int:
        return len(self.lean_connections) + len(self.inner.connections)

    def pre_shutdown(self) -> None:
        self._shutting_down = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.lean_connections):
            conn.shut()
        self.inner.pre_shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
        async def lean() -> None:
            try:
                async with asyncio.timeout(timeout):
                    await self._all_closed.wait()
            except TimeoutError:
                for conn in list(self.lean_connections):
                    conn.abort()

        await asyncio.gather(lean(), self.inner.shutdown(timeout))


class EdgeRunner(web.AppRunner):
    """``web.AppRunner`` whose sites serve the lean edge in front of the app."""

    async def _make_server(self) -> web.Server:
        inner = await super()._make_server()
        return EdgeServer(inner, self.app)
