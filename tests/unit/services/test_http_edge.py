"""The lean HTTP edge (services.http_edge) on the wire: pipelining answered in order (also
across a handover to aiohttp), keep-alive, Connection: close, HTTP/1.0, malformed requests,
size caps, the body timeout, the callback-style append, and a fuzz test of the parser path."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import httptools
import msgpack
import orjson
import pytest
from aiohttp import web
from http_fakes import API, BATCH, DEADLINE_S, FIRST_LSN, ApiClient, FakeLogService, serve
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from frontend.outcomes import AppendOutcome
from services import http_edge
from services.http_api import create_api_app
from services.http_edge import REQUEST_HEAD_BYTES_MAX, EdgeRunner
from shared.compression import Codec, compress_batch
from shared.status import Status
from shared.types import LogId, Lsn


@dataclass
class Answer:
    code: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> object:
        return orjson.loads(self.body)


class _Answers:
    """httptools response-parser callbacks collecting every answer on a connection."""

    def __init__(self) -> None:
        self.done: list[Answer] = []
        self.parser = httptools.HttpResponseParser(self)
        self._current = Answer(0)

    def on_message_begin(self) -> None:
        self._current = Answer(0)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._current.headers[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self._current.code = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._current.body += body

    def on_message_complete(self) -> None:
        if self._current.code != 100:
            self.done.append(self._current)


async def exchange(port: int, data: bytes, count: int, *, expect_close: bool = False,
                   ) -> list[Answer]:
    """Write ``data`` at once and read ``count`` answers (and, if asked, the close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = _Answers()
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            while len(answers.done) < count:
                chunk = await reader.read(65536)
                assert chunk, f"closed after {len(answers.done)} of {count} answers"
                answers.parser.feed_data(chunk)
            if expect_close:
                assert await reader.read() == b""
    finally:
        writer.close()
    return answers.done


def append(payload: bytes, *, log_id: int = 7, extra: str = "", version: str = "1.1") -> bytes:
    body = orjson.dumps({"payload": base64.b64encode(payload).decode()})
    return (f"POST /v1/logs/{log_id}/append HTTP/{version}\r\nHost: x\r\n"
            f"Content-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


async def test_pipelined_appends_are_answered_in_order(
    client: ApiClient, fake: FakeLogService
) -> None:
    requests = [append(f"r{i}".encode()) for i in range(20)]
    answers = await exchange(client.port, b"".join(requests), 20)
    assert [a.code for a in answers] == [200] * 20
    assert [a.json()["lsn"] for a in answers] == [FIRST_LSN + i for i in range(20)]  # type: ignore[index]
    assert [c.payloads for c in fake.appends] == [(f"r{i}".encode(),) for i in range(20)]


async def test_answers_finishing_out_of_order_are_written_in_request_order(
    client: ApiClient, fake: FakeLogService
) -> None:
    # The long poll finishes last internally (after the append and the tail), yet its
    # answer must come first; the append wakes it.
    data = get("/v1/logs/7/records?from=1&wait_ms=1500") + get("/v1/logs/7/tail") + append(b"x")
    answers = await exchange(client.port, data, 3)
    assert [a.code for a in answers] == [200, 200, 200]
    records = answers[0].json()
    assert [r["payload"] for r in records["records"]] == [base64.b64encode(b"x").decode()]  # type: ignore[index]
    assert answers[1].json()["release_lsn"] in (0, FIRST_LSN)  # type: ignore[index]
    assert answers[2].json()["lsn"] == FIRST_LSN  # type: ignore[index]


async def test_pipelined_mix_of_hot_and_other_routes_is_answered_in_order(
    client: ApiClient, fake: FakeLogService
) -> None:
    data = (append(b"a") + get("/healthz") + append(b"b") + get("/v1/nope")
            + get("/v1/logs/7/tail") + append(b"c", extra="Connection: close\r\n"))
    answers = await exchange(client.port, data, 6, expect_close=True)
    assert [a.code for a in answers] == [200, 200, 200, 404, 200, 200]
    assert answers[1].json() == {"status": "OK"}
    assert answers[3].json()["status"] == "NOTFOUND"  # type: ignore[index]
    assert [a.json()["lsn"] for a in (answers[0], answers[2], answers[5])] == [  # type: ignore[index]
        FIRST_LSN, FIRST_LSN + 1, FIRST_LSN + 2]
    assert answers[4].json()["release_lsn"] == FIRST_LSN + 1  # type: ignore[index]


async def test_keep_alive_serves_sequential_requests_on_one_connection(
    client: ApiClient,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    answers = _Answers()
    try:
        for i in range(3):
            writer.write(append(f"k{i}".encode()))
            async with asyncio.timeout(DEADLINE_S):
                while len(answers.done) <= i:
                    answers.parser.feed_data(await reader.read(65536))
    finally:
        writer.close()
    assert [a.json()["lsn"] for a in answers.done] == [FIRST_LSN + i for i in range(3)]  # type: ignore[index]
    assert all("connection" not in a.headers for a in answers.done)


async def test_connection_close_and_http_10_close_after_the_answer(client: ApiClient) -> None:
    for request in (append(b"c", extra="Connection: close\r\n"), append(b"d", version="1.0")):
        # Anything after the closing request is not served.
        answers = await exchange(client.port, request + append(b"never"), 1, expect_close=True)
        assert answers[0].code == 200
        assert answers[0].headers["connection"] == "close"


async def test_http_10_keep_alive_is_honoured(client: ApiClient) -> None:
    request = append(b"k", version="1.0", extra="Connection: keep-alive\r\n")
    answers = await exchange(client.port, request + request, 2)
    assert [a.code for a in answers] == [200, 200]


async def test_answers_carry_the_contract_headers(client: ApiClient, fake: FakeLogService) -> None:
    fake.redirect_to = "127.0.0.1:9"
    answers = await exchange(
        client.port, append(b"r", extra="X-Seqlog-No-Forward: 1\r\n")
        + append(b"q").replace(b"/append ", b"/append?no_forward=1 "), 2)
    for answer in answers:
        assert answer.code == 307
        assert answer.headers["x-seqlog-sequencer"] == "n2"
        assert answer.headers["location"].startswith("http://127.0.0.1:9/v1/logs/7/append")
        assert "date" in answer.headers
    assert answers[1].headers["location"].endswith("?no_forward=1")
    fake.redirect_to = None
    fake.fail_with = Status.SEQNOBUFS
    answers = await exchange(client.port, append(b"s"), 1)
    assert answers[0].code == 429
    assert answers[0].headers["retry-after"] == str(API.retry_after_s)


@pytest.mark.parametrize(("request_bytes", "code", "status"), [
    (b"BLAH / HTTP/1.1\r\n\r\n", 400, "BADMSG"),
    (b"GET /v1/logs/7/tail HTTP/9.9\r\n\r\n", 400, "BADMSG"),
    (b"POST /v1/logs/7/append HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "BADMSG"),
    (b"POST /v1/logs/7/append HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
     400, "BADMSG"),
    (b"POST /v1/logs/7/append HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
     400, "BADMSG"),
    (b"POST /v1/logs/7/append HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
     % (API.request_bytes_max + 1), 413, "TOOBIG"),
    (b"GET /v1/logs/7/tail HTTP/1.1\r\nX-Big: " + b"a" * REQUEST_HEAD_BYTES_MAX + b"\r\n\r\n",
     400, "BADMSG"),
    (b"GET /v1/logs/7/tail HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 400, "BADMSG"),
    (b"POST /v1/logs/7/append HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
     "BADMSG"),
])
async def test_malformed_requests_get_a_clear_4xx_and_a_close(
    client: ApiClient, request_bytes: bytes, code: int, status: str
) -> None:
    # An append before it on the same connection is still answered first.
    answers = await exchange(client.port, append(b"first") + request_bytes, 2, expect_close=True)
    assert answers[0].code == 200
    assert answers[1].code == code, answers[1]
    assert answers[1].json()["status"] == status  # type: ignore[index]
    assert answers[1].headers["connection"] == "close"
    async with client.get("/healthz") as resp:
        assert resp.status == 200


async def test_chunked_bodies_are_read_and_capped(client: ApiClient, fake: FakeLogService) -> None:
    body = orjson.dumps({"payload": base64.b64encode(b"chunky").decode()})
    chunked = (b"POST /v1/logs/7/append HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:5], body[5:]))
               + b"0\r\n\r\n")
    answers = await exchange(client.port, chunked + chunked, 2)
    assert [a.code for a in answers] == [200, 200]
    assert fake.appends[0].payloads == (b"chunky",)
    big = b"x" * 8000
    too_big = (b"POST /v1/logs/7/append HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n" % (len(big), big) * (API.request_bytes_max // 8000 + 2))
    answers = await exchange(client.port, too_big, 1, expect_close=True)
    assert (answers[0].code, answers[0].json()["status"]) == (413, "TOOBIG")  # type: ignore[index]


async def test_slow_request_heads_and_bodies_are_refused() -> None:
    async with serve(FakeLogService(), body_read_timeout_ms=100) as client:
        for partial in (b"POST /v1/logs/7/append HTTP/1.1\r\nHost: x\r\nConte",
                        b"GET /v1/logs/7/tai"):
            answers = await exchange(client.port, partial, 1, expect_close=True)
            assert (answers[0].code, answers[0].json()["status"]) == (400, "BADMSG")  # type: ignore[index]


async def test_expect_100_continue_gets_a_continue(client: ApiClient) -> None:
    request = append(b"e", extra="Expect: 100-continue\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        writer.write(head + b"\r\n\r\n")
        async with asyncio.timeout(DEADLINE_S):
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


class _NowaitService(FakeLogService):
    """Has the callback-style append the lean edge prefers; records which one it got."""

    def __init__(self) -> None:
        super().__init__()
        self.nowait_calls = 0
        self.async_calls = 0

    async def append(self, *args: object, **kwargs: object) -> AppendOutcome:
        self.async_calls += 1
        return await super().append(*args, **kwargs)  # type: ignore[arg-type]

    def append_nowait(self, log_id: LogId, payloads: tuple[bytes, ...], key: str | None, *,
                      producer: tuple[str, int] | None = None, no_forward: bool = False,
                      done: Callable[[AppendOutcome], None]) -> None:
        self.nowait_calls += 1
        lsn = Lsn(FIRST_LSN + self.nowait_calls - 1)
        outcome = AppendOutcome(status=Status.OK, first_lsn=lsn,
                                last_lsn=Lsn(lsn + len(payloads) - 1), timestamp_ms=1,
                                sequencer_node=self.node_id)
        asyncio.get_running_loop().call_soon(done, outcome)


async def test_appends_use_the_callback_entry_without_a_task_per_request() -> None:
    service = _NowaitService()
    async with serve(service) as client:
        tasks_before = len(asyncio.all_tasks())
        batch = (b"POST /v1/logs/7/append-batch HTTP/1.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n")
        body = orjson.dumps({"payloads": [base64.b64encode(b"a").decode()] * 3})
        answers = await exchange(client.port, append(b"x") * 10 + batch % len(body) + body, 11)
        assert len(asyncio.all_tasks()) <= tasks_before + 1
    assert (service.nowait_calls, service.async_calls) == (11, 0)
    assert answers[-1].json()["count"] == 3  # type: ignore[index]


# ---- fuzz --------------------------------------------------------------------------------

_valid = [append(b"v"), get("/v1/logs/7/tail"), get("/v1/logs/7/records?from=1"),
          get("/healthz"), BATCH.encode()]


def _mutate(data: bytes, cuts: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(data)
    for position, insert in cuts:
        at = position % (len(out) + 1)
        out[at:at + len(insert)] = insert
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(
    prefix=st.lists(st.sampled_from(_valid), max_size=3),
    mutated=st.sampled_from(_valid),
    cuts=st.lists(st.tuples(st.integers(0, 300), st.binary(min_size=1, max_size=8)),
                  max_size=3),
    tail=st.binary(max_size=64),
)
async def test_fuzzed_requests_never_get_5xx_and_leave_the_node_healthy(
    prefix: list[bytes], mutated: bytes, cuts: list[tuple[int, bytes]], tail: bytes,
) -> None:
    # A closing request ends the exchange: the server closes after answering it, or after
    # refusing whatever the fuzzed bytes made of it (an unfinished body times out fast).
    data = (b"".join(prefix) + _mutate(mutated, cuts) + tail
            + get("/healthz", "Connection: close\r\n"))
    async with serve(FakeLogService(), body_read_timeout_ms=200) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        answers = _Answers()
        try:
            writer.write(data)
            async with asyncio.timeout(DEADLINE_S):
                while chunk := await reader.read(65536):
                    answers.parser.feed_data(chunk)
        finally:
            writer.close()
        assert answers.done, data
        assert all(a.code < 500 for a in answers.done), (data, answers.done)
        async with client.get("/healthz") as resp:
            assert resp.status == 200


@pytest.mark.parametrize("anchor_bytes_max", [http_edge.ANCHOR_BYTES_MAX, 100])
async def test_handover_finds_the_request_boundary_in_trickled_pipelines(
    client: ApiClient, fake: FakeLogService, monkeypatch: pytest.MonkeyPatch,
    anchor_bytes_max: int,
) -> None:
    # Bytes arrive in small pieces, so reads end inside requests; with a small anchor bound
    # the edge re-finds request boundaries as it goes. The handover must still start aiohttp
    # exactly at the /healthz request.
    monkeypatch.setattr(http_edge, "ANCHOR_BYTES_MAX", anchor_bytes_max)
    data = b"".join(append(f"t{i}".encode()) for i in range(12)) + get("/healthz") + append(
        b"last", extra="Connection: close\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    answers = _Answers()
    try:
        for at in range(0, len(data), 13):
            writer.write(data[at:at + 13])
            await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            while chunk := await reader.read(65536):
                answers.parser.feed_data(chunk)
    finally:
        writer.close()
    assert [a.code for a in answers.done] == [200] * 14
    assert answers.done[12].json() == {"status": "OK"}
    assert [c.payloads[0] for c in fake.appends] == [
        *(f"t{i}".encode() for i in range(12)), b"last"]


def test_message_end_counts_whole_requests() -> None:
    one, two = append(b"a"), get("/healthz")
    raw = one + two + one[:10]
    assert http_edge._message_end(raw, 0) == 0
    assert http_edge._message_end(raw, 1) == len(one)
    assert http_edge._message_end(raw, 2) == len(one) + len(two)


async def test_idle_keep_alive_connections_are_closed(
    client: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_edge, "KEEPALIVE_TIMEOUT_S", 0.1)
    monkeypatch.setattr(http_edge, "SWEEP_INTERVAL_S", 0.05)
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        async with asyncio.timeout(DEADLINE_S):
            assert await reader.read() == b""
    finally:
        writer.close()


async def test_graceful_shutdown_answers_in_flight_requests_and_closes_the_rest() -> None:
    fake = FakeLogService()
    app = create_api_app(fake, API, CollectorRegistry())
    runner = EdgeRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site.port
    loop = asyncio.get_running_loop()
    idle = await asyncio.open_connection("127.0.0.1", port)
    short = await asyncio.open_connection("127.0.0.1", port)
    long = await asyncio.open_connection("127.0.0.1", port)
    try:
        # Ends within the shutdown timeout: answered. Longer than it: cut.
        short[1].write(get("/v1/logs/7/records?from=1&wait_ms=200"))
        long[1].write(get("/v1/logs/7/records?from=1&wait_ms=1900"))
        async with asyncio.timeout(DEADLINE_S):
            while fake.waiters_count < 2:
                assert short[1].transport is not None  # poll for the state, bounded above
                await asyncio.sleep(0.01)
            started_s = loop.time()
            await runner.cleanup()
            assert loop.time() - started_s < 1.5
            assert await idle[0].read() == b""
            assert (await short[0].read()).startswith(b"HTTP/1.1 200 OK")
            assert await long[0].read() == b""
    finally:
        for _, writer in (idle, short, long):
            writer.close()


async def test_a_failing_parser_callback_is_a_logged_500_not_a_stuck_connection(
    client: ApiClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: object, body: bytes) -> None:
        raise RuntimeError("bug in on_body")

    monkeypatch.setattr(http_edge._Connection, "on_body", broken)
    with caplog.at_level(logging.ERROR, logger="services.http_edge"):
        answers = await exchange(client.port, append(b"x"), 1, expect_close=True)
    assert (answers[0].code, answers[0].json()["status"]) == (500, "INTERNAL")  # type: ignore[index]
    assert "bug in on_body" in caplog.text


async def test_lean_routes_are_counted_in_the_same_metrics(client: ApiClient) -> None:
    data = (append(b"m") + get("/v1/logs/7/tail") + get("/v1/logs/7/records?from=1")
            + get("/v1/logs/x/records") + get("/metrics", "Connection: close\r\n"))
    answers = await exchange(client.port, data, 5, expect_close=True)
    assert [a.code for a in answers] == [200, 200, 200, 400, 200]
    text = answers[4].body.decode()
    for route, code in (("append", 200), ("tail", 200), ("records", 200), ("records", 400)):
        method = "POST" if route == "append" else "GET"
        line = (f'seqlog_http_requests_total{{code="{code}",method="{method}",'
                f'route="/v1/logs/{{log_id}}/{route}"}} 1.0')
        assert line in text, line
    assert "seqlog_http_requests_in_flight 1.0" in text


_PIPELINE = [
    (append(b"a"), 200), (get("/healthz"), 200), (get("/v1/logs/7/tail"), 200),
    (append(b"b"), 200), (get("/v1/logs/x/tail"), 400), (get("/v1/nope"), 404),
    (get("/v1/logs/7/records?from=1"), 200),
]


@settings(max_examples=60, deadline=None)
@given(
    order=st.lists(st.integers(0, len(_PIPELINE) - 1), min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 2000), max_size=12),
)
async def test_any_split_of_a_pipeline_gets_the_same_answers_in_order(
    order: list[int], cuts: list[int],
) -> None:
    requests = [_PIPELINE[i] for i in order]
    data = b"".join(r for r, _ in requests) + get("/healthz", "Connection: close\r\n")
    points = sorted({c % len(data) for c in cuts} | {0, len(data)})
    async with serve(FakeLogService()) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        answers = _Answers()
        try:
            for lo, hi in itertools.pairwise(points):
                writer.write(data[lo:hi])
                await writer.drain()
            async with asyncio.timeout(DEADLINE_S):
                while chunk := await reader.read(65536):
                    answers.parser.feed_data(chunk)
        finally:
            writer.close()
    assert [a.code for a in answers.done] == [code for _, code in requests] + [200]


async def test_a_compressed_batch_on_the_lean_path_gets_one_lsn_per_record(
    client: ApiClient, fake: FakeLogService
) -> None:
    records = [b"line %d " % i * 20 for i in range(8)]
    blob = compress_batch(records, Codec.LZ4)
    assert blob is not None
    body = msgpack.packb({"compression": "lz4", "records": len(records),
                          "compressed_payloads": blob}, use_bin_type=True)
    request = (b"POST /v1/logs/7/append-batch HTTP/1.1\r\nContent-Type: application/msgpack\r\n"
               b"Accept: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    answers = await exchange(client.port, append(b"before") + request + append(b"after"), 3)
    assert [a.code for a in answers] == [200, 200, 200]
    batch = answers[1].json()
    assert batch == {"first_lsn": FIRST_LSN + 1, "last_lsn": FIRST_LSN + 8, "count": 8,  # type: ignore[comparison-overlap]
                     "timestamp_ms": batch["timestamp_ms"]}  # type: ignore[index]
    assert answers[2].json()["lsn"] == FIRST_LSN + 9  # type: ignore[index]
    assert [c.payloads for c in fake.appends][1] == tuple(records)
