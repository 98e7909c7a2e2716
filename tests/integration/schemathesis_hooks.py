"""Schemathesis hooks for the contract run (``tests/integration/test_schemathesis.py``), loaded
through ``SCHEMATHESIS_HOOKS``.

msgpack: the document describes bytes as base64 strings (the JSON encoding); in msgpack they
are ``bin``. The serializer sends msgpack bodies with the bytes fields as ``bin``; the
deserializer turns ``bin`` in answers back into base64 strings, so one schema checks both.
A generated compressed batch (``compression``, ``records``, ``compressed_payloads``) gets a
real compressed batch of ``records`` payloads for its blob, when the rest of it is valid: the
schema cannot say what the blob's bytes must decode to. Long polls are cut to
``LONG_POLL_MS_MAX``: a poll on a log never written waits for its whole
``wait_ms`` (docs/API-EXTENSIONS.md), and the run is about answers, not waiting.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgpack
import schemathesis

from shared.compression import CODEC_NAMES, compress_whole

LONG_POLL_MS_MAX = 200
BATCH_RECORDS_MAX = 1000
"""At most the node's batch_records_max (the schema says it; a bigger count stays as is)."""
_BYTES_FIELDS = frozenset({"payload", "compressed_payloads"})


def _to_bin(value: object) -> object:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return value
    return value


def msgpack_body(value: object) -> object:
    """A generated JSON-shaped body with its base64 bytes fields as ``bin``."""
    if not isinstance(value, dict):
        return value
    body = dict(value)
    for name in _BYTES_FIELDS & body.keys():
        body[name] = _to_bin(body[name])
    if isinstance(body.get("payloads"), list):
        body["payloads"] = [_to_bin(item) for item in body["payloads"]]
    return body


def _packable(value: object) -> object:
    """Integers msgpack has no encoding for (negative tests make them) as floats: still
    out of range, as the test meant."""
    if isinstance(value, int) and not isinstance(value, bool) and not (
            -(2**63) <= value < 2**64):
        return float(value)
    if isinstance(value, dict):
        return {k: _packable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_packable(v) for v in value]
    return value


@schemathesis.serializer("application/msgpack")
def _serialize_msgpack(ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    packed: bytes = msgpack.packb(_packable(msgpack_body(value)), use_bin_type=True)
    return packed


def as_json(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


@schemathesis.deserializer("application/msgpack")
def _deserialize_msgpack(ctx: schemathesis.DeserializationContext,
                         response: schemathesis.Response) -> Any:
    return as_json(msgpack.unpackb(response.content, raw=False))


@schemathesis.hook
def map_query(context: schemathesis.HookContext, query: dict[str, Any] | None
              ) -> dict[str, Any] | None:
    operation = context.operation
    if query is None or operation is None or not operation.path.endswith("/records"):
        return query
    wait = query.get("wait_ms")
    if isinstance(wait, int) and not isinstance(wait, bool) and wait > LONG_POLL_MS_MAX:
        query["wait_ms"] = LONG_POLL_MS_MAX
    elif isinstance(wait, str) and wait.isdigit() and int(wait) > LONG_POLL_MS_MAX:
        query["wait_ms"] = str(LONG_POLL_MS_MAX)
    return query


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    operation = context.operation
    if (operation is None or not operation.path.endswith("/append-batch")
            or not isinstance(body, dict)):
        return body
    codec = CODEC_NAMES.get(body.get("compression"))  # type: ignore[arg-type]
    records = body.get("records")
    if isinstance(records, float) and records.is_integer():
        records = int(records)
    if (codec is None or isinstance(records, bool) or not isinstance(records, int)
            or not 1 <= records <= BATCH_RECORDS_MAX
            or not isinstance(body.get("compressed_payloads"), str)
            or _to_bin(body["compressed_payloads"]) is body["compressed_payloads"]):
        # (Not valid base64: a negative case, which must stay one.)
        return body
    # Payloads that compress well: compress_whole gives no blob for a batch it cannot shrink.
    payloads = [b"record %d " % i + b"x" * 100 for i in range(records)]
    blob = compress_whole(payloads, codec, sum(map(len, payloads)))
    assert blob is not None
    return {**body, "compressed_payloads": base64.b64encode(blob).decode("ascii")}
