"""Untrusted HTTP input to typed requests, and typed answers to JSON or msgpack bodies.

Pure and framework-free so that every rejection rule is testable on its own. A parser returns
its result or a ``Rejection`` (a ``Status`` plus a human message); it never raises on bad input.

Rules (API.md): bodies are ``application/json`` or ``application/msgpack`` (an absent
Content-Type is read as JSON; any other type is ``BADMSG``). Bytes fields are ``bin`` in msgpack
and padded standard base64 strings in JSON. Type errors are ``BADMSG``; values out of range are
``INVALID_PARAM``; sizes over the configured maximum are ``TOOBIG``. Unknown body fields and
query parameters are ignored so that clients may send newer fields to older nodes.

Integer fields take any integer-valued number, as JSON Schema's ``integer`` does: ``5.0`` (or
``5e0``, or a msgpack float) is 5, up to ``INTEGRAL_FLOAT_MAX`` = 2**53, past which a float no
longer says which integer was meant (send those as plain integers). ``no_forward`` (query or
header) is one of ``1``, ``true``, ``yes`` (forward no) or ``0``, ``false``, ``no``; anything
else is ``INVALID_PARAM``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import orjson

from shared.append_validation import (
    Invalid,
    check_key,
    check_log_id,
    check_payload,
    check_payloads,
    check_producer,
    check_records_count,
)
from shared.compression import CODEC_NAMES, check_batch
from shared.config import ApiConfig
from shared.http_contract import JSON, MEDIA_TYPE_ALIASES, MSGPACK, MediaType
from shared.status import Status
from shared.types import LSN_MAX, LSN_OLDEST, LogId, Lsn

_MEDIA_ALIASES = MEDIA_TYPE_ALIASES

READ_LIMIT_DEFAULT = 1000
"""``limit`` of a read that names none (API.md), before clamping to ``read_records_max``."""
UINT64_MAX = 2**64 - 1
assert UINT64_MAX == LSN_MAX

INTEGRAL_FLOAT_MAX = 2**53
"""Largest float taken for an integer field: every integer up to it is exactly a float."""
NO_FORWARD_VALUES: dict[str, bool] = {
    "1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}

_UINT_TEXT = re.compile(r"[0-9]{1,20}")
_LOG_ID_TEXT = re.compile(r"[0-9]{1,19}")


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused; becomes the error body."""

    status: Status
    message: str


@dataclass(slots=True, kw_only=True)
class AppendRequest:
    """A validated append (not frozen: one is built per HTTP append, and a frozen dataclass's
    ``__init__`` costs a call per field)."""

    payloads: tuple[bytes, ...]
    key: str | None
    producer_id: str | None
    producer_seq: int | None
    compression: int = 0
    """A compressed batch (``shared.compression.Codec``): ``payloads`` is ``(blob,)``."""
    records: int = 0
    """With ``compression``: the batch's record count (checked by expanding it)."""

    @property
    def records_count(self) -> int:
        return self.records if self.compression else len(self.payloads)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadParams:
    from_lsn: Lsn
    records_max: int
    bytes_max: int
    wait_ms: int


