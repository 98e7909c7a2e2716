"""``/openapi.json`` describes the real answers, and ``/metrics`` counts them."""

from __future__ import annotations

import re
from typing import Any

import orjson
from http_fakes import API, JSON_TYPE, ApiClient, FakeLogService, b64
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from shared.compression import Codec, compress_batch
from shared.status import Status
from shared.types import LogId

DOC_URI = "urn:seqlog:openapi"


async def _openapi(client: ApiClient) -> dict[str, Any]:
    async with client.get("/openapi.json") as resp:
        assert (resp.status, resp.content_type) == (200, JSON_TYPE)
        doc: dict[str, Any] = await resp.json()
    return doc


class Checker:
    """Validates an answer against the schema the document gives for its path, method and
    code (falling back to ``default``), and checks the headers it declares."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        resource = Resource.from_contents(doc, default_specification=DRAFT202012)
        self.registry: Registry[Any] = Registry().with_resource(DOC_URI, resource)
        self.checked: set[tuple[str, str, str]] = set()

    async def check(
        self, client: ApiClient, method: str, template: str, url: str, **kwargs: Any
    ) -> int:
        async with client.request(method, url, **kwargs) as resp:
            body = await resp.json()
            responses = self.doc["paths"][template][method.lower()]["responses"]
            key = str(resp.status) if str(resp.status) in responses else "default"
            answer = responses[key]
            schema = answer["content"][JSON_TYPE]["schema"]
            ref = {"$ref": DOC_URI + schema["$ref"]} if "$ref" in schema else schema
            Draft202012Validator(ref, registry=self.registry).validate(body)
            for header in answer.get("headers", {}):
                if header == "Retry-After" or resp.status in (200, 307):
                    assert header in resp.headers, (template, resp.status, header)
            self.checked.add((template, method, key))
            return resp.status

    async def check_error(self, client: ApiClient, method: str, url: str) -> int:
        """Answers of routes the document does not list must still be ``Error`` bodies."""
        async with client.request(method, url) as resp:
            schema = {"$ref": DOC_URI + "#/components/schemas/Error"}
            Draft202012Validator(schema, registry=self.registry).validate(await resp.json())
            return resp.status


async def test_document_is_openapi_31_with_valid_schemas(client: ApiClient) -> None:
    doc = await _openapi(client)
    assert doc["openapi"] == "3.1.0"
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    limit = doc["components"]["schemas"]["AppendBatchRequest"]["oneOf"][0]["properties"][
        "payloads"]
    assert limit["maxItems"] == API.batch_records_max
    routes = {
        r.resource.canonical for r in client.app.router.routes() if r.resource is not None
    }
    assert routes == set(doc["paths"])


async def test_real_answers_validate_against_the_document(
    client: ApiClient, fake: FakeLogService
) -> None:
    checker = Checker(await _openapi(client))
    append = "/v1/logs/{log_id}/append"
    batch = "/v1/logs/{log_id}/append-batch"
    records = "/v1/logs/{log_id}/records"
    tail = "/v1/logs/{log_id}/tail"
    body = {"json": {"payload": b64(b"one"), "key": "k"}}
    assert await checker.check(client, "POST", append, "/v1/logs/3/append", **body) == 200
    batch_body = {"json": {"payloads": [b64(b"a"), b64(b"b")]}}
    assert await checker.check(client, "POST", batch, "/v1/logs/3/append-batch",
                               **batch_body) == 200
    blob = compress_batch([b"line line line %d" % i for i in range(8)], Codec.ZSTD)
    assert blob is not None
    compressed_body = {"compression": "zstd", "records": 8, "compressed_payloads": b64(blob)}
    Draft202012Validator({"$ref": DOC_URI + "#/components/schemas/AppendBatchRequest"},
                         registry=checker.registry).validate(compressed_body)
    Draft202012Validator({"$ref": DOC_URI + "#/components/schemas/AppendBatchRequest"},
                         registry=checker.registry).validate(batch_body["json"])
    assert await checker.check(client, "POST", batch, "/v1/logs/3/append-batch",
                               json=compressed_body) == 200
    bad = {**compressed_body, "records": 7}
    assert await checker.check(client, "POST", batch, "/v1/logs/3/append-batch",
                               json=bad) == 400
    fake.add_gap(LogId(3), "HOLE", 2)
    await checker.check(client, "POST", append, "/v1/logs/3/append", json={"payload": ""})
    assert await checker.check(client, "GET", records, "/v1/logs/3/records?from=1") == 200
    assert await checker.check(client, "GET", tail, "/v1/logs/3/tail") == 200
    assert await checker.check(client, "GET", "/v1/cluster", "/v1/cluster") == 200
    assert await checker.check(client, "GET", "/healthz", "/healthz") == 200
    assert await checker.check(client, "GET", "/readyz", "/readyz") == 200
    assert await checker.check(client, "GET", "/v1/logs", "/v1/logs?after=0&limit=5") == 200
    assert await checker.check(client, "GET", "/v1/logs", "/v1/logs?limit=0") == 400

    assert await checker.check(client, "POST", append, "/v1/logs/x/append", json={}) == 400
    big = {"json": {"payload": b64(b"x" * (API.payload_bytes_max + 1))}}
    assert await checker.check(client, "POST", append, "/v1/logs/3/append", **big) == 413
    assert await checker.check(client, "GET", records, "/v1/logs/3/records?limit=0") == 400
    assert await checker.check_error(client, "GET", "/v1/logs/3/append") == 405
    assert await checker.check_error(client, "GET", "/v2/nothing") == 404
    for status in (Status.SEQNOBUFS, Status.NOSEQUENCER, Status.TIMEDOUT, Status.NOTFOUND,
                   Status.INTERNAL):
        fake.fail_with = status
        await checker.check(client, "POST", batch, "/v1/logs/3/append-batch", **batch_body)
        await checker.check(client, "GET", records, "/v1/logs/3/records")
        await checker.check(client, "GET", tail, "/v1/logs/3/tail")
    fake.fail_with = None
    nodesets = "/v1/logs/{log_id}/nodesets"
    assert await checker.check(client, "GET", nodesets, "/v1/logs/3/nodesets") == 200
    assert await checker.check(client, "GET", nodesets, "/v1/logs/999/nodesets") == 404
    find_time = "/v1/logs/{log_id}/find-time"
    assert await checker.check(client, "GET", find_time,
                               "/v1/logs/3/find-time?timestamp_ms=0") == 200
    fake.redirect_to = "127.0.0.1:9"
    assert await checker.check(client, "POST", append, "/v1/logs/3/append?no_forward=1",
                               allow_redirects=False, **body) == 307
    fake.redirect_to = None
    fake.is_ready = False
    assert await checker.check(client, "GET", "/readyz", "/readyz") == 503
    assert {key for _, _, key in checker.checked} >= {
        "200", "307", "400", "404", "413", "429", "500", "503", "504", "default",
    }


def _sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if found == labels:
            return float(match.group(3))
    return None


async def test_metrics_count_requests_by_route_method_and_code(client: ApiClient) -> None:
    for _ in range(2):
        async with client.post("/v1/logs/1/append", json={"payload": b64(b"m")}) as resp:
            assert resp.status == 200
    async with client.post("/v1/logs/1/append", json={}) as resp:
        assert resp.status == 400
    async with client.get("/no/such/route") as resp:
        assert resp.status == 404
    async with client.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        text = await resp.text()
    route = "/v1/logs/{log_id}/append"
    ok = {"route": route, "method": "POST", "code": "200"}
    assert _sample(text, "seqlog_http_requests_total", ok) == 2.0
    assert _sample(text, "seqlog_http_requests_total", {**ok, "code": "400"}) == 1.0
    unmatched = {"route": "unmatched", "method": "GET", "code": "404"}
    assert _sample(text, "seqlog_http_requests_total", unmatched) == 1.0
    assert _sample(text, "seqlog_http_request_duration_seconds_count", ok) == 2.0
    assert _sample(text, "seqlog_http_request_duration_seconds_bucket", {**ok, "le": "+Inf"}) == 2
    # The /metrics request itself is in flight while the text is produced.
    assert "seqlog_http_requests_in_flight 1.0" in text


async def test_openapi_is_json_whatever_accept_says(client: ApiClient) -> None:
    async with client.get("/openapi.json", headers={"Accept": "application/msgpack"}) as resp:
        assert resp.content_type == JSON_TYPE
        assert orjson.loads(await resp.read())["info"]["title"] == "Seqlog"
