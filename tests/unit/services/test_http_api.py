"""The HTTP edge over a fake service: appends, reads, encodings, status mapping and headers."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import msgpack
import orjson
import pytest
from http_fakes import (
    API,
    APPEND,
    BATCH,
    DEADLINE_S,
    FIRST_LSN,
    JSON_TYPE,
    MSGPACK_TYPE,
    RECORDS,
    TIMESTAMP_MS,
    ApiClient,
    FakeLogService,
    b64,
)

from shared.http_contract import HTTP_STATUS
from shared.status import Status
from shared.types import LogId
from shared.wire.hello import PROTOCOL_VERSION


async def _post(
    client: ApiClient, path: str, doc: dict[str, Any], media: str, accept: str | None = None
) -> tuple[int, str, Any, dict[str, str]]:
    body = msgpack.packb(doc, use_bin_type=True) if media == MSGPACK_TYPE else orjson.dumps(doc)
    headers = {"Content-Type": media, **({"Accept": accept} if accept else {})}
    async with client.post(path, data=body, headers=headers) as resp:
        raw = await resp.read()
        decoded = msgpack.unpackb(raw) if resp.content_type == MSGPACK_TYPE else await resp.json()
        return resp.status, resp.content_type, decoded, dict(resp.headers)


async def test_append_json(client: ApiClient, fake: FakeLogService) -> None:
    status, media, body, headers = await _post(
        client, APPEND, {"payload": b64(b"hello"), "key": "k1"}, JSON_TYPE
    )
    assert (status, media) == (200, JSON_TYPE)
    assert body == {"lsn": FIRST_LSN, "timestamp_ms": TIMESTAMP_MS}
    assert headers["X-Seqlog-Sequencer"] == "n1"
    assert fake.appends[0].log_id == LogId(7)
    assert (fake.appends[0].payloads, fake.appends[0].key) == ((b"hello",), "k1")


async def test_append_msgpack_answers_msgpack(client: ApiClient, fake: FakeLogService) -> None:
    status, media, body, headers = await _post(
        client, APPEND, {"payload": b"\x00\xffbin"}, MSGPACK_TYPE
    )
    assert (status, media) == (200, MSGPACK_TYPE)
    assert body == {"lsn": FIRST_LSN, "timestamp_ms": TIMESTAMP_MS}
    assert headers["X-Seqlog-Sequencer"] == "n1"
    assert (fake.appends[0].payloads, fake.appends[0].key) == ((b"\x00\xffbin",), None)


@pytest.mark.parametrize("media", [JSON_TYPE, MSGPACK_TYPE])
async def test_append_batch(client: ApiClient, fake: FakeLogService, media: str) -> None:
    payloads = [b"a", b"", b"\x00" * 5]
    items: list[Any] = payloads if media == MSGPACK_TYPE else [b64(p) for p in payloads]
    await _post(client, APPEND, {"payload": items[0]}, media)
    status, _, body, headers = await _post(client, BATCH, {"payloads": items, "key": "b"}, media)
    assert status == 200
    assert body == {
        "first_lsn": FIRST_LSN + 1, "last_lsn": FIRST_LSN + 3, "count": 3,
        "timestamp_ms": TIMESTAMP_MS,
    }
    assert headers["X-Seqlog-Sequencer"] == "n1"
    assert fake.appends[1].payloads == tuple(payloads)


@pytest.mark.parametrize(
    ("content_type", "accept", "expected"),
    [
        (JSON_TYPE, None, JSON_TYPE),
        (MSGPACK_TYPE, None, MSGPACK_TYPE),
        (JSON_TYPE, MSGPACK_TYPE, MSGPACK_TYPE),
        (MSGPACK_TYPE, JSON_TYPE, JSON_TYPE),
        (MSGPACK_TYPE, "*/*", MSGPACK_TYPE),
        (JSON_TYPE, "text/html", JSON_TYPE),
        (JSON_TYPE, "application/json;q=0.2, application/msgpack;q=0.9", MSGPACK_TYPE),
        (MSGPACK_TYPE, "application/msgpack;q=0, application/json", JSON_TYPE),
        ("application/x-msgpack", None, MSGPACK_TYPE),
        ("application/json; charset=utf-8", None, JSON_TYPE),
    ],
)
async def test_response_type_negotiation(
    client: ApiClient, content_type: str, accept: str | None, expected: str
) -> None:
    payload: Any = b"x" if "msgpack" in content_type else b64(b"x")
    body = msgpack.packb({"payload": payload}) if "msgpack" in content_type else None
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    data = body if body is not None else f'{{"payload": "{payload}"}}'.encode()
    async with client.post(APPEND, data=data, headers=headers) as resp:
        assert resp.status == 200
        assert resp.content_type == expected


async def test_get_answers_json_unless_accept_says_otherwise(client: ApiClient) -> None:
    async with client.get("/v1/logs/7/tail") as resp:
        assert resp.content_type == JSON_TYPE
    async with client.get("/v1/logs/7/tail", headers={"Accept": MSGPACK_TYPE}) as resp:
        assert resp.content_type == MSGPACK_TYPE
        assert msgpack.unpackb(await resp.read())["sequencer"] == "n1"


async def test_errors_are_encoded_like_answers(client: ApiClient) -> None:
    async with client.post(APPEND, data=msgpack.packb({}), headers={
        "Content-Type": MSGPACK_TYPE}) as resp:
        assert (resp.status, resp.content_type) == (400, MSGPACK_TYPE)
        body = msgpack.unpackb(await resp.read())
        assert body["status"] == "BADMSG" and "payload" in body["message"]


async def test_json_bytes_are_padded_standard_base64(
    client: ApiClient, fake: FakeLogService
) -> None:
    payload = bytes([0xFB, 0xFF]) + b"ab"
    await _post(client, APPEND, {"payload": base64.b64encode(payload).decode()}, JSON_TYPE)
    assert fake.appends[0].payloads == (payload,)
    async with client.get(RECORDS) as resp:
        record = (await resp.json())["records"][0]
    # "+" and "/" (not "-" and "_") and "=" padding: the standard alphabet.
    assert record["payload"] == "+/9hYg=="
    assert base64.b64decode(record["payload"], validate=True) == payload


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
async def test_every_failed_status_maps_through_the_table(
    client: ApiClient, fake: FakeLogService, status: Status
) -> None:
    fake.fail_with = status
    code, _, body, headers = await _post(client, APPEND, {"payload": b64(b"x")}, JSON_TYPE)
    assert code == HTTP_STATUS[status]
    assert body == {"status": status.name, "message": "forced"}
    assert headers["X-Seqlog-Sequencer"] == "n1"
    assert ("Retry-After" in headers) == (code in (429, 503))


async def test_seqnobufs_is_429_with_retry_after(client: ApiClient, fake: FakeLogService) -> None:
    fake.fail_with = Status.SEQNOBUFS
    code, _, body, headers = await _post(client, BATCH, {"payloads": [b64(b"x")]}, JSON_TYPE)
    assert (code, body["status"]) == (429, "SEQNOBUFS")
    assert headers["Retry-After"] == str(API.retry_after_s)
    assert headers["X-Seqlog-Sequencer"] == "n1"


async def test_tail_carries_sequencer(client: ApiClient, fake: FakeLogService) -> None:
    await _post(client, APPEND, {"payload": b64(b"x")}, JSON_TYPE)
    async with client.get("/v1/logs/7/tail") as resp:
        assert resp.status == 200
        assert resp.headers["X-Seqlog-Sequencer"] == "n1"
        assert await resp.json() == {
            "release_lsn": FIRST_LSN, "trim_lsn": 0, "epoch": 1, "sequencer": "n1",
        }
    fake.fail_with = Status.NOSEQUENCER
    async with client.get("/v1/logs/7/tail") as resp:
        assert resp.status == 503
        assert (await resp.json())["status"] == "NOSEQUENCER"


@pytest.mark.parametrize("media", [JSON_TYPE, MSGPACK_TYPE])
async def test_records_and_gaps(client: ApiClient, fake: FakeLogService, media: str) -> None:
    fake.add_gap(LogId(7), "BRIDGE", 2)
    await _post(client, BATCH, {"payloads": [b64(b"r1"), b64(b"r2")], "key": "k"}, JSON_TYPE)
    fake.add_gap(LogId(7), "HOLE", 1)
    await _post(client, APPEND, {"payload": b64(b"r3")}, JSON_TYPE)
    async with client.get(RECORDS, params={"from": "1"}, headers={"Accept": media}) as resp:
        assert resp.status == 200
        raw = await resp.read()
    body = msgpack.unpackb(raw) if media == MSGPACK_TYPE else orjson.loads(raw)
    payload = (lambda p: p) if media == MSGPACK_TYPE else b64
    lsn = FIRST_LSN
    assert body == {
        "records": [
            {"lsn": lsn + 2, "timestamp_ms": TIMESTAMP_MS, "payload": payload(b"r1"), "key": "k"},
            {"lsn": lsn + 3, "timestamp_ms": TIMESTAMP_MS, "payload": payload(b"r2"), "key": "k"},
            {"lsn": lsn + 5, "timestamp_ms": TIMESTAMP_MS, "payload": payload(b"r3"),
             "key": None},
        ],
        "gaps": [
            {"type": "BRIDGE", "lo": lsn, "hi": lsn + 1},
            {"type": "HOLE", "lo": lsn + 4, "hi": lsn + 4},
        ],
        "next_lsn": lsn + 6,
        "release_lsn": lsn + 5,
    }


async def test_read_defaults_and_clamping(client: ApiClient, fake: FakeLogService) -> None:
    await _post(client, APPEND, {"payload": b64(b"x")}, JSON_TYPE)  # so that reads never wait
    async with client.get(RECORDS) as resp:
        assert resp.status == 200
    call = fake.reads[-1]
    assert (call.from_lsn, call.records_max, call.bytes_max, call.wait_ms) == (
        1, min(1000, API.read_records_max), API.read_bytes_max, 0)
    query = {"from": "1", "limit": "999999", "max_bytes": "99999999", "wait_ms": "10"}
    async with client.get(RECORDS, params=query) as resp:
        assert resp.status == 200
    call = fake.reads[-1]
    assert (call.from_lsn, call.records_max, call.bytes_max, call.wait_ms) == (
        1, API.read_records_max, API.read_bytes_max, 10)
    async with client.get(RECORDS, params={"wait_ms": str(10**12), "limit": "3"}) as resp:
        assert resp.status == 200
    assert (fake.reads[-1].wait_ms, fake.reads[-1].records_max) == (API.long_poll_ms_max, 3)


async def test_long_poll_returns_when_a_record_is_released(
    client: ApiClient, fake: FakeLogService
) -> None:
    params = {"from": str(FIRST_LSN), "wait_ms": "60000"}
    read = asyncio.create_task(client.get(RECORDS, params=params))
    async with asyncio.timeout(DEADLINE_S):
        await fake.waiter_arrived.wait()
        await _post(client, APPEND, {"payload": b64(b"late")}, JSON_TYPE)
        resp = await read
    body = await resp.json()
    resp.release()
    assert [r["payload"] for r in body["records"]] == [b64(b"late")]
    assert body["next_lsn"] == FIRST_LSN + 1


async def test_unknown_route_and_wrong_method(client: ApiClient) -> None:
    async with client.get("/v1/nope") as resp:
        assert (resp.status, resp.content_type) == (404, JSON_TYPE)
        assert (await resp.json())["status"] == "NOTFOUND"
    async with client.get(APPEND) as resp:
        assert (resp.status, resp.content_type) == (405, JSON_TYPE)
        assert (await resp.json())["status"] == "BADMSG"
        assert resp.headers["Allow"] == "POST"
    async with client.delete("/v1/cluster") as resp:
        assert resp.status == 405


async def test_unexpected_exception_is_logged_500(
    client: ApiClient, fake: FakeLogService, caplog: pytest.LogCaptureFixture
) -> None:
    fake.raise_error = True
    with caplog.at_level(logging.ERROR, logger="services.http_api"):
        code, _, body, _ = await _post(client, APPEND, {"payload": b64(b"x")}, JSON_TYPE)
    assert (code, body["status"]) == (500, "INTERNAL")
    assert "fake service failure" in caplog.text


async def test_health_readiness_and_cluster(client: ApiClient, fake: FakeLogService) -> None:
    async with client.get("/healthz") as resp:
        assert (resp.status, await resp.json()) == (200, {"status": "OK"})
    async with client.get("/readyz") as resp:
        assert resp.status == 200
    fake.is_ready = False
    async with client.get("/readyz") as resp:
        assert (resp.status, (await resp.json())["status"]) == (503, "NOTREADY")
        assert resp.headers["Retry-After"] == str(API.retry_after_s)
    async with client.get("/v1/cluster") as resp:
        body = await resp.json()
    assert body["cluster"] == "test-cluster"
    assert body["nodes"][1] == {
        "node_id": "s1", "roles": ["storage"], "http": "127.0.0.1:2", "state": "SUSPECT",
        "sequencer_weight": 0.0, "storage_capacity": 1.0, "data": "127.0.0.1:3",
    }
    assert (body["cluster_fingerprint"], body["protocol_version"]) == ("fp", PROTOCOL_VERSION)


@pytest.mark.parametrize("media", [JSON_TYPE, MSGPACK_TYPE])
async def test_trim(client: ApiClient, fake: FakeLogService, media: str) -> None:
    await _post(client, APPEND, {"payload": b64(b"a")}, JSON_TYPE)
    status, _, body, _ = await _post(client, "/v1/logs/7/trim", {"lsn": FIRST_LSN}, media)
    assert (status, body) == (200, {"trim_lsn": FIRST_LSN})
    assert fake.trims == [(LogId(7), FIRST_LSN)]
    for doc, code, name in (({"lsn": FIRST_LSN + 5}, 400, "INVALID_PARAM"),
                            ({"lsn": "e1n1"}, 400, "BADMSG"), ({}, 400, "BADMSG"),
                            ({"lsn": -1}, 400, "INVALID_PARAM")):
        status, _, body, _ = await _post(client, "/v1/logs/7/trim", doc, media)
        assert (status, body["status"]) == (code, name), doc
        assert body["message"]
    assert len(fake.trims) == 1


async def test_find_time(client: ApiClient) -> None:
    await _post(client, APPEND, {"payload": b64(b"a")}, JSON_TYPE)
    for query, code, expected in (
            (f"timestamp_ms={TIMESTAMP_MS}", 200, {"lsn": FIRST_LSN}),
            (f"timestamp_ms={TIMESTAMP_MS + 1}", 200, {"lsn": FIRST_LSN + 1}),
            ("", 400, "BADMSG"), ("timestamp_ms=soon", 400, "INVALID_PARAM"),
            ("timestamp_ms=-5", 400, "INVALID_PARAM"),
            (f"timestamp_ms={2**63}", 400, "INVALID_PARAM")):
        async with client.get(f"/v1/logs/7/find-time?{query}",
                              headers={"Accept": JSON_TYPE}) as resp:
            body = await resp.json()
        assert resp.status == code, (query, body)
        assert body == expected if code == 200 else body["status"] == expected, (query, body)
