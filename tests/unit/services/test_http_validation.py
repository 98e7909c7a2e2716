"""Untrusted input at the HTTP edge: every bad request gets a clear 4xx, never a 500 or a hang."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import orjson
import pytest
from http_fakes import (
    API,
    APPEND,
    BATCH,
    DEADLINE_S,
    JSON_TYPE,
    MSGPACK_TYPE,
    RECORDS,
    ApiClient,
    FakeLogService,
    b64,
    serve,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.limits import KEY_BYTES_MAX


async def _expect(resp_ctx: Any, code: int, status: str) -> None:
    async with resp_ctx as resp:
        assert resp.status == code, await resp.text()
        assert resp.content_type in (JSON_TYPE, MSGPACK_TYPE)
        raw = await resp.read()
        body = msgpack.unpackb(raw) if resp.content_type == MSGPACK_TYPE else orjson.loads(raw)
        assert body["status"] == status, body
        assert isinstance(body["message"], str) and body["message"]


def _json(doc: object) -> tuple[bytes, str]:
    return orjson.dumps(doc), JSON_TYPE


def _mp(doc: object) -> tuple[bytes, str]:
    return msgpack.packb(doc, use_bin_type=True), MSGPACK_TYPE


OK_PAYLOAD = b64(b"x")
BAD_BODIES: list[tuple[str, str, tuple[bytes, str], int, str]] = [
    # (case, path, (body, content type), HTTP code, status name)
    ("log id not a number", "/v1/logs/abc/append", _json({"payload": OK_PAYLOAD}), 400,
     "INVALID_PARAM"),
    ("log id zero", "/v1/logs/0/append", _json({"payload": OK_PAYLOAD}), 400, "INVALID_PARAM"),
    ("log id 2**62", f"/v1/logs/{2**62}/append", _json({"payload": OK_PAYLOAD}), 400,
     "INVALID_PARAM"),
    ("log id negative", "/v1/logs/-1/append", _json({"payload": OK_PAYLOAD}), 400,
     "INVALID_PARAM"),
    ("log id fraction", "/v1/logs/1.5/append-batch", _json({"payloads": [OK_PAYLOAD]}), 400,
     "INVALID_PARAM"),
    ("log id unicode digit", "/v1/logs/%D9%A1/append", _json({"payload": OK_PAYLOAD}), 400,
     "INVALID_PARAM"),
    ("log id huge", f"/v1/logs/{'9' * 400}/append", _json({"payload": OK_PAYLOAD}), 400,
     "INVALID_PARAM"),
    ("empty body", APPEND, (b"", JSON_TYPE), 400, "BADMSG"),
    ("bad JSON", APPEND, (b'{"payload": ', JSON_TYPE), 400, "BADMSG"),
    ("bad msgpack", APPEND, (b"\xc1", MSGPACK_TYPE), 400, "BADMSG"),
    ("msgpack trailing bytes", APPEND, (_mp({"payload": b"x"})[0] + b"\x00", MSGPACK_TYPE),
     400, "BADMSG"),
    ("JSON sent as msgpack", APPEND, (orjson.dumps({"payload": OK_PAYLOAD}), MSGPACK_TYPE),
     400, "BADMSG"),
    ("not a map", APPEND, _json([OK_PAYLOAD]), 400, "BADMSG"),
    ("unknown content type", APPEND, (orjson.dumps({"payload": OK_PAYLOAD}), "text/plain"),
     400, "BADMSG"),
    ("missing payload", APPEND, _json({"payloads": [OK_PAYLOAD]}), 400, "BADMSG"),
    ("payload null", APPEND, _json({"payload": None}), 400, "BADMSG"),
    ("payload int", APPEND, _json({"payload": 5}), 400, "BADMSG"),
    ("payload list", APPEND, _json({"payload": [1, 2]}), 400, "BADMSG"),
    ("payload str in msgpack", APPEND, _mp({"payload": "text"}), 400, "BADMSG"),
    ("payload bin ext in msgpack", APPEND, _mp({"payload": msgpack.ExtType(5, b"x")}), 400,
     "BADMSG"),
    ("base64 unpadded", APPEND, _json({"payload": "YWI"}), 400, "BADMSG"),
    ("base64 urlsafe", APPEND, _json({"payload": "-_-_"}), 400, "BADMSG"),
    ("base64 non-ascii", APPEND, _json({"payload": "ÿÿÿÿ"}), 400, "BADMSG"),
    ("base64 whitespace", APPEND, _json({"payload": "YW I="}), 400, "BADMSG"),
    ("payload too big", APPEND, _json({"payload": b64(b"x" * (API.payload_bytes_max + 1))}),
     413, "TOOBIG"),
    ("msgpack payload too big", APPEND, _mp({"payload": b"x" * (API.payload_bytes_max + 1)}),
     413, "TOOBIG"),
    ("key int", APPEND, _json({"payload": OK_PAYLOAD, "key": 5}), 400, "BADMSG"),
    ("key bin", APPEND, _mp({"payload": b"x", "key": b"k"}), 400, "BADMSG"),
    ("key too long", APPEND, _json({"payload": OK_PAYLOAD, "key": "k" * (KEY_BYTES_MAX + 1)}),
     400, "INVALID_PARAM"),
    ("key too long in bytes", APPEND,
     _json({"payload": OK_PAYLOAD, "key": "é" * (KEY_BYTES_MAX // 2 + 1)}), 400,
     "INVALID_PARAM"),
    ("producer_id int", APPEND,
     _json({"payload": OK_PAYLOAD, "producer_id": 3, "producer_seq": 1}), 400, "BADMSG"),
    ("producer_seq str", APPEND,
     _json({"payload": OK_PAYLOAD, "producer_id": "p", "producer_seq": "1"}), 400, "BADMSG"),
    ("producer_seq bool", APPEND,
     _json({"payload": OK_PAYLOAD, "producer_id": "p", "producer_seq": True}), 400, "BADMSG"),
    ("producer_seq float", APPEND,
     _json({"payload": OK_PAYLOAD, "producer_id": "p", "producer_seq": 1.5}), 400, "BADMSG"),
    ("producer_seq huge", APPEND,
     (b'{"payload": "eA==", "producer_id": "p", "producer_seq": 1' + b"0" * 30 + b"}",
      JSON_TYPE), 400, "BADMSG"),
    ("producer_seq negative", APPEND,
     _json({"payload": OK_PAYLOAD, "producer_id": "p", "producer_seq": -1}), 400,
     "INVALID_PARAM"),
    ("producer_id alone", APPEND, _json({"payload": OK_PAYLOAD, "producer_id": "p"}), 400,
     "INVALID_PARAM"),
    ("producer_seq alone", BATCH, _json({"payloads": [OK_PAYLOAD], "producer_seq": 1}), 400,
     "INVALID_PARAM"),
    ("producer_id too long", APPEND,
     _json({"payload": OK_PAYLOAD, "producer_id": "p" * 257, "producer_seq": 1}), 400,
     "INVALID_PARAM"),
    ("batch missing", BATCH, _json({"payload": OK_PAYLOAD}), 400, "BADMSG"),
    ("batch not a list", BATCH, _json({"payloads": OK_PAYLOAD}), 400, "BADMSG"),
    ("batch empty", BATCH, _json({"payloads": []}), 400, "INVALID_PARAM"),
    ("batch empty msgpack", BATCH, _mp({"payloads": []}), 400, "INVALID_PARAM"),
    ("batch over max", BATCH, _json({"payloads": [OK_PAYLOAD] * (API.batch_records_max + 1)}),
     413, "TOOBIG"),
    ("batch item bad", BATCH, _json({"payloads": [OK_PAYLOAD, 7]}), 400, "BADMSG"),
    ("batch item bad base64", BATCH, _json({"payloads": [OK_PAYLOAD, "@@@@"]}), 400, "BADMSG"),
    ("batch item too big", BATCH,
     _mp({"payloads": [b"x", b"y" * (API.payload_bytes_max + 1)]}), 413, "TOOBIG"),
]


@pytest.mark.parametrize(
    ("path", "request_body", "code", "status"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
async def test_bad_append_is_refused(
    client: ApiClient, fake: FakeLogService, path: str, request_body: tuple[bytes, str],
    code: int, status: str,
) -> None:
    body, content_type = request_body
    await _expect(client.post(path, data=body, headers={"Content-Type": content_type}),
                  code, status)
    assert fake.appends == []


BAD_QUERIES: list[tuple[str, dict[str, str]]] = [
    ("from zero", {"from": "0"}),
    ("from negative", {"from": "-1"}),
    ("from text", {"from": "abc"}),
    ("from e-notation", {"from": "e1n1"}),
    ("from over u64", {"from": str(2**64)}),
    ("from plus sign", {"from": "+5"}),
    ("from empty", {"from": ""}),
    ("limit zero", {"limit": "0"}),
    ("limit fraction", {"limit": "1.5"}),
    ("max_bytes zero", {"max_bytes": "0"}),
    ("max_bytes huge digits", {"max_bytes": "9" * 100}),
    ("wait_ms negative", {"wait_ms": "-5"}),
    ("wait_ms unicode digit", {"wait_ms": "²"}),
]


@pytest.mark.parametrize("query", [q for _, q in BAD_QUERIES], ids=[n for n, _ in BAD_QUERIES])
async def test_bad_read_query_is_refused(
    client: ApiClient, fake: FakeLogService, query: dict[str, str]
) -> None:
    await _expect(client.get(RECORDS, params=query), 400, "INVALID_PARAM")
    assert fake.reads == []


async def test_repeated_query_parameter_and_bad_log_id_on_reads(
    client: ApiClient, fake: FakeLogService
) -> None:
    await _expect(client.get(RECORDS + "?from=1&from=2"), 400, "INVALID_PARAM")
    await _expect(client.get("/v1/logs/x/records"), 400, "INVALID_PARAM")
    await _expect(client.get("/v1/logs/0/tail"), 400, "INVALID_PARAM")
    assert fake.reads == []


async def test_absent_content_type_is_read_as_json(
    client: ApiClient, fake: FakeLogService
) -> None:
    body = orjson.dumps({"payload": OK_PAYLOAD})
    async with client.post(APPEND, data=body, skip_auto_headers=("Content-Type",)) as resp:
        assert (resp.status, resp.content_type) == (200, JSON_TYPE)
    assert fake.appends[0].payloads == (b"x",)
    await _expect(client.post(APPEND, data=body), 400, "BADMSG")  # application/octet-stream


async def test_content_length_over_request_max_is_refused_unread(client: ApiClient) -> None:
    body = b"x" * (API.request_bytes_max + 1)
    await _expect(client.post(APPEND, data=body, headers={"Content-Type": JSON_TYPE}),
                  413, "TOOBIG")


async def test_chunked_body_over_request_max_is_refused(
    client: ApiClient, fake: FakeLogService
) -> None:
    chunk = b" " * 8192

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(API.request_bytes_max // len(chunk) + 4):
            yield chunk

    await _expect(client.post(APPEND, data=chunks(), headers={"Content-Type": JSON_TYPE}),
                  413, "TOOBIG")
    assert fake.appends == []
    async with client.get("/healthz") as resp:
        assert resp.status == 200


async def test_chunked_body_under_request_max_is_read(
    client: ApiClient, fake: FakeLogService
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"payload": '
        yield orjson.dumps(b64(b"chunked")) + b"}"

    async with client.post(APPEND, data=chunks(), headers={"Content-Type": JSON_TYPE}) as resp:
        assert resp.status == 200
    assert fake.appends[0].payloads == (b"chunked",)


async def test_stalled_body_is_refused_not_waited_for() -> None:
    async with serve(FakeLogService(), body_read_timeout_ms=100) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        try:
            writer.write(
                b"POST /v1/logs/7/append HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pay"
            )
            await writer.drain()
            async with asyncio.timeout(DEADLINE_S):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
        finally:
            writer.close()
    assert head.startswith(b"HTTP/1.1 400")
    assert b"connection: close" in head.lower()
    assert orjson.loads(body)["status"] == "BADMSG"


_json_values = st.recursive(
    # Integers stay within 64 bits: wider ones have no JSON or msgpack encoding to send.
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_fields = st.sampled_from(["payload", "payloads", "key", "producer_id", "producer_seq", "x"])
_field_values = (
    _json_values
    | st.binary(max_size=64)
    | st.binary(max_size=64).map(b64)
    | st.lists(st.binary(max_size=8) | st.binary(max_size=8).map(b64), max_size=12)
)
_docs = st.dictionaries(_fields, _field_values, max_size=5) | _json_values


def _encode(doc: object, media: str) -> bytes:
    if media == MSGPACK_TYPE:
        packed: bytes = msgpack.packb(doc, use_bin_type=True)
        return packed
    # bytes have no JSON form; send them as text so JSON bodies still vary.
    return orjson.dumps(doc, default=lambda v: v.decode("latin-1"))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from([APPEND, BATCH, "/v1/logs/1/append", "/v1/logs/x/append-batch"]),
    media=st.sampled_from([JSON_TYPE, MSGPACK_TYPE, "text/plain", ""]),
    raw=st.binary(max_size=256),
    doc=_docs,
    use_raw=st.booleans(),
)
async def test_random_bodies_never_get_5xx(
    client: ApiClient, path: str, media: str, raw: bytes, doc: object, use_raw: bool
) -> None:
    body = raw if use_raw else _encode(doc, media if media else JSON_TYPE)
    headers = {"Content-Type": media} if media else {}
    async with client.post(
        path, data=body, headers=headers, skip_auto_headers=() if media else ("Content-Type",)
    ) as resp:
        assert resp.status in (200, 400, 413), await resp.text()
        if resp.status != 200:
            answer = await resp.read()
            decoded = (msgpack.unpackb(answer) if resp.content_type == MSGPACK_TYPE
                       else orjson.loads(answer))
            assert decoded["status"] in ("BADMSG", "INVALID_PARAM", "TOOBIG")
