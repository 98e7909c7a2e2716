"""The OpenAPI 3.1 document of the public HTTP API, built from the same limits the handlers use.

Schemas describe the JSON encoding (bytes as padded standard base64 strings); the msgpack
encoding has the same shape with bytes as ``bin``. An ``integer`` field of a request takes any
integer-valued number (``5.0``) up to 2**53, as ``services.http_parse`` says. Answer schemas
forbid unknown properties so that the test which validates real answers against them catches
any drift; extending an answer means extending its schema here too.
"""

from __future__ import annotations

from typing import Any

from services.http_parse import NO_FORWARD_VALUES, READ_LIMIT_DEFAULT
from services.log_stats import LOGS_PAGE_DEFAULT, LOGS_PAGE_MAX
from shared.compression import CODEC_NAMES
from shared.config import ApiConfig, AuthConfig
from shared.http_contract import JSON, MSGPACK
from shared.limits import KEY_BYTES_MAX, PRODUCER_ID_BYTES_MAX
from shared.status import Status
from shared.types import LOG_ID_MAX, LOG_ID_MIN, LSN_MAX

Schema = dict[str, Any]

_BASE64_PADDED = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_UINT64_MAX = 2**64 - 1


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict[str, Schema], required: tuple[str, ...] | None = None) -> Schema:
    """An answer object: every property required unless told otherwise, nothing else allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties if required is None else required),
        "additionalProperties": False,
    }


def _uint(maximum: int = _UINT64_MAX, minimum: int = 0) -> Schema:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _schemas(api: ApiConfig) -> dict[str, Schema]:
    node_state = {"type": "string", "enum": ["ALIVE", "SUSPECT", "DEAD"]}
    return {
        "Bytes": {"type": "string", "contentEncoding": "base64", "pattern": _BASE64_PADDED},
        "Lsn": _uint(LSN_MAX),
        "Error": _object({
            "status": {"type": "string", "enum": [s.name for s in Status if s is not Status.OK]},
            "message": {"type": "string"},
        }),
        "Health": _object({"status": {"const": "OK"}}),
        "AppendOptions": {
            "type": "object",
            "properties": {
                "key": {"type": ["string", "null"], "maxLength": KEY_BYTES_MAX},
                "producer_id": {"type": ["string", "null"], "maxLength": PRODUCER_ID_BYTES_MAX},
                "producer_seq": {**_uint(), "type": ["integer", "null"]},
            },
            # Both or neither: an idempotent append names the pair (null is the same as
            # absent).
            "anyOf": [
                {"properties": {"producer_id": {"type": "null"},
                                "producer_seq": {"type": "null"}}},
                {"properties": {"producer_id": {"type": "string", "minLength": 1},
                                "producer_seq": {"type": "integer"}},
                 "required": ["producer_id", "producer_seq"]},
            ],
        },
        "AppendRequest": {
            "allOf": [_ref("AppendOptions")],
            "type": "object",
            "properties": {"payload": _ref("Bytes")},
            "required": ["payload"],
            "description": f"payload: at most {api.payload_bytes_max} bytes",
        },
        "AppendBatchRequest": {
            "allOf": [_ref("AppendOptions")],
            "type": "object",
            "properties": {
                "compression": {"type": "string", "enum": sorted(CODEC_NAMES)},
                "compressed_payloads": _ref("Bytes"),
            },
            "oneOf": [
                # Each branch constrains its own fields: the server ignores payloads in a
                # compressed batch and records in a plain one, as it does unknown fields.
                {"required": ["payloads"],
                 "properties": {"payloads": {
                     "type": "array", "items": _ref("Bytes"),
                     "minItems": 1, "maxItems": api.batch_records_max}},
                 "not": {"anyOf": [{"required": ["compression"]},
                                   {"required": ["compressed_payloads"]}]}},
                {"required": ["compression", "records", "compressed_payloads"],
                 "properties": {"records": _uint(api.batch_records_max, 1)}},
            ],
            "description": "Plain payloads, or a compressed batch (docs/API-EXTENSIONS.md): "
                           "compressed_payloads is the msgpack array of the records' payloads "
                           "compressed by one lz4 or zstd frame (with its content size), "
                           f"holding exactly `records` payloads of at most "
                           f"{api.payload_bytes_max} bytes each and at most "
                           f"{api.request_bytes_max} bytes in all; it is stored compressed "
                           "and read back as plain records, one LSN each. A blob that is not "
                           "such a batch is 400 BADMSG, nothing written.",
        },
        "AppendResponse": _object({"lsn": _ref("Lsn"), "timestamp_ms": _uint()}),
        "AppendBatchResponse": _object({
            "first_lsn": _ref("Lsn"), "last_lsn": _ref("Lsn"),
            "count": _uint(api.batch_records_max, 1), "timestamp_ms": _uint(),
        }),
        "Record": _object({
            "lsn": _ref("Lsn"), "timestamp_ms": _uint(), "payload": _ref("Bytes"),
            "key": {"type": ["string", "null"]},
        }),
        "Gap": _object({
            "type": {"type": "string", "enum": ["HOLE", "BRIDGE", "TRIM", "DATALOSS"]},
            "lo": _ref("Lsn"), "hi": _ref("Lsn"),
        }),
        "ReadResponse": _object({
            "records": {"type": "array", "items": _ref("Record")},
            "gaps": {"type": "array", "items": _ref("Gap")},
            "next_lsn": _ref("Lsn"), "release_lsn": _ref("Lsn"),
        }),
        # A request: unknown fields are ignored (services.http_parse), so none is forbidden.
        "TrimRequest": {"type": "object", "properties": {"lsn": _uint(LSN_MAX - 1)},
                        "required": ["lsn"]},
        "TrimResponse": _object({"trim_lsn": _ref("Lsn")}),
        "FindTimeResponse": _object({"lsn": _ref("Lsn")}),
        "Redirect": _object({
            "status": {"type": "string"}, "message": {"type": "string"},
            "sequencer_node": {"type": "string"}, "sequencer_http": {"type": "string"},
        }),
        "NodesetsResponse": _object({
            "cluster_fingerprint": {"type": "string"},
            "protocol_version": _uint(2**31 - 1),
            "release_lsn": _ref("Lsn"),
            "nodesets": {"type": "array", "items": _object({
                "first_epoch": _uint(2**32 - 1), "last_epoch": _uint(2**32 - 1),
                "replication_factor": _uint(127, 1),
                "nodes": {"type": "array", "items": _object({
                    "node_id": {"type": "string"}, "data": {"type": "string"}})},
            })},
        }),
        "TailResponse": _object({
            "release_lsn": _ref("Lsn"), "trim_lsn": _ref("Lsn"),
            "epoch": _uint(2**32 - 1), "sequencer": {"type": "string"},
        }),
        "Node": _object({
            "node_id": {"type": "string"},
            "roles": {"type": "array", "items": {"enum": ["sequencer", "storage"]}},
            "http": {"type": "string"}, "state": node_state,
            "sequencer_weight": {"type": "number"}, "storage_capacity": {"type": "number"},
            "data": {"type": "string"},
        }),
        "LogsResponse": _object({
            "node_id": {"type": "string"},
            "total": _uint(),
            "next_after": {**_uint(LOG_ID_MAX), "type": ["integer", "null"]},
            "logs": {"type": "array", "items": _object({
                "log_id": _uint(LOG_ID_MAX, LOG_ID_MIN),
                "state": {"type": "string",
                          "enum": ["UNAVAILABLE", "ACTIVATING", "ACTIVE", "PREEMPTED"]},
                "epoch": _uint(2**32 - 1), "next_lsn": _ref("Lsn"), "release_lsn": _ref("Lsn"),
                "appends_in_flight": _uint(), "recovering": {"type": "boolean"},
                "idle_ms": {**_uint(), "type": ["integer", "null"]},
            })},
        }),
        "ClusterResponse": _object({
            "cluster": {"type": "string"}, "nodes": {"type": "array", "items": _ref("Node")},
            "cluster_fingerprint": {"type": "string"},
            "protocol_version": _uint(2**31 - 1),
            "shards": {"type": "array", "items": {"type": "object"},
                       "description": "storage shards: disk generation, AUTHORITATIVE / "
                       "REBUILDING / DRAINING / DRAINED / REMOVED, donors' progress, "
                       "the rebuild's scope (mini: only dirty_ranges, per log LSN ranges, "
                       "kept while it runs; scope_logs/scope_ranges: its size) "
                       "(docs/RELIABILITY.md); absent when the epoch store is unreadable"},
        }, required=("cluster", "nodes", "cluster_fingerprint", "protocol_version")),
    }


_HEADERS: dict[str, Schema] = {
    "Location": {
        "description": "The same request's URL on the log's sequencer node (307 answers)",
        "schema": {"type": "string"},
    },
    "Retry-After": {
        "description": "Seconds to wait before retrying (429 and 503 answers)",
        "schema": {"type": "integer", "minimum": 0},
    },
    "X-Seqlog-Sequencer": {
        "description": "The log's current sequencer node, for sending the next request direct",
        "schema": {"type": "string"},
    },
}


def _body(schema: str) -> Schema:
    return {media: {"schema": _ref(schema)} for media in (JSON, MSGPACK)}


def _answer(description: str, schema: str, headers: tuple[str, ...] = ()) -> Schema:
    answer: Schema = {"description": description, "content": _body(schema)}
    if headers:
        answer["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in headers}
    return answer


def _errors(codes: tuple[int, ...], sequencer: bool = False) -> dict[str, Schema]:
    answers: dict[str, Schema] = {}
    for code in codes:
        headers: tuple[str, ...] = ("Retry-After",) if code in (429, 503) else ()
        if sequencer:
            headers += ("X-Seqlog-Sequencer",)
        answers[str(code)] = _answer(f"error {code}", "Error", headers)
    answers["default"] = _answer("any other error", "Error")
    return answers


_LOG_ID_PARAM: Schema = {
    "name": "log_id", "in": "path", "required": True,
    "schema": _uint(LOG_ID_MAX, LOG_ID_MIN),
}


def _read_params(api: ApiConfig) -> list[Schema]:
    def query(name: str, schema: Schema, text: str) -> Schema:
        return {"name": name, "in": "query", "required": False, "schema": schema,
                "description": text}

    return [
        _LOG_ID_PARAM,
        query("from", {**_uint(LSN_MAX, 1), "default": 1}, "first LSN wanted"),
        query("limit", {**_uint(minimum=1), "default": READ_LIMIT_DEFAULT},
              f"records wanted; clamped to {api.read_records_max}"),
        query("max_bytes", {**_uint(minimum=1), "default": api.read_bytes_max},
              f"payload bytes wanted; clamped to {api.read_bytes_max}"),
        query("wait_ms", {**_uint(), "default": 0},
              f"long-poll time when nothing is released; clamped to {api.long_poll_ms_max}"),
    ]


_NO_FORWARD_PARAMS: list[Schema] = [
    {"name": "no_forward", "in": "query", "required": False,
     "schema": {"type": "string", "enum": list(NO_FORWARD_VALUES)},
     "description": "1, true or yes: answer 307 with the log's sequencer node instead of "
                    "forwarding (docs/API-EXTENSIONS.md); 0, false or no: forward"},
    {"name": "X-Seqlog-No-Forward", "in": "header", "required": False,
     "schema": {"type": "string", "enum": list(NO_FORWARD_VALUES)},
     "description": "the same as the no_forward query parameter"},
]


def _append_op(summary: str, request: str, answer: str) -> Schema:
    return {
        "summary": summary,
        "parameters": [_LOG_ID_PARAM, *_NO_FORWARD_PARAMS],
        "requestBody": {"required": True, "content": _body(request)},
        "responses": {
            "200": _answer("durable on R storage nodes", answer, ("X-Seqlog-Sequencer",)),
            "307": _answer("with no_forward, on a node that does not sequence the log: send "
                           "the same request to Location", "Redirect",
                           ("Location", "X-Seqlog-Sequencer")),
            **_errors((400, 404, 409, 413, 429, 500, 503, 504), sequencer=True),
        },
        "description": "With producer_id and producer_seq the append is idempotent: a retry "
                       "of the pair answers 200 with the original LSNs, nothing written; 409 "
                       "STALE for a pair older than the producer's latest remembered appends "
                       "(docs/API-EXTENSIONS.md).",
    }


def _get_op(summary: str, answer: str, errors: tuple[int, ...], **extra: Any) -> Schema:
    return {
        "summary": summary,
        "responses": {"200": _answer("success", answer), **_errors(errors)},
        **extra,
    }


_LOG_ROUTES_FORBIDDEN = 403


def _secure(paths: dict[str, Any], auth: AuthConfig | None) -> None:
    """docs/SECURITY.md: every operation but ``open_paths`` takes a bearer token (required
    when the node has auth on, optional otherwise) and may answer 401 UNAUTHENTICATED; those
    on a log also 403 ACCESS, appends also 429 RATE_LIMITED."""
    open_paths = auth.open_paths if auth is not None else AuthConfig().open_paths
    required = auth is not None and auth.enabled
    for path, operations in paths.items():
        for operation in operations.values():
            if path in open_paths:
                operation["security"] = []
                continue
            operation["security"] = [{"bearer": []}] if required else [{"bearer": []}, {}]
            responses = operation["responses"]
            responses.setdefault("401", _answer(
                "missing, malformed, expired or revoked token (WWW-Authenticate: Bearer)",
                "Error"))
            if path.startswith("/v1/logs/{log_id}/"):
                responses.setdefault(str(_LOG_ROUTES_FORBIDDEN), _answer(
                    "the token's principal lacks the permission on this log", "Error"))


def build_openapi(api: ApiConfig, auth: AuthConfig | None = None) -> dict[str, Any]:
    """The document served at ``/openapi.json``; ``auth``: the node's (security schemes)."""
    tail = _get_op("the log's release and trim points and sequencer", "TailResponse",
                   (400, 404, 500, 503, 504), parameters=[_LOG_ID_PARAM])
    tail["responses"]["200"] = _answer("success", "TailResponse", ("X-Seqlog-Sequencer",))
    metrics = {"200": {"description": "Prometheus text format",
                       "content": {"text/plain": {"schema": {"type": "string"}}}}}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Seqlog", "version": "1"},
        "paths": {
            "/v1/logs/{log_id}/append": {"post": _append_op(
                "append one record", "AppendRequest", "AppendResponse")},
            "/v1/logs/{log_id}/append-batch": {"post": _append_op(
                "append records atomically with consecutive LSNs", "AppendBatchRequest",
                "AppendBatchResponse")},
            "/v1/logs/{log_id}/records": {"get": _get_op(
                "released records and gaps from an LSN on", "ReadResponse",
                (400, 404, 500, 503, 504), parameters=_read_params(api))},
            "/v1/logs/{log_id}/tail": {"get": tail},
            "/v1/logs/{log_id}/find-time": {"get": _get_op(
                "the lowest LSN whose record has timestamp_ms at or after the one given "
                "(release_lsn + 1 if none)", "FindTimeResponse", (400, 404, 500, 503, 504),
                parameters=[_LOG_ID_PARAM, {
                    "name": "timestamp_ms", "in": "query", "required": True,
                    "schema": _uint(2**63 - 1), "description": "milliseconds since the epoch"}])},
            "/v1/logs/{log_id}/nodesets": {"get": _get_op(
                "the log's storage nodes by epoch and their node-to-node addresses, for "
                "readers that read storage nodes directly (see docs/API-EXTENSIONS.md)",
                "NodesetsResponse", (400, 404, 500, 503, 504), parameters=[_LOG_ID_PARAM])},
            "/v1/logs/{log_id}/trim": {"post": {
                "summary": "make records at or below an LSN unreadable (TRIM gaps)",
                "parameters": [_LOG_ID_PARAM],
                "requestBody": {"required": True, "content": _body("TrimRequest")},
                "responses": {"200": _answer("durable on an f-majority of the nodeset",
                                             "TrimResponse"),
                              **_errors((400, 404, 413, 500, 503, 504))},
            }},
            "/v1/cluster": {"get": _get_op("the cluster's nodes", "ClusterResponse", (500,))},
            "/v1/logs": {"get": _get_op(
                "the logs this node sequences, for operators' tools (docs/API-EXTENSIONS.md)",
                "LogsResponse", (400, 500), parameters=[
                    {"name": "after", "in": "query", "required": False,
                     "schema": {**_uint(LOG_ID_MAX), "default": 0},
                     "description": "list logs with ids above this one"},
                    {"name": "limit", "in": "query", "required": False,
                     "schema": {**_uint(2**63 - 1, 1), "default": LOGS_PAGE_DEFAULT},
                     "description": f"logs wanted; clamped to {LOGS_PAGE_MAX}"}])},
            "/healthz": {"get": _get_op("the process is up", "Health", (500,))},
            "/readyz": {"get": _get_op("every role can serve", "Health", (500, 503))},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": metrics}},
            "/openapi.json": {"get": {"summary": "this document", "responses": {
                "200": {"description": "OpenAPI 3.1",
                        "content": {JSON: {"schema": {"type": "object"}}}}}}},
        },
        "components": {"schemas": _schemas(api), "headers": _HEADERS,
                       "securitySchemes": {"bearer": {
                           "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                           "description": "a token from `seqlog token create` "
                                          "(docs/SECURITY.md)"}}},
    }
    _secure(document["paths"], auth)
    return document
