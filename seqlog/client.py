"""The public asyncio client of Seqlog: appends over the binary protocol (docs/PROTOCOL.md) by
default, everything else over the HTTP API (msgpack on the wire).

Appends (``protocol="binary"``): one pipelined connection per node's data port, learned with
the cluster fingerprint from ``GET /v1/cluster`` (``seqlog.binary``, ``seqlog.binary_appends``);
routing and retries follow the rules below. Single appends to one log made in the same loop
iteration travel as one APPEND and are answered each with its own LSN (see
``seqlog.binary_appends``). A cluster whose nodes do not offer the binary
protocol (older nodes) gets HTTP appends instead. ``protocol="http"`` sends appends over HTTP.

One ``aiohttp`` session per client. Appends go straight to the log's sequencer: the node an
answer named (``X-Seqlog-Sequencer``), else the one the sequencer hash picks over the ALIVE
nodes of ``GET /v1/cluster``. Appends sent to the expected owner carry ``X-Seqlog-No-Forward``,
so a node whose view differs answers 307 with the owner instead of forwarding; the client
follows (at most ``redirects_max`` times, and never back to a node it already tried, after
which it lets the nodes forward) and refreshes its cluster view. Connection failures and
timeouts refresh it too. A request that could not even connect is tried on the other nodes.
Answers that guarantee nothing was written (429 SEQNOBUFS, most 503s) are retried with
bounded backoff; an append whose outcome is unknown (504, 500, connection lost after
sending, client timeout) is never retried and raises
``LogError(TIMEDOUT)`` or ``LogError(INTERNAL)``. Reads are idempotent and retried more freely.

Cancelling an append leaves its outcome unknown, exactly like a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any, Literal, Unpack

import aiohttp
from yarl import URL

from seqlog import body as wire
from seqlog.binary import Connections
from seqlog.binary_appends import GROUP_PAYLOAD_BYTES_MAX, BinaryAppends
from seqlog.buffered_writer import BufferedWriter, BufferedWriterOptions
from seqlog.reader import LogReader, Spans, nodesets_release_lsn, parse_nodesets
from seqlog.results import (
    AppendResult,
    BatchResult,
    ClusterInfo,
    Gap,
    ReadResult,
    Record,
    TailResult,
)
from seqlog.routing import Router, normalize_url
from shared.append_validation import check_key, check_producer
from shared.compression import CODEC_NAMES, compress_whole, worth_compressing
from shared.http_contract import (
    AUTHORIZATION_HEADER,
    BEARER_PREFIX,
    NO_FORWARD_HEADER,
    NOTHING_WRITTEN,
    OUTCOME_UNKNOWN,
    SEQUENCER_HEADER,
    TOKEN_ENV,
    TRY_ELSEWHERE,
)
from shared.limits import FRAME_BYTES_MAX
from shared.status import LogError, Status
from shared.tls import client_context
from shared.types import LSN_OLDEST, LogId, Lsn, log_id_valid, lsn_valid
from shared.wire.append import Append, Appended

_REDIRECT_CODES = frozenset({307, 308})
_HEADERS = {"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK}
_NOTHING_WRITTEN = NOTHING_WRITTEN
_OUTCOME_UNKNOWN = OUTCOME_UNKNOWN
_TRY_ELSEWHERE = TRY_ELSEWHERE
_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
URLS_CACHED_MAX = 4096
"""Parsed request URLs a client keeps (parsing one costs more than the rest of building a
request); the cache starts over past it."""
_ONLY_BYTES = frozenset((bytes,))


class Client:
    """``async with Client(["127.0.0.1:7400", ...]) as client: await client.append(1, b"x")``.

    Every method raises ``shared.status.LogError``: the server's status, ``CONNFAILED`` when
    no node could be reached (nothing was sent), ``TIMEDOUT`` when an append's outcome is
    unknown, ``BADMSG`` for an unreadable answer, ``INVALID_PARAM`` for bad arguments.
    """

    def __init__(
        self,
        urls: list[str] | str,
        *,
        timeout_ms: int = 30_000,
        connect_timeout_ms: int = 2_000,
        retries_max: int = 5,
        retry_backoff_ms_min: int = 20,
        retry_backoff_ms_max: int = 1_000,
        connections_max: int = 100,
        routes_max: int = 100_000,
        cluster_refresh_ms_min: int = 1_000,
        follow_wait_ms: int = 10_000,
        follow_idle_ms: int = 100,
        redirects_max: int = 3,
        protocol: Literal["binary", "http"] = "binary",
        ca: str | None = None,
        token: str | None = None,
    ) -> None:
        seeds = [urls] if isinstance(urls, str) else list(urls)
        if not seeds:
            raise ValueError("at least one URL is required")
        if timeout_ms <= 0 or connect_timeout_ms <= 0 or connections_max <= 0:
            raise ValueError("timeouts and connections_max must be positive")
        if retries_max < 0 or not 0 <= retry_backoff_ms_min <= retry_backoff_ms_max:
            raise ValueError("retries_max must be >= 0 and backoff min <= max")
        if protocol not in ("binary", "http"):
            raise ValueError(f"protocol must be 'binary' or 'http', not {protocol!r}")
        # TLS (docs/SECURITY.md): with a CA file, or https:// seeds (the system's CAs).
        tls = ca is not None or any(s.strip().startswith("https://") for s in seeds)
        self._ssl: ssl.SSLContext | None = client_context(ca) if tls else None
        self._router = Router(seeds, routes_max=routes_max, scheme="https" if tls else "http")
        self._timeout_ms = timeout_ms
        self._connect_timeout_ms = connect_timeout_ms
        self._retries_max = retries_max
        self._backoff_ms_min = retry_backoff_ms_min
        self._backoff_ms_max = retry_backoff_ms_max
        self._connections_max = connections_max
        self._cluster_refresh_ms_min = cluster_refresh_ms_min
        self._cluster_refreshed_at_ms = -cluster_refresh_ms_min
        self._follow_wait_ms = follow_wait_ms
        self._follow_idle_ms = follow_idle_ms
        self._redirects_max = redirects_max
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._default_timeout = self._timeout(0)
        self._rng = random.Random()
        self._protocol = protocol
        self._token = token or os.environ.get(TOKEN_ENV) or ""
        """Bearer token (docs/SECURITY.md): the argument, else ``SEQLOG_TOKEN``."""
        self._headers = ({**_HEADERS, AUTHORIZATION_HEADER: BEARER_PREFIX + self._token}
                         if self._token else _HEADERS)
        self._no_forward_headers = {**self._headers, NO_FORWARD_HEADER: "1"}
        self._binary: BinaryAppends | None = None
        self._binary_off = protocol == "http"
        """Set once appends go over HTTP for good: asked to, or the cluster does not offer the
        binary protocol."""
        self._cluster_info: ClusterInfo | None = None
        self._first_cluster: asyncio.Future[ClusterInfo] | None = None
        """The cluster view being fetched for the binary path's set-up, shared by every append
        that needs it meanwhile (a burst of first appends makes one request, not one new
        connection and TLS handshake each)."""
        self.batch_bytes_plain = 0
        """Payload bytes of the append-batches sent with ``compression``, plain ..."""
        self.batch_bytes_sent = 0
        """... and as sent (the blob when it shrank the batch): the compression ratio."""

    @property
    def auth_headers(self) -> dict[str, str]:
        """The ``Authorization`` header of this client's token (empty without one), for
        callers that make their own HTTP requests to the cluster."""
        return {AUTHORIZATION_HEADER: BEARER_PREFIX + self._token} if self._token else {}

    async def __aenter__(self) -> Client:
        self._ensure_session()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._binary is not None:
            binary, self._binary = self._binary, None
            self._binary_off = True
            await binary.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def protocol(self) -> Literal["binary", "http"]:
        """What appends use now: "binary" until the cluster turned out not to offer it."""
        return "http" if self._binary_off else "binary"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """How this client verifies nodes over TLS (``ca``, or https:// URLs); None: plain."""
        return self._ssl

    @property
    def urls(self) -> list[str]:
        """Known node URLs, the ones to try first first."""
        return self._router.urls

    # -- public API ---------------------------------------------------------------------

    async def append(
        self,
        log_id: int,
        payload: bytes,
        key: str | None = None,
        *,
        producer_id: str | None = None,
        producer_seq: int | None = None,
    ) -> AppendResult:
        log = _check_log(log_id)
        payload = _check_payload(payload)
        if not self._binary_off:
            binary = self._binary or await self._binary_appends()
            if binary is not None:
                future: asyncio.Future[AppendResult] = binary.loop.create_future()
                if producer_id is None and producer_seq is None and (
                        len(payload) <= GROUP_PAYLOAD_BYTES_MAX):
                    binary.submit_single(log, payload, _checked_key(key), future,
                                         _append_result)
                else:
                    binary.submit(_message(log, (payload,), key, producer_id, producer_seq),
                                  future, _append_result)
                return await future
        return await self._http_append(log, payload, key, producer_id, producer_seq)

    def append_future(
        self,
        log_id: int,
        payload: bytes,
        key: str | None = None,
        *,
        producer_id: str | None = None,
        producer_seq: int | None = None,
    ) -> asyncio.Future[AppendResult]:
        """``append`` without a coroutine: the future of its result. Over an open binary
        connection this creates no Task (one future each; the appends of one loop iteration
        share a frame and a callback), so a caller can keep thousands of appends in flight
        cheaply. Bad arguments raise at once."""
        log = _check_log(log_id)
        payload = _check_payload(payload)
        binary = self._binary
        if binary is not None and not self._binary_off:
            future: asyncio.Future[AppendResult] = binary.loop.create_future()
            if producer_id is None and producer_seq is None and (
                    len(payload) <= GROUP_PAYLOAD_BYTES_MAX):
                binary.submit_single(log, payload, _checked_key(key), future, _append_result)
            else:
                binary.submit(_message(log, (payload,), key, producer_id, producer_seq), future,
                              _append_result)
            return future
        return asyncio.ensure_future(self.append(
            log, payload, key, producer_id=producer_id, producer_seq=producer_seq))

    async def _http_append(self, log: LogId, payload: bytes, key: str | None,
                           producer_id: str | None, producer_seq: int | None) -> AppendResult:
        request: dict[str, Any] = {"payload": payload}
        _add_optional(request, key, producer_id, producer_seq)
        answer = await self._call("POST", log, f"/v1/logs/{log}/append", request, writes=True,
                                  idempotent=producer_id is not None)
        return wire.parse_append(answer)

    async def append_batch(
        self,
        log_id: int,
        payloads: Iterable[bytes],
        *,
        key: str | None = None,
        producer_id: str | None = None,
        producer_seq: int | None = None,
        compression: str | None = None,
    ) -> BatchResult:
        """An atomic batch. ``compression`` ("lz4" or "zstd") sends it compressed when that
        makes it smaller (docs/API-EXTENSIONS.md); readers get the plain payloads back."""
        log = _check_log(log_id)
        items = list(payloads)
        if not _ONLY_BYTES.issuperset(map(type, items)):
            items = [_check_payload(p) for p in items]
        if not items:
            raise LogError(Status.INVALID_PARAM, "a batch needs at least one payload")
        blob = None if compression is None else self._compress(items, compression)
        if not self._binary_off:
            binary = self._binary or await self._binary_appends()
            if binary is not None:
                future: asyncio.Future[BatchResult] = binary.loop.create_future()
                message = _message(log, tuple(items), key, producer_id, producer_seq)
                if blob is not None:
                    message = replace(message, payloads=(blob,),
                                      compression=CODEC_NAMES[str(compression)],
                                      records=len(items))
                binary.submit(message, future, _batch_result)
                return await future
        return await self._http_append_batch(log, items, key, producer_id, producer_seq,
                                             blob=blob, compression=compression)

    async def _http_append_batch(self, log: LogId, items: list[bytes], key: str | None,
                                 producer_id: str | None, producer_seq: int | None, *,
                                 blob: bytes | None = None, compression: str | None = None,
                                 ) -> BatchResult:
        request: dict[str, Any] = {"payloads": items} if blob is None else {
            "compression": compression, "records": len(items), "compressed_payloads": blob}
        _add_optional(request, key, producer_id, producer_seq)
        path = f"/v1/logs/{log}/append-batch"
        return wire.parse_batch(await self._call("POST", log, path, request, writes=True,
                                                 idempotent=producer_id is not None))

    async def _http_fallback(self, message: Append, make: Any) -> AppendResult | BatchResult:
        """An append the binary path could not send (the cluster does not offer it), over
        HTTP: nothing was sent yet."""
        producer_seq = None if message.producer_id is None else message.producer_seq
        if make is _batch_result:
            if message.compression:
                # A compressed batch goes over HTTP as it is (the blob, not its records).
                name = next(n for n, c in CODEC_NAMES.items() if c == message.compression)
                return await self._http_append_batch(
                    message.log_id, [b""] * message.records, message.key, message.producer_id,
                    producer_seq, blob=message.payloads[0], compression=name)
            return await self._http_append_batch(message.log_id, list(message.payloads),
                                                 message.key, message.producer_id,
                                                 producer_seq)
        return await self._http_append(message.log_id, message.payloads[0], message.key,
                                       message.producer_id, producer_seq)

    async def _binary_appends(self) -> BinaryAppends | None:
        """The binary append path, set up on first use from the cluster view (fingerprint and
        data addresses); None (appends go over HTTP) when the cluster does not offer it."""
        if self._binary is not None or self._binary_off:
            return self._binary
        info = self._cluster_info
        if info is None:
            first = self._first_cluster
            if first is None:
                first = self._first_cluster = asyncio.ensure_future(self.cluster())
                # Retrieved even if every waiter went away (no "never retrieved" warning).
                first.add_done_callback(lambda f: f.cancelled() or f.exception())
            try:
                # Shielded: one caller cancelled must not cancel the others' fetch.
                info = await asyncio.shield(first)
            except LogError:
                if self._first_cluster is first:
                    self._first_cluster = None  # the next append asks again
                return None  # the HTTP path reports why no node answers
        if self._binary is not None or self._binary_off:
            return self._binary
        if not info.cluster_fingerprint or not any(n.data for n in info.nodes):
            self._binary_off = True
            return None
        self._binary = BinaryAppends(
            router=self._router,
            connections=Connections(cluster_fingerprint=info.cluster_fingerprint,
                                    connect_timeout_ms=self._connect_timeout_ms,
                                    timeout_ms=self._timeout_ms, ssl=self._ssl,
                                    token=self._token),
            retries_max=self._retries_max, redirects_max=self._redirects_max,
            backoff_ms=self._backoff_after_ms,
            refresh_cluster=self._refresh_cluster, http_fallback=self._http_fallback,
            on_unavailable=self._binary_unavailable, make_single=_single_result)
        return self._binary

    def _binary_unavailable(self) -> None:
        self._binary_off = True

    def buffered_writer(self, **options: Unpack[BufferedWriterOptions]) -> BufferedWriter:
        """A writer that batches appends per log (``seqlog.buffered_writer``):
        ``async with client.buffered_writer(linger_ms=5) as w: lsn = await w.append(7, b"x")``.
        """
        return BufferedWriter(self, **options)

    async def read(
        self,
        log_id: int,
        from_lsn: int = LSN_OLDEST,
        *,
        limit: int = 1000,
        max_bytes: int | None = None,
        wait_ms: int = 0,
    ) -> ReadResult:
        log = _check_log(log_id)
        if not lsn_valid(from_lsn) or limit <= 0 or wait_ms < 0:
            raise LogError(Status.INVALID_PARAM, "from_lsn, limit or wait_ms out of range")
        query = f"from={from_lsn}&limit={limit}&wait_ms={wait_ms}"
        if max_bytes is not None:
            query += f"&max_bytes={max_bytes}"
        path = f"/v1/logs/{log}/records?{query}"
        answer = await self._call("GET", log, path, None, writes=False, extra_ms=wait_ms)
        result = wire.parse_read(answer)
        if result.next_lsn < from_lsn:
            raise LogError(Status.BADMSG, "next_lsn went backwards")
        return result

    async def follow(
        self, log_id: int, from_lsn: int = LSN_OLDEST, *, limit: int = 1000
    ) -> AsyncIterator[Record | Gap]:
        """Every record and gap from ``from_lsn`` on, in LSN order, forever (long polls)."""
        next_lsn = from_lsn
        while True:
            result = await self.read(log_id, next_lsn, limit=limit, wait_ms=self._follow_wait_ms)
            for entry in result.entries():
                yield entry
            if result.next_lsn > next_lsn:
                next_lsn = result.next_lsn
            else:
                # The node answered before anything new was released (long poll off or cut
                # short); a short pause keeps this from spinning.
                await asyncio.sleep(self._follow_idle_ms / 1000)

    async def reader(
        self, log_id: int, from_lsn: int = LSN_OLDEST, *, follow: bool = False,
        until_lsn: int | None = None, read_ahead_records_max: int = 10_000,
        read_ahead_bytes_max: int = 32 * 1024 * 1024, wait_ms: int = 5_000,
        speculative_delay_ms: int = 20, stall_timeout_ms: int = 60_000,
    ) -> LogReader:
        """A reader that reads the log straight from its storage nodes (see
        ``seqlog.reader``): ``async with await client.reader(log) as r: async for e in r``."""
        log = _check_log(log_id)
        if not lsn_valid(from_lsn) or from_lsn < LSN_OLDEST or (
                until_lsn is not None and not lsn_valid(until_lsn)) or wait_ms < 0:
            raise LogError(Status.INVALID_PARAM, "from_lsn, until_lsn or wait_ms out of range")
        answer = await self._call("GET", log, f"/v1/logs/{log}/nodesets", None, writes=False)
        spans, addresses, fingerprint = parse_nodesets(answer.data)

        async def refresh() -> Spans:
            again = await self._call("GET", log, f"/v1/logs/{log}/nodesets", None,
                                     writes=False)
            new_spans, new_addresses, _ = parse_nodesets(again.data)
            return new_spans, new_addresses

        return LogReader(release_lsn=nodesets_release_lsn(answer.data), refresh=refresh,
            log_id=log, from_lsn=Lsn(from_lsn), spans=spans, addresses=addresses,
            cluster_fingerprint=fingerprint, follow=follow,
            until_lsn=None if until_lsn is None else Lsn(until_lsn),
            read_ahead_records_max=read_ahead_records_max,
            read_ahead_bytes_max=read_ahead_bytes_max, wait_ms=wait_ms,
            speculative_delay_ms=speculative_delay_ms, stall_timeout_ms=stall_timeout_ms,
            ssl=self._ssl, token=self._token)

    async def tail(self, log_id: int) -> TailResult:
        log = _check_log(log_id)
        answer = await self._call("GET", log, f"/v1/logs/{log}/tail", None, writes=False)
        return wire.parse_tail(answer)

    async def find_time(self, log_id: int, timestamp_ms: int) -> Lsn:
        log = _check_log(log_id)
        path = f"/v1/logs/{log}/find-time?timestamp_ms={int(timestamp_ms)}"
        answer = await self._call("GET", log, path, None, writes=False)
        return wire.parse_lsn_field(answer, "lsn")

    async def trim(self, log_id: int, lsn: int) -> Lsn:
        log = _check_log(log_id)
        if not lsn_valid(lsn):
            raise LogError(Status.INVALID_PARAM, "lsn out of range")
        path = f"/v1/logs/{log}/trim"
        answer = await self._call("POST", log, path, {"lsn": lsn}, writes=False)
        return wire.parse_lsn_field(answer, "trim_lsn")

    async def cluster(self) -> ClusterInfo:
        info = wire.parse_cluster(await self._call("GET", None, "/v1/cluster", None, writes=False))
        self._router.learn_cluster(info)
        self._cluster_info = info
        self._cluster_refreshed_at_ms = _now_ms()
        return info

    # -- compressed batches -------------------------------------------------------------

    def _compress(self, items: list[bytes], compression: str) -> bytes | None:
        """The compressed batch to send instead of ``items``, or None to send them plain
        (it would not make the batch smaller). On the event loop: compressing 1 MiB batches
        in a thread (zstd releases the GIL) took ~2.4 us per record of JSON lines off the
        loop, but the batches then reached the storage nodes evenly spread rather than in
        bursts, one fsync each instead of one per 2-3, and the cluster spent 1.5-2 us more
        per record than the loop saved."""
        codec = CODEC_NAMES.get(compression)
        if codec is None:
            raise LogError(Status.INVALID_PARAM, f"unknown compression {compression!r}")
        plain_bytes = sum(map(len, items))
        self.batch_bytes_plain += plain_bytes
        blob = None
        if worth_compressing(items, codec, plain_bytes):
            blob = compress_whole(items, codec, plain_bytes)
        self.batch_bytes_sent += plain_bytes if blob is None else len(blob)
        return blob

    # -- transport ----------------------------------------------------------------------

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._connections_max, limit_per_host=0,
                                             ssl=self._ssl if self._ssl is not None else True)
            # The API sets no cookies: skip the cookie jar's work on every request.
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._default_timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    def _timeout(self, extra_ms: int) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=(self._timeout_ms + extra_ms) / 1000, connect=self._connect_timeout_ms / 1000
        )

    async def _call(
        self,
        method: str,
        log: LogId | None,
        path: str,
        request: Mapping[str, Any] | None,
        *,
        writes: bool,
        extra_ms: int = 0,
        idempotent: bool = False,
    ) -> wire.Decoded:
        """Send with retries; ``writes`` marks a request whose repetition could duplicate,
        unless it is ``idempotent`` (an append with a producer pair: the cluster answers a
        repetition with the original LSNs), which is retried after an unknown outcome too."""
        data = wire.encode(request) if request is not None else None
        attempt = 0
        redirects = 0
        tried: set[str] = set()
        no_forward = writes and log is not None
        while True:
            if self._router.cluster_stale:
                await self._refresh_cluster()
            # Only ask a node not to forward when the client thinks it is the owner.
            ask = no_forward and self._router.owner_url(log) is not None
            url, status, headers, raw = await self._send(
                method, log, path, data, writes and not idempotent, extra_ms, no_forward=ask)
            tried.add(url)
            content_type = headers.get("Content-Type", wire.JSON)
            node = headers.get(SEQUENCER_HEADER)
            if node and log is not None:
                self._router.learn_route(log, node)
            if status in _REDIRECT_CODES and log is not None:
                target = self._redirect_target(headers, raw, content_type)
                if node and target:
                    self._router.learn_node_url(node, target)
                self._router.cluster_stale = True
                redirects += 1
                if (target is None or target in tried or redirects >= self._redirects_max
                        or not ask):
                    # Views disagree (a loop) or the redirects go on: let the nodes forward,
                    # which they bound by hops.
                    no_forward = False
                    self._router.forget_route(log)
                if redirects > self._redirects_max + 1:
                    raise LogError(Status.NOSEQUENCER, f"redirected {redirects} times")
                continue
            if 200 <= status < 300:
                return wire.decode(raw, content_type)
            error = wire.error_from(status, raw, content_type)
            retry = error.status in _NOTHING_WRITTEN or (
                (not writes or idempotent) and error.status in _OUTCOME_UNKNOWN
            )
            if not retry or attempt >= self._retries_max:
                raise error
            if error.status in _TRY_ELSEWHERE:
                self._router.demote(url)
            await asyncio.sleep(self._backoff_ms(attempt, headers.get("Retry-After")) / 1000)
            attempt += 1

    async def _send(
        self,
        method: str,
        log: LogId | None,
        path: str,
        data: bytes | None,
        writes: bool,
        extra_ms: int,
        *,
        no_forward: bool = False,
    ) -> tuple[str, int, Mapping[str, str], bytes]:
        session = self._ensure_session()
        # Passing timeout=None would switch aiohttp's timeout off, so always pass one.
        timeout = self._timeout(extra_ms) if extra_ms else self._default_timeout
        headers = self._no_forward_headers if no_forward else self._headers
        failures: list[str] = []
        for url in self._router.candidates(log):
            try:
                async with session.request(
                    method, self._url(url + path), data=data, headers=headers, timeout=timeout,
                    allow_redirects=False,
                ) as resp:
                    raw = await resp.read()
                    return url, resp.status, resp.headers, raw
            except _CONNECT_ERRORS as exc:
                failures.append(f"{url}: {exc}")
                self._router.demote(url)
                self._router.cluster_stale = True
            except (aiohttp.ClientError, TimeoutError) as exc:
                # A node that does not answer in time may be paused or partitioned away.
                self._router.cluster_stale = True
                if writes:
                    raise LogError(
                        Status.TIMEDOUT, f"{url}: {exc!r} after sending; the outcome is unknown"
                    ) from None
                failures.append(f"{url}: {exc!r}")
                self._router.demote(url)
        raise LogError(Status.CONNFAILED, "no node reachable: " + "; ".join(failures))

    def _url(self, text: str) -> URL:
        url = self._urls.get(text)
        if url is None:
            if len(self._urls) >= URLS_CACHED_MAX:
                self._urls.clear()
            url = self._urls[text] = URL(text)
        return url

    def _redirect_target(self, headers: Mapping[str, str], raw: bytes, content_type: str
                         ) -> str | None:
        """The owner's base URL from a redirect: the body's ``sequencer_http``, else the
        ``Location`` header's scheme and host."""
        with contextlib.suppress(LogError):
            http = wire.decode(raw, content_type).data.get("sequencer_http")
            if isinstance(http, str) and http:
                return normalize_url(http, self._router.scheme)
        location = headers.get("Location", "")
        if "://" in location:
            scheme, rest = location.split("://", 1)
            return f"{scheme}://{rest.split('/', 1)[0]}"
        return None

    async def _refresh_cluster(self) -> None:
        """Re-read the cluster view, at most once per ``cluster_refresh_ms_min``."""
        if _now_ms() - self._cluster_refreshed_at_ms < self._cluster_refresh_ms_min:
            return
        self._cluster_refreshed_at_ms = _now_ms()
        self._router.cluster_stale = False
        # On failure routing falls back to the known URLs; the next failure asks again.
        with contextlib.suppress(LogError):
            await self.cluster()

    def _backoff_ms(self, attempt: int, retry_after: str | None) -> float:
        """``retry_after``: an HTTP ``Retry-After`` header (seconds)."""
        digits = retry_after is not None and retry_after.isdigit()
        after_ms = int(retry_after) * 1000 if digits and retry_after is not None else 0
        return self._backoff_after_ms(attempt, after_ms)

    def _backoff_after_ms(self, attempt: int, retry_after_ms: int) -> float:
        """Exponential backoff with jitter, at least the node's ``retry_after_ms`` (capped by
        ``retry_backoff_ms_max``)."""
        backoff_ms = float(min(self._backoff_ms_max, self._backoff_ms_min * (2**attempt)))
        backoff_ms *= self._rng.uniform(0.5, 1.0)
        if retry_after_ms > 0:
            backoff_ms = max(backoff_ms, float(min(retry_after_ms, self._backoff_ms_max)))
        return backoff_ms


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _check_log(log_id: int) -> LogId:
    if not log_id_valid(log_id):
        raise LogError(Status.INVALID_PARAM, f"log id must be an int in 1..2**62-1: {log_id!r}")
    return LogId(log_id)


