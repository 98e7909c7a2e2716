"""Where ``/openapi.json`` and the server used to disagree (issue 19 item 5), on both HTTP
paths (the lean edge and aiohttp): integer-valued floats are integers, ``producer_seq: null``
beside a ``producer_id`` is refused by both, a trim ``lsn`` of 2**64-1 is outside both,
``no_forward`` takes exactly its enum, and a client that gives up in the middle of a body is
counted as 499 and logged as one line, not as a 500 with a traceback."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import msgpack
import pytest
from http_fakes import APPEND, BATCH, FIRST_LSN, FakeLogService, b64, serve
from jsonschema import Draft202012Validator, ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from services.openapi import build_openapi
from shared.compression import Codec, compress_batch
from shared.config import ApiConfig
from shared.types import LSN_MAX

PATHS = pytest.mark.parametrize("aiohttp_only", [False, True], ids=["edge", "aiohttp"])
DOC = build_openapi(ApiConfig())
_REGISTRY: Registry[Any] = Registry().with_resource(
    "urn:doc", Resource.from_contents(DOC, default_specification=DRAFT202012))


def schema_accepts(name: str, body: object) -> bool:
    validator = Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"},
                                     registry=_REGISTRY)
    try:
        validator.validate(body)
    except ValidationError:
        return False
    return True


@PATHS
async def test_integer_valued_floats_are_integers(aiohttp_only: bool) -> None:
    fake = FakeLogService()
    async with serve(fake, aiohttp_only=aiohttp_only) as client:
        body = {"payload": b64(b"x"), "producer_id": "p", "producer_seq": 46032371.0}
        assert schema_accepts("AppendRequest", body)
        async with client.post(APPEND, json=body) as resp:
            assert resp.status == 200, await resp.text()
        assert fake.appends[-1].producer == ("p", 46032371)
        packed = msgpack.packb({"payload": b"y", "producer_id": "q", "producer_seq": 7.0})
        async with client.post(APPEND, data=packed,
                               headers={"Content-Type": "application/msgpack"}) as resp:
            assert resp.status == 200, await resp.text()
        assert fake.appends[-1].producer == ("q", 7)
        blob = compress_batch([b"line line line %d" % i for i in range(8)], Codec.ZSTD)
        assert blob is not None
        batch = {"compression": "zstd", "records": 8.0, "compressed_payloads": b64(blob)}
        assert schema_accepts("AppendBatchRequest", batch)
        async with client.post(BATCH, json=batch) as resp:
            assert resp.status == 200, await resp.text()
        async with client.post("/v1/logs/7/trim", json={"lsn": float(FIRST_LSN)}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["trim_lsn"] == FIRST_LSN
        # A fraction, or a float too big to say which integer it is, is still refused.
        for seq in (1.5, 2.0**60):
            body = {"payload": b64(b"x"), "producer_id": "p", "producer_seq": seq}
            async with client.post(APPEND, json=body) as resp:
                assert resp.status == 400, seq


@PATHS
async def test_producer_pair_is_both_or_neither_in_schema_and_server(aiohttp_only: bool) -> None:
    async with serve(FakeLogService(), aiohttp_only=aiohttp_only) as client:
        cases = [
            ({"producer_id": "p", "producer_seq": None}, False),
            ({"producer_id": None, "producer_seq": 3}, False),
            ({"producer_id": "p"}, False),
            ({"producer_seq": 3}, False),
            ({"producer_id": "", "producer_seq": 3}, False),
            ({"producer_id": None, "producer_seq": None}, True),
            ({}, True),
            ({"producer_id": "p", "producer_seq": 3}, True),
        ]
        for options, accepted in cases:
            body = {"payload": b64(b"x"), **options}
            assert schema_accepts("AppendRequest", body) is accepted, options
            async with client.post(APPEND, json=body) as resp:
                assert (resp.status == 200) is accepted, (options, await resp.text())


@PATHS
async def test_trim_lsn_range_is_the_same_in_schema_and_server(aiohttp_only: bool) -> None:
    fake = FakeLogService()
    async with serve(fake, aiohttp_only=aiohttp_only) as client:
        assert not schema_accepts("TrimRequest", {"lsn": LSN_MAX})
        assert schema_accepts("TrimRequest", {"lsn": LSN_MAX - 1})
        async with client.post("/v1/logs/7/trim", json={"lsn": LSN_MAX}) as resp:
            assert resp.status == 400
            assert (await resp.json())["status"] == "INVALID_PARAM"


@PATHS
async def test_no_forward_takes_exactly_its_enum(aiohttp_only: bool) -> None:
    enum = next(p for p in DOC["paths"]["/v1/logs/{log_id}/append"]["post"]["parameters"]
                if p["name"] == "no_forward")["schema"]["enum"]
    assert set(enum) == {"1", "true", "yes", "0", "false", "no"}
    fake = FakeLogService()
    fake.redirect_to = "127.0.0.1:9"
    async with serve(fake, aiohttp_only=aiohttp_only) as client:
        body = {"payload": b64(b"x")}
        for value, code in (("1", 307), ("yes", 307), ("0", 200), ("no", 200), ("AAA", 400),
                            ("TRUE", 400), ("", 400)):
            async with client.post(f"{APPEND}?no_forward={value}", json=body,
                                   allow_redirects=False) as resp:
                assert resp.status == code, (value, await resp.text())
                if code == 400:
                    assert (await resp.json())["status"] == "INVALID_PARAM"
            async with client.post(APPEND, json=body, allow_redirects=False,
                                   headers={"X-Seqlog-No-Forward": value}) as resp:
                assert resp.status == code, ("header", value)


def _count(text: str, route: str, code: int) -> float:
    pattern = (rf'^seqlog_http_requests_total\{{code="{code}",method="POST",'
               rf'route="{re.escape(route)}"\}} (\S+)$')
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("path,route", [
    ("/v1/logs/7/trim", "/v1/logs/{log_id}/trim"),        # served by aiohttp
    ("/v1/logs/7/append", "/v1/logs/{log_id}/append"),    # served by the lean edge
])
async def test_a_client_that_gives_up_mid_body_is_a_499_and_one_line(
        path: str, route: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with serve(FakeLogService()) as client:
        _, writer = await asyncio.open_connection("127.0.0.1", client.port)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100\r\n\r\n{\"lsn\"".encode())
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            async with client.get("/metrics") as resp:
                text = await resp.text()
            if _count(text, route, 499) == 1:
                break
            assert asyncio.get_running_loop().time() < deadline, text
            await asyncio.sleep(0.05)
    assert _count(text, route, 500) == 0
    records = [r for r in caplog.records if r.name.startswith("services.")]
    assert all(r.levelno < logging.WARNING and r.exc_info is None for r in records), records
    assert len(records) <= 1