def _mime(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def body_media_type(content_type: str | None) -> MediaType | Rejection:
    """The encoding of a request body, from its Content-Type header."""
    if content_type is None or not content_type.strip():
        return JSON
    media = _MEDIA_ALIASES.get(_mime(content_type))
    if media is None:
        return Rejection(
            Status.BADMSG,
            f"unsupported Content-Type {content_type[:100]!r}: "
            "send application/json or application/msgpack",
        )
    return media


def _accept_q(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def response_media_type(accept: str | None, content_type: str | None) -> MediaType:
    """Accept's preferred supported type, else the request's Content-Type, else JSON.

    Wildcards name no type, so ``*/*`` falls through to the Content-Type rule."""
    best: tuple[float, MediaType] | None = None
    for item in (accept or "").split(","):
        mime, *params = item.split(";")
        media = _MEDIA_ALIASES.get(mime.strip().lower())
        q = _accept_q(params)
        if media is not None and q > 0.0 and (best is None or q > best[0]):
            best = (q, media)
    if best is not None:
        return best[1]
    if content_type is not None:
        media = _MEDIA_ALIASES.get(_mime(content_type))
        if media is not None:
            return media
    return JSON


def _json_default(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode_body(doc: object, media: MediaType) -> bytes:
    """Encode an answer; ``bytes`` values become bin (msgpack) or base64 strings (JSON)."""
    if media == MSGPACK:
        packed: bytes = msgpack.packb(doc, use_bin_type=True)
        return packed
    return orjson.dumps(doc, default=_json_default)


def decode_body(body: bytes, media: MediaType) -> dict[str, Any] | Rejection:
    """The body's top-level map."""
    doc: object
    if media == MSGPACK:
        try:
            doc = msgpack.unpackb(body, raw=False, strict_map_key=True)
        # The msgpack decoder signals hostile input with several unrelated exception types.
        except Exception as exc:
            return Rejection(Status.BADMSG, f"body is not valid msgpack: {type(exc).__name__}")
    else:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return Rejection(Status.BADMSG, f"body is not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return Rejection(Status.BADMSG, "body must be a map")
    return doc


def _bytes_field(value: object, name: str, media: MediaType) -> bytes | Rejection:
    if media == MSGPACK:
        if isinstance(value, bytes):
            return value
        return Rejection(Status.BADMSG, f"{name} must be msgpack bin")
    if not isinstance(value, str):
        return Rejection(Status.BADMSG, f"{name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return Rejection(Status.BADMSG, f"{name} is not padded standard base64")


def integral(value: object) -> object:
    """``value``, or the int an integer-valued float (up to ``INTEGRAL_FLOAT_MAX``) stands for;
    anything else unchanged, for the type checks that follow."""
    if type(value) is float and value.is_integer() and -INTEGRAL_FLOAT_MAX <= value <= (
            INTEGRAL_FLOAT_MAX):
        return int(value)
    return value


def parse_no_forward(query: str | None, header: str | None) -> bool | Rejection:
    """``no_forward`` from the query parameter and the header (either asks)."""
    wanted = False
    for name, value in (("no_forward", query), ("X-Seqlog-No-Forward", header)):
        if value is None:
            continue
        flag = NO_FORWARD_VALUES.get(value)
        if flag is None:
            return Rejection(Status.INVALID_PARAM, f"{name}={value[:40]!r}: send 1, true or yes "
                                                   "(or 0, false, no)")
        wanted = wanted or flag
    return wanted


def _rejection(invalid: Invalid | None) -> Rejection | None:
    return None if invalid is None else Rejection(invalid.status, invalid.message)


def _payload(value: object, name: str, media: MediaType, api: ApiConfig) -> bytes | Rejection:
    payload = _bytes_field(value, name, media)
    if isinstance(payload, Rejection):
        return payload
    # The size check runs per payload here, so that a huge batch fails before decoding it all.
    return _rejection(check_payload(payload, name, api)) or payload


def _append_options(
    doc: dict[str, Any], payloads: tuple[bytes, ...], api: ApiConfig, *,
    payloads_checked: bool = False,
) -> AppendRequest | Rejection:
    """``payloads_checked``: a compressed batch, whose records ``check_batch`` checked."""
    if len(doc) == 1 and not payloads_checked:
        # Nothing but the payload(s), as most appends come: no options to look up.
        invalid = check_payloads(payloads, api)
        if invalid is not None:
            return Rejection(invalid.status, invalid.message)
        return AppendRequest(payloads=payloads, key=None, producer_id=None, producer_seq=None)
    key = doc.get("key")
    producer_id = doc.get("producer_id")
    producer_seq = doc.get("producer_seq")
    if type(producer_seq) is float:
        producer_seq = integral(producer_seq)
    # The one set of append rules (shared.append_validation), as for binary and forwarded
    # appends.
    invalid = (
        (None if payloads_checked else check_payloads(payloads, api))
        # (The common absent key and producer skip their calls; the checks pass them.)
        or (None if key is None else check_key(key))
        or (None if producer_id is None and producer_seq is None
            else check_producer(producer_id, producer_seq)))
    if invalid is not None:
        return Rejection(invalid.status, invalid.message)
    assert key is None or isinstance(key, str)
    assert producer_id is None or isinstance(producer_id, str)
    assert producer_seq is None or isinstance(producer_seq, int)
    return AppendRequest(
        payloads=payloads, key=key, producer_id=producer_id, producer_seq=producer_seq
    )


def parse_append(
    doc: dict[str, Any], media: MediaType, api: ApiConfig
) -> AppendRequest | Rejection:
    """``{"payload": bytes, "key"?, "producer_id"?, "producer_seq"?}``."""
    if "payload" not in doc:
        return Rejection(Status.BADMSG, "payload is missing")
    value = doc["payload"]
    # (msgpack bin needs no decoding: the common case skips the call.)
    payload = value if type(value) is bytes and media == MSGPACK else _bytes_field(
        value, "payload", media)
    if isinstance(payload, Rejection):
        return payload
    # The payload's size is checked with the other options (``check_payloads``).
    return _append_options(doc, (payload,), api)


def plain_payload(doc: dict[str, Any], media: MediaType, api: ApiConfig) -> bytes | None:
    """The payload of an append body that is nothing but a msgpack ``{"payload": bin}``
    within ``payload_bytes_max``: the answer ``parse_append`` would give (an
    ``AppendRequest`` of that payload and no options; ``check_payloads``' single-payload
    case), without building it. None for anything else, which ``parse_append`` decides."""
    if len(doc) == 1 and media == MSGPACK:
        payload = doc.get("payload")
        if type(payload) is bytes and len(payload) <= api.payload_bytes_max:
            return payload
    return None


def parse_append_batch(
    doc: dict[str, Any], media: MediaType, api: ApiConfig
) -> AppendRequest | Rejection:
    """``{"payloads": [bytes, ...], ...}``: 1..``batch_records_max`` payloads; or a compressed
    batch (``parse_compressed_batch``)."""
    if "compressed_payloads" in doc or "compression" in doc:
        return parse_compressed_batch(doc, media, api)
    items = doc.get("payloads")
    if not isinstance(items, list):
        return Rejection(Status.BADMSG, "payloads must be a list")
    rejection = _rejection(check_records_count(len(items), api))
    if rejection is not None:
        return rejection
    payloads: list[bytes] = []
    for index, item in enumerate(items):
        payload = _payload(item, f"payloads[{index}]", media, api)
        if isinstance(payload, Rejection):
            return payload
        payloads.append(payload)
    return _append_options(doc, tuple(payloads), api)


def parse_compressed_batch(
    doc: dict[str, Any], media: MediaType, api: ApiConfig
) -> AppendRequest | Rejection:
    """``{"compression": "lz4"|"zstd", "records": int, "compressed_payloads": bytes, ...}``
    (docs/API-EXTENSIONS.md): the batch is expanded here, once, and must hold exactly
    ``records`` payloads (1..``batch_records_max``, each within ``payload_bytes_max``, at
    most ``request_bytes_max`` in all); it is passed on, and stored, compressed."""
    name = doc.get("compression")
    if not isinstance(name, str):
        return Rejection(Status.BADMSG, 'compression must be "lz4" or "zstd"')
    codec = CODEC_NAMES.get(name)
    if codec is None:
        return Rejection(Status.BADMSG,
                         f'unknown compression {name[:40]!r}: send "lz4" or "zstd"')
    records = integral(doc.get("records"))
    if type(records) is not int:
        return Rejection(Status.BADMSG, "records must be an integer")
    if records < 1:
        return Rejection(Status.INVALID_PARAM, "records must be at least 1")
    if records > api.batch_records_max:
        return Rejection(Status.TOOBIG,
                         f"{records} records, over batch_records_max={api.batch_records_max}")
    if "compressed_payloads" not in doc:
        return Rejection(Status.BADMSG, "compressed_payloads is missing")
    blob = _bytes_field(doc["compressed_payloads"], "compressed_payloads", media)
    if isinstance(blob, Rejection):
        return blob
    status = check_batch(blob, codec, records, records_max=api.batch_records_max,
                         payload_bytes_max=api.payload_bytes_max,
                         bytes_max=api.request_bytes_max)
    if status is Status.TOOBIG:
        return Rejection(status, "a record of the batch is over "
                                 f"payload_bytes_max={api.payload_bytes_max}")
    if status is not Status.OK:
        return Rejection(status, f"compressed_payloads is not a {name} batch of {records} "
                                 f"payloads within request_bytes_max={api.request_bytes_max}")
    options = _append_options(doc, (blob,), api, payloads_checked=True)
    if isinstance(options, Rejection):
        return options
    return replace(options, compression=int(codec), records=records)


def parse_trim(doc: dict[str, Any], media: MediaType, api: ApiConfig) -> Lsn | Rejection:
    """``{"lsn": int}``: the new trim point (0 .. LSN_MAX - 1)."""
    lsn = integral(doc.get("lsn"))
    if "lsn" not in doc:
        return Rejection(Status.BADMSG, "lsn is missing")
    if type(lsn) is not int:
        return Rejection(Status.BADMSG, "lsn must be an integer")
    if not 0 <= lsn < LSN_MAX:
        return Rejection(Status.INVALID_PARAM, f"lsn must be in 0..{LSN_MAX - 1}")
    return Lsn(lsn)


def parse_find_time_query(pairs: Iterable[tuple[str, str]]) -> int | Rejection:
    """``timestamp_ms=<milliseconds since the epoch>`` (required)."""
    values = [value for name, value in pairs if name == "timestamp_ms"]
    if len(values) != 1:
        return Rejection(Status.BADMSG, "timestamp_ms is required, once")
    text = values[0].strip()
    if not text.isdigit() or len(text) > 19 or int(text) >= 2**63:
        return Rejection(Status.INVALID_PARAM,
                         f"timestamp_ms must be an integer in 0..2**63-1, not {values[0]!r}")
    return int(text)


def parse_log_id(text: str) -> LogId | Rejection:
    """A decimal log id in ``1 .. 2**62 - 1``."""
    if _LOG_ID_TEXT.fullmatch(text) is None:
        return Rejection(
            Status.INVALID_PARAM, f"log id {text[:40]!r} is not an integer in 1..2**62-1"
        )
    rejection = _rejection(check_log_id(int(text)))
    return LogId(int(text)) if rejection is None else rejection


def _uint_param(params: dict[str, str], name: str, default: int, low: int) -> int | Rejection:
    text = params.get(name)
    if text is None:
        return default
    if _UINT_TEXT.fullmatch(text) is None or not low <= int(text) <= UINT64_MAX:
        return Rejection(
            Status.INVALID_PARAM, f"{name}={text[:40]!r} is not an integer in {low}..2**64-1"
        )
    return int(text)


def parse_read_query(pairs: Iterable[tuple[str, str]], api: ApiConfig) -> ReadParams | Rejection:
    """``from`` (>= 1, default 1), ``limit`` (>= 1, default 1000), ``max_bytes`` (>= 1) and
    ``wait_ms`` (>= 0, default 0). Values over the configured maxima are clamped to them."""
    params: dict[str, str] = {}
    for name, value in pairs:
        if name in params:
            return Rejection(Status.INVALID_PARAM, f"query parameter {name[:40]!r} is repeated")
        params[name] = value
    from_lsn = _uint_param(params, "from", LSN_OLDEST, LSN_OLDEST)
    if isinstance(from_lsn, Rejection):
        return from_lsn
    limit = _uint_param(params, "limit", READ_LIMIT_DEFAULT, 1)
    if isinstance(limit, Rejection):
        return limit
    bytes_max = _uint_param(params, "max_bytes", api.read_bytes_max, 1)
    if isinstance(bytes_max, Rejection):
        return bytes_max
    wait_ms = _uint_param(params, "wait_ms", 0, 0)
    if isinstance(wait_ms, Rejection):
        return wait_ms
    return ReadParams(
        from_lsn=Lsn(from_lsn),
        records_max=min(limit, api.read_records_max),
        bytes_max=min(bytes_max, api.read_bytes_max),
        wait_ms=min(wait_ms, api.long_poll_ms_max),
    )