def _check_payload(payload: bytes) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    raise LogError(Status.INVALID_PARAM, f"payload must be bytes, not {type(payload).__name__}")


def _add_optional(
    request: dict[str, Any], key: str | None, producer_id: str | None, producer_seq: int | None
) -> None:
    if key is not None:
        request["key"] = key
    if producer_id is not None:
        request["producer_id"] = producer_id
    if producer_seq is not None:
        request["producer_seq"] = producer_seq


def _checked_key(key: str | None) -> str | None:
    if key is not None:
        invalid = check_key(key)
        if invalid is not None:
            raise LogError(invalid.status, invalid.message)
    return key


def _message(log: LogId, payloads: tuple[bytes, ...], key: str | None,
             producer_id: str | None, producer_seq: int | None) -> Append:
    """The APPEND of a binary append, after the checks a node would make on its arguments
    (wrong types or out-of-range values could not even be encoded)."""
    invalid = check_key(key) or check_producer(producer_id, producer_seq)
    if invalid is not None:
        raise LogError(invalid.status, invalid.message)
    # msgpack adds at most 5 bytes per payload; the rest of a frame is far below 64 KiB.
    frame_bytes = sum(map(len, payloads)) + 5 * len(payloads) + 65_536
    if frame_bytes > FRAME_BYTES_MAX:
        raise LogError(Status.TOOBIG, f"{len(payloads)} payloads do not fit one frame "
                                      f"({FRAME_BYTES_MAX} bytes); nothing was sent")
    return Append(log_id=log, payloads=payloads, key=key, hops=0, producer_id=producer_id,
                  producer_seq=producer_seq or 0, no_forward=True)


def _append_result(answer: Appended) -> AppendResult:
    return AppendResult(lsn=answer.first_lsn, timestamp_ms=answer.timestamp_ms)


def _single_result(lsn: int, timestamp_ms: int) -> AppendResult:
    """The result of one append of a group (``seqlog.binary_appends``)."""
    return AppendResult(lsn=Lsn(lsn), timestamp_ms=timestamp_ms)


def _batch_result(answer: Appended) -> BatchResult:
    return BatchResult(first_lsn=answer.first_lsn, last_lsn=answer.last_lsn,
                       count=answer.last_lsn - answer.first_lsn + 1,
                       timestamp_ms=answer.timestamp_ms)
