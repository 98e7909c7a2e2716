"""HTTP body encoding for the client: msgpack requests, msgpack or JSON responses.

Response bodies come from the network, so every field is type-checked here and a malformed
answer becomes ``LogError(BADMSG)`` instead of a ``KeyError`` deep inside a caller. Error
answers become ``LogError`` with the server's status name mapped onto ``shared.status.Status``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import msgpack

from seqlog.results import (
    GAP_TYPES,
    AppendResult,
    BatchResult,
    ClusterInfo,
    Gap,
    GapType,
    NodeInfo,
    NodeState,
    ReadResult,
    Record,
    TailResult,
)
from shared import http_contract
from shared.status import LogError, Status
from shared.types import Epoch, Lsn, NodeId, lsn_valid

MSGPACK = http_contract.MSGPACK
JSON = http_contract.JSON

# Used only when an error answer carries no readable status name (a proxy, or aiohttp's own
# 413/404 pages).
_HTTP_FALLBACK: dict[int, Status] = {
    400: Status.BADMSG,
    401: Status.UNAUTHENTICATED,
    403: Status.ACCESS,
    404: Status.NOTFOUND,
    413: Status.TOOBIG,
    429: Status.SEQNOBUFS,
    500: Status.INTERNAL,
    503: Status.NOTREADY,
    504: Status.TIMEDOUT,
}
_NODE_STATES: tuple[NodeState, ...] = ("ALIVE", "SUSPECT", "DEAD")


def encode(body: Mapping[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


class Decoded:
    """A parsed response body plus whether bytes fields arrive base64-encoded (JSON)."""

    __slots__ = ("data", "is_json")

    def __init__(self, data: dict[str, Any], is_json: bool) -> None:
        self.data = data
        self.is_json = is_json


def decode(raw: bytes, content_type: str) -> Decoded:
    """Parse a body by its content type; raises ``LogError(BADMSG)`` if it is not a map."""
    is_json = content_type.startswith(JSON)
    try:
        data = json.loads(raw) if is_json else msgpack.unpackb(raw, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise LogError(Status.BADMSG, f"unreadable response body: {exc}") from None
    if not isinstance(data, dict):
        raise LogError(Status.BADMSG, "response body is not a map")
    return Decoded(data, is_json)


def error_from(http_status: int, raw: bytes, content_type: str) -> LogError:
    """The ``LogError`` for a non-2xx answer."""
    fallback = _HTTP_FALLBACK.get(http_status, Status.INTERNAL)
    try:
        body = decode(raw, content_type).data
    except LogError:
        text = raw[:200].decode("utf-8", "replace").strip()
        return LogError(fallback, f"HTTP {http_status}: {text}")
    name = body.get("status")
    message = body.get("message")
    status = Status.__members__.get(name, fallback) if isinstance(name, str) else fallback
    text = message if isinstance(message, str) else f"HTTP {http_status}"
    return LogError(status, text)


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    # bool is an int subclass, never a valid number in this API.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise LogError(Status.BADMSG, f"response field {name!r} missing or of the wrong type")
    return value


def _lsn(data: Mapping[str, Any], name: str) -> Lsn:
    value = _field(data, name, int)
    if not lsn_valid(value):
        raise LogError(Status.BADMSG, f"response field {name!r} is not an LSN")
    return Lsn(value)


def _bytes(data: Mapping[str, Any], name: str, is_json: bool) -> bytes:
    if not is_json:
        return bytes(_field(data, name, bytes))
    text = _field(data, name, str)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise LogError(Status.BADMSG, f"response field {name!r} is not base64") from None


def _list(data: Mapping[str, Any], name: str) -> list[Any]:
    value: list[Any] = _field(data, name, list)
    return value


def parse_append(body: Decoded) -> AppendResult:
    return AppendResult(
        lsn=_lsn(body.data, "lsn"), timestamp_ms=_field(body.data, "timestamp_ms", int)
    )


def parse_batch(body: Decoded) -> BatchResult:
    data = body.data
    return BatchResult(
        first_lsn=_lsn(data, "first_lsn"),
        last_lsn=_lsn(data, "last_lsn"),
        count=_field(data, "count", int),
        timestamp_ms=_field(data, "timestamp_ms", int),
    )


def _record(item: Any, is_json: bool) -> Record:
    if not isinstance(item, dict):
        raise LogError(Status.BADMSG, "record is not a map")
    key = item.get("key")
    if key is not None and not isinstance(key, str):
        raise LogError(Status.BADMSG, "record key is not a string")
    return Record(
        lsn=_lsn(item, "lsn"),
        timestamp_ms=_field(item, "timestamp_ms", int),
        key=key,
        payload=_bytes(item, "payload", is_json),
    )


def _gap(item: Any) -> Gap:
    if not isinstance(item, dict):
        raise LogError(Status.BADMSG, "gap is not a map")
    gap_type = _field(item, "type", str)
    if gap_type not in GAP_TYPES:
        raise LogError(Status.BADMSG, f"unknown gap type {gap_type!r}")
    typed: GapType = gap_type
    return Gap(type=typed, lo=_lsn(item, "lo"), hi=_lsn(item, "hi"))


def parse_read(body: Decoded) -> ReadResult:
    data = body.data
    return ReadResult(
        records=[_record(item, body.is_json) for item in _list(data, "records")],
        gaps=[_gap(item) for item in _list(data, "gaps")],
        next_lsn=_lsn(data, "next_lsn"),
        release_lsn=_lsn(data, "release_lsn"),
    )


def parse_tail(body: Decoded) -> TailResult:
    data = body.data
    return TailResult(
        release_lsn=_lsn(data, "release_lsn"),
        trim_lsn=_lsn(data, "trim_lsn"),
        epoch=Epoch(_field(data, "epoch", int)),
        sequencer=NodeId(_field(data, "sequencer", str)),
    )


def _node(item: Any) -> NodeInfo:
    if not isinstance(item, dict):
        raise LogError(Status.BADMSG, "node is not a map")
    roles = _field(item, "roles", list)
    state = item.get("state", "ALIVE")
    if not all(isinstance(r, str) for r in roles) or state not in _NODE_STATES:
        raise LogError(Status.BADMSG, "node roles or state malformed")
    return NodeInfo(
        node_id=NodeId(_field(item, "node_id", str)),
        roles=tuple(roles),
        http=_field(item, "http", str),
        state=state,
        sequencer_weight=_number(item, "sequencer_weight"),
        storage_capacity=_number(item, "storage_capacity"),
        data=_optional_str(item, "data"),
    )


def _optional_str(item: Mapping[str, Any], name: str) -> str:
    value = item.get(name, "")
    return value if isinstance(value, str) else ""


def _number(item: Mapping[str, Any], name: str) -> float:
    value = item.get(name, 1.0)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise LogError(Status.BADMSG, f"node field {name!r} is not a number")
    return float(value)


def parse_cluster(body: Decoded) -> ClusterInfo:
    data = body.data
    cluster = data.get("cluster", "")
    version = data.get("protocol_version", 0)
    return ClusterInfo(
        cluster=cluster if isinstance(cluster, str) else "",
        nodes=[_node(item) for item in _list(data, "nodes")],
        cluster_fingerprint=_optional_str(data, "cluster_fingerprint"),
        protocol_version=version if type(version) is int else 0,
    )


def parse_lsn_field(body: Decoded, name: str) -> Lsn:
    return _lsn(body.data, name)
