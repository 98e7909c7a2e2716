"""The rules an append must pass before it reaches a sequencer, written once.

Every edge that takes appends from outside the node calls these after decoding its own
encoding: the HTTP routes (``services.http_parse``), the binary client protocol and appends
forwarded by other nodes (``frontend.service``). Pure: each check returns ``None`` or an
``Invalid`` (a ``Status`` and a message for the caller); none raises on bad input.

Status rules (API.md): a value of the wrong type is ``BADMSG``, a value out of range is
``INVALID_PARAM``, a size over the configured maximum is ``TOOBIG``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.compression import check_batch, check_batch_header
from shared.config import ApiConfig
from shared.limits import KEY_BYTES_MAX, PRODUCER_ID_BYTES_MAX, PRODUCER_SEQ_MAX
from shared.status import Status
from shared.types import LOG_ID_MAX, LOG_ID_MIN, log_id_valid

_ONLY_BYTES = frozenset((bytes,))


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why an append is refused; nothing was written."""

    status: Status
    message: str


def check_log_id(log_id: object) -> Invalid | None:
    if log_id_valid(log_id):
        return None
    return Invalid(Status.INVALID_PARAM,
                   f"log id {str(log_id)[:40]!r} is not an integer in {LOG_ID_MIN}..{LOG_ID_MAX}")


def check_records_count(count: int, api: ApiConfig) -> Invalid | None:
    """1 .. ``batch_records_max`` records: checked before decoding them."""
    if count < 1:
        return Invalid(Status.INVALID_PARAM, "payloads is empty")
    if count > api.batch_records_max:
        return Invalid(Status.TOOBIG,
                       f"{count} payloads, over batch_records_max={api.batch_records_max}")
    return None


def check_payload(payload: object, name: str, api: ApiConfig) -> Invalid | None:
    if type(payload) is not bytes:
        return Invalid(Status.BADMSG, f"{name} must be bytes")
    if len(payload) > api.payload_bytes_max:
        return Invalid(
            Status.TOOBIG,
            f"{name} has {len(payload)} bytes, over payload_bytes_max={api.payload_bytes_max}")
    return None


def check_payloads(payloads: Sequence[object], api: ApiConfig) -> Invalid | None:
    """Count, type and size of every payload, and their total against ``request_bytes_max``."""
    if len(payloads) == 1:
        # One payload (every single append) that passes, said without the generic loops
        # (ApiConfig keeps batch_records_max >= 1 and request_bytes_max >= payload_bytes_max);
        # anything else gets the full checks below, and their message.
        payload = payloads[0]
        if type(payload) is bytes and len(payload) <= api.payload_bytes_max:
            return None
    invalid = check_records_count(len(payloads), api)
    if invalid is not None:
        return invalid
    # The common case in C loops (no Python step per payload); the message only on failure.
    if not _ONLY_BYTES.issuperset(map(type, payloads)) or max(
            map(len, payloads)) > api.payload_bytes_max:  # type: ignore[arg-type]
        single = len(payloads) == 1
        for index, bad in enumerate(payloads):
            invalid = check_payload(bad, "payload" if single else f"payloads[{index}]", api)
            if invalid is not None:
                return invalid
    total = sum(map(len, payloads))  # type: ignore[arg-type]
    if total > api.request_bytes_max:
        return Invalid(Status.TOOBIG, f"{total} payload bytes, over "
                                      f"request_bytes_max={api.request_bytes_max}")
    return None


def check_text(value: object, name: str, bytes_max: int) -> Invalid | None:
    """An optional string field (``None`` passes) of at most ``bytes_max`` UTF-8 bytes."""
    if value is None:
        return None
    if type(value) is not str:
        return Invalid(Status.BADMSG, f"{name} must be a string")
    try:
        size_bytes = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return Invalid(Status.BADMSG, f"{name} is not valid UTF-8")
    if size_bytes > bytes_max:
        return Invalid(Status.INVALID_PARAM, f"{name} is longer than {bytes_max} bytes")
    return None


def check_key(key: object) -> Invalid | None:
    return check_text(key, "key", KEY_BYTES_MAX)


def check_producer(producer_id: object, producer_seq: object) -> Invalid | None:
    """An idempotent append's pair: both or neither; a non-empty id, a seq in 0..2**64-1."""
    invalid = check_text(producer_id, "producer_id", PRODUCER_ID_BYTES_MAX)
    if invalid is not None:
        return invalid
    if producer_id == "":
        return Invalid(Status.INVALID_PARAM, "producer_id must not be empty")
    if producer_seq is not None and type(producer_seq) is not int:
        return Invalid(Status.BADMSG, "producer_seq must be an integer")
    if producer_seq is not None and not 0 <= producer_seq <= PRODUCER_SEQ_MAX:
        return Invalid(Status.INVALID_PARAM, "producer_seq must be in 0..2**64-1")
    if (producer_id is None) != (producer_seq is None):
        return Invalid(Status.INVALID_PARAM, "producer_id and producer_seq go together")
    return None


def check_append(log_id: object, payloads: Sequence[object], key: object,
                 producer_id: object, producer_seq: object, api: ApiConfig) -> Invalid | None:
    """Every rule at once, for appends that arrive already decoded (binary protocol, forwarded
    appends). ``producer_seq`` is ``None`` when the append names no producer."""
    return (check_log_id(log_id) or check_payloads(payloads, api) or check_key(key)
            or check_producer(producer_id, producer_seq))


def check_compressed_append(log_id: object, payloads: Sequence[object], compression: int,
                            records: int, key: object, producer_id: object,
                            producer_seq: object, api: ApiConfig, *,
                            entering: bool) -> Invalid | None:
    """``check_append`` for a compressed batch (``payloads == (blob,)``, ``records`` records,
    ``shared.compression``). ``entering``: the batch enters the cluster here (a client's
    APPEND), so it is expanded once, in full; a batch forwarded by a node whose edge expanded
    it gets the cheap header check."""
    invalid = check_log_id(log_id)
    if invalid is not None:
        return invalid
    if len(payloads) != 1 or type(payloads[0]) is not bytes:
        return Invalid(Status.BADMSG, "a compressed batch travels as exactly one blob")
    blob = payloads[0]
    if entering:
        status = check_batch(blob, compression, records, records_max=api.batch_records_max,
                             payload_bytes_max=api.payload_bytes_max,
                             bytes_max=api.request_bytes_max)
    else:
        status = check_batch_header(blob, compression, records,
                                    records_max=api.batch_records_max,
                                    bytes_max=api.request_bytes_max)
    if status is not Status.OK:
        return Invalid(status, f"not a valid compressed batch of {records} records "
                               f"({status.name})")
    return check_key(key) or check_producer(producer_id, producer_seq)
