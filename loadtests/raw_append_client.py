"""A minimal HTTP/1.1 append client for benchmarks: one keep-alive connection per worker, the
request bytes built once per log, nothing but the status line and Content-Length parsed.

Why: ``seqlog.Client`` (on aiohttp's client) spends ~300 us of CPU per append on this machine,
as much as the sequencer node spends serving it, and the benchmark client shares the two cores
with the cluster. This client costs a fraction of that, so ``bench_append --client raw``
measures the servers rather than the client (like the wrk spot check, but with the same
closed-loop semantics and JSON output). It is not a general client: no retries, no redirects
after the first request, no chunked answers (Seqlog answers with a Content-Length); anything
unexpected is counted as an error by status name, or raises.

Each log's sequencer is found once: the first request goes to a seed URL with
``X-Seqlog-No-Forward: 1`` and follows a 307 to the owner (``sequencer_http``).

``RawAppender.closed_loop`` is the benchmark's fast path: one ``asyncio.Protocol`` per
connection that sends its next request from the callback that reads the previous answer, so a
request costs no coroutine step, Task or future (about 5 us of CPU instead of about 18 with
``append``'s streams on this machine: the load generator shares the two cores with the
cluster, so what it spends the servers do not get).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import msgpack

from seqlog import body as wire
from shared.status import LogError, Status

HEADER_BYTES_MAX = 16 * 1024
"""Longest response head (status line and headers) accepted."""
BODY_BYTES_MAX = 1024 * 1024
"""Largest response body accepted (append answers are a few dozen bytes)."""
CONNECT_TIMEOUT_S = 5.0
REDIRECTS_MAX = 3


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.hostname is None:
        raise ValueError(f"no host in {url!r}")
    return parts.hostname, parts.port or 80


def append_request(host: str, log_id: int, payloads: list[bytes]) -> bytes:
    """The complete bytes of one append (one payload) or append-batch request."""
    body: dict[str, bytes | list[bytes]]
    if len(payloads) == 1:
        path, body = f"/v1/logs/{log_id}/append", {"payload": payloads[0]}
    else:
        path, body = f"/v1/logs/{log_id}/append-batch", {"payloads": payloads}
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    token = os.environ.get("SEQLOG_TOKEN")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {wire.MSGPACK}\r\n"
            f"Accept: {wire.MSGPACK}\r\nX-Seqlog-No-Forward: 1\r\n{auth}"
            f"Content-Length: {len(packed)}\r\n\r\n")
    return head.encode("ascii") + packed


class RawConnection:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        host, port = _host_port(url)
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port, limit=HEADER_BYTES_MAX)
        return cls(reader, writer)

    async def request(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``data`` (a whole request); the answer's code, lower-cased headers, body."""
        self._writer.write(data)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
            raise LogError(Status.BADMSG, f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > BODY_BYTES_MAX:
            raise LogError(Status.BADMSG, f"answer without a usable Content-Length: {length!r}")
        body = await self._reader.readexactly(int(length))
        return int(status_line[1]), headers, body

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


async def find_owner(seed_urls: list[str], log_id: int, request: bytes) -> str:
    """The URL of ``log_id``'s sequencer: ask a seed with no_forward, follow its 307."""
    url = seed_urls[0]
    for _ in range(REDIRECTS_MAX):
        conn = await RawConnection.open(url)
        try:
            code, headers, raw = await conn.request(request)
        finally:
            await conn.close()
        if code in (307, 308):
            target = wire.decode(raw, headers.get("content-type", wire.JSON)).data.get(
                "sequencer_http")
            if not isinstance(target, str) or not target:
                raise LogError(Status.BADMSG, "redirect without sequencer_http")
            url = target if "://" in target else f"http://{target}"
            continue
        if code != 200:
            raise wire.error_from(code, raw, headers.get("content-type", wire.JSON))
        return url
    raise LogError(Status.NOSEQUENCER, f"log {log_id}: redirected {REDIRECTS_MAX} times")


def check_answer(code: int, headers: dict[str, str], raw: bytes) -> None:
    """Raise the ``LogError`` of a non-200 answer."""
    if code != 200:
        raise wire.error_from(code, raw, headers.get("content-type", wire.JSON))


class RawAppender:
    """Appends over pooled ``RawConnection``s: at most one request per connection at a time,
    as many connections per sequencer as requests in flight to it."""

    def __init__(self, seed_urls: list[str]) -> None:
        self._seeds = seed_urls
        self._owners: dict[int, tuple[str, bytes]] = {}
        """Per log: its sequencer's URL and the request bytes of its append."""
        self._idle: dict[str, list[RawConnection]] = {}

    async def prepare(self, log_id: int, payloads: list[bytes]) -> None:
        """Build the log's request and find its sequencer (one request, which appends)."""
        host, port = _host_port(self._seeds[0])
        seed_request = append_request(f"{host}:{port}", log_id, payloads)
        owner = await find_owner(self._seeds, log_id, seed_request)
        owner_host, owner_port = _host_port(owner)
        self._owners[log_id] = (owner, append_request(f"{owner_host}:{owner_port}", log_id,
                                                      payloads))

    async def append(self, log_id: int) -> None:
        """One append of the prepared payloads; raises ``LogError`` unless answered 200."""
        url, request = self._owners[log_id]
        idle = self._idle.setdefault(url, [])
        conn = idle.pop() if idle else await RawConnection.open(url)
        try:
            code, headers, raw = await conn.request(request)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            await conn.close()
            raise LogError(Status.TIMEDOUT, f"{url}: {exc!r}; the outcome is unknown") from None
        if headers.get("connection", "").lower() == "close":
            await conn.close()
        else:
            idle.append(conn)
        check_answer(code, headers, raw)

    def owner(self, log_id: int) -> str:
        """The URL of a prepared log's sequencer."""
        return self._owners[log_id][0]

    async def loop_connections(self, log_ids: list[int], connections: int
                               ) -> LoopConnections:
        """``connections`` connections for ``LoopConnections.run``, connection *k* appending
        to ``log_ids[k % len(log_ids)]`` (each prepared) at its sequencer."""
        loop = asyncio.get_running_loop()
        conns: list[_LoopConnection] = []
        try:
            for k in range(connections):
                url, request = self._owners[log_ids[k % len(log_ids)]]
                host, port = _host_port(url)
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    _, conn = await loop.create_connection(
                        functools.partial(_LoopConnection, request), host, port)
                conns.append(conn)
        except BaseException:
            LoopConnections(conns).close()
            raise
        return LoopConnections(conns)

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                await conn.close()
        self._idle.clear()


@dataclass(slots=True)
class LoopResult:
    """What ``LoopConnections.run`` measured: one latency per request answered 200 (seconds,
    from just before its bytes were written to its answer's last byte), and errors by status
    name (a non-200 answer; ``CONNFAILED`` for a request whose connection went away)."""

    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


_CONTENT_LENGTH = b"\r\ncontent-length:"
_CONTENT_TYPE = b"\r\ncontent-type:"


def _header(head: bytes, name: bytes) -> bytes | None:
    """A header's value in a lower-cased response head (``name`` is ``b"\\r\\nname:"``)."""
    at = head.find(name)
    if at < 0:
        return None
    line_end = head.find(b"\r\n", at + 2)
    return head[at + len(name):line_end if line_end >= 0 else None].strip()


class _LoopConnection(asyncio.Protocol):
    """One keep-alive connection of a closed loop: writes a request, finds the answer's end
    from its Content-Length, and hands it to the loop, which writes the next request at once."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.run: _Run | None = None
        self.transport: asyncio.Transport | None = None
        self.sent_s = 0.0
        self.outstanding = False
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self) -> None:
        assert self.transport is not None
        self.outstanding = True
        self.sent_s = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            self._buffer = buffer
            return
        head = buffer[:end].lower()
        length = _header(head, _CONTENT_LENGTH)
        if length is None or not length.isdigit() or int(length) > BODY_BYTES_MAX:
            self._broken()
            return
        total = end + 4 + int(length)
        if len(buffer) < total:
            self._buffer = buffer
            return
        self._buffer = b""
        latency_s = time.perf_counter() - self.sent_s
        if len(buffer) > total or not self.outstanding:
            self._broken()  # one request at a time: nothing may follow its answer
            return
        self.outstanding = False
        error = None
        if buffer[9:12] != b"200" or not buffer.startswith(b"HTTP/1."):
            content_type = _header(head, _CONTENT_TYPE)
            error = _status_name(buffer[9:12], buffer[end + 4:total],
                                 wire.JSON if content_type is None
                                 else content_type.decode("latin-1"))
        if _header(head, b"\r\nconnection:") == b"close" and self.transport is not None:
            self.transport.close()
            self.transport = None
        if self.run is not None:
            self.run.answered(self, latency_s, error)

    def _broken(self) -> None:
        self._buffer = b""
        if self.transport is not None:
            self.transport.abort()  # connection_lost counts the request

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.run is not None:
            self.run.lost(self)


def _status_name(code: bytes, raw: bytes, content_type: str) -> str:
    """The status name of a non-200 answer, as ``check_answer`` would raise it."""
    if not code.isdigit():
        return Status.BADMSG.name
    try:
        error = wire.error_from(int(code), raw, content_type)
    except Exception:  # an undecodable error body is itself the error
        return Status.BADMSG.name
    return error.status.name


class _Run:
    """``requests`` requests kept going over the connections, one outstanding on each."""

    def __init__(self, requests: int, result: LoopResult) -> None:
        self._left = requests
        self.result = result
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._busy: set[_LoopConnection] = set()

    def start(self, conn: _LoopConnection) -> None:
        conn.run = self
        self._busy.add(conn)
        self._next(conn)

    def _next(self, conn: _LoopConnection) -> None:
        if self._left > 0 and conn.transport is not None:
            self._left -= 1
            conn.send()
            return
        self._busy.discard(conn)
        conn.run = None
        if not self._busy and not self.done.done():
            self.done.set_result(None)

    def answered(self, conn: _LoopConnection, latency_s: float, error: str | None) -> None:
        if error is None:
            self.result.latencies_s.append(latency_s)
        else:
            self.result.errors[error] += 1
        self._next(conn)

    def lost(self, conn: _LoopConnection) -> None:
        if conn.outstanding:
            # Written, never answered: the outcome is unknown.
            conn.outstanding = False
            self.result.errors[Status.CONNFAILED.name] += 1
        self._next(conn)


class LoopConnections:
    """Kept-alive connections for closed loops (``RawAppender.loop_connections``)."""

    def __init__(self, conns: list[_LoopConnection]) -> None:
        self._conns = conns

    async def run(self, requests: int) -> LoopResult:
        """Send ``requests`` requests, each connection writing its next one as soon as its
        previous one is answered; returns when all are answered (or their connections gone).
        """
        result = LoopResult()
        run = _Run(requests, result)
        live = [c for c in self._conns if c.transport is not None]
        if not live:
            result.errors[Status.CONNFAILED.name] += requests
            return result
        for conn in live:
            run.start(conn)
        await run.done
        return result

    def close(self) -> None:
        for conn in self._conns:
            if conn.transport is not None:
                conn.transport.close()


async def _print_owner(seed: str, log_id: int) -> None:
    appender = RawAppender([seed])
    try:
        await appender.prepare(log_id, [b"owner probe"])
        print(appender.owner(log_id))
    finally:
        await appender.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtests.raw_append_client SEED_URL LOG_ID``: print the URL of the log's
    sequencer (one append goes to it), e.g. to point wrk (``loadtests/wrk_append.lua``) at it:
    a request to another node would be forwarded, one more hop than the benchmark means."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m loadtests.raw_append_client SEED_URL LOG_ID", file=sys.stderr)
        return 2
    asyncio.run(_print_owner(args[0], int(args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
