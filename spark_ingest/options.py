"""The ``seqlog`` data source's options: parsed and checked once, with clear errors.

Spark hands a data source its options as strings (case-insensitive keys). Everything a user
can get wrong is reported here as a ``ValueError`` that names the option, so a bad option
fails the query at planning time with a message instead of a Python traceback from an
executor. Offsets follow the Kafka source: ``earliest``, ``latest`` or a JSON object of
per-log values, where ``-2`` means earliest and ``-1`` latest for that log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from shared.types import LOG_ID_MAX, LOG_ID_MIN, parse_lsn

LOGS_MAX = 10_000
"""Most logs one query reads: every trigger asks each log for its release pointer."""
RECORDS_PER_READ_MAX = 10_000
"""Largest ``recordsPerRead``; the nodes clamp larger read limits to this anyway."""
EARLIEST = -2
"""Kafka's code for "the earliest offset" in a per-log offsets JSON."""
LATEST = -1
"""Kafka's code for "the latest offset" in a per-log offsets JSON."""

PayloadFormat = Literal["binary", "json", "msgpack"]
PAYLOAD_FORMATS: tuple[PayloadFormat, ...] = ("binary", "json", "msgpack")
OffsetSpec = Literal["earliest", "latest"] | dict[int, int]
"""``earliest``, ``latest``, or per-log LSNs (or ``EARLIEST``/``LATEST`` per log)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceOptions:
    urls: tuple[str, ...]
    logs: tuple[int, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    include_gaps: bool
    payload_format: PayloadFormat
    payload_schema: str | None
    records_per_partition: int
    records_per_read: int
    timeout_ms: int
    stall_timeout_ms: int
    ca: str | None = None
    """CA file to verify the nodes' TLS certificates with (option ``ca``, default
    ``SEQLOG_CA``; docs/SECURITY.md)."""
    token: str | None = field(default=None, repr=False)
    """Option ``token``: the bearer token of a cluster with auth on (docs/SECURITY.md); else
    the executors' ``SEQLOG_TOKEN``. Kept out of ``repr`` so it is not logged."""


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Checks every option; ``streaming`` picks the Kafka defaults (start at ``latest`` for a
    stream, ``earliest`` for a batch read) and the options only one of the two accepts."""
    get = _Getter(options)
    urls = tuple(u.strip() for u in get.required("urls").split(",") if u.strip())
    if not urls:
        raise ValueError("option urls: give at least one node URL, e.g. http://127.0.0.1:7400")
    logs = parse_logs(get.required("logs"))
    starting = parse_offsets("startingOffsets", get.text("startingOffsets"),
                             "latest" if streaming else "earliest", logs)
    if streaming and get.text("endingOffsets") is not None:
        raise ValueError("option endingOffsets is for batch reads (spark.read); a stream "
                         "reads up to each log's release pointer")
    ending = parse_offsets("endingOffsets", get.text("endingOffsets"), "latest", logs)
    if ending == "earliest":
        raise ValueError("option endingOffsets: 'earliest' would read nothing; use 'latest' "
                         "or per-log LSNs")
    max_records = get.positive("maxRecordsPerTrigger", None)
    if max_records is not None and not streaming:
        raise ValueError("option maxRecordsPerTrigger is for streams (spark.readStream)")
    if max_records is not None and max_records < len(logs):
        raise ValueError(f"option maxRecordsPerTrigger ({max_records}) must be at least the "
                         f"number of logs ({len(logs)}) so that every log can make progress")
    payload_format = get.text("payloadFormat") or "binary"
    if payload_format not in PAYLOAD_FORMATS:
        raise ValueError(f"option payloadFormat must be one of {', '.join(PAYLOAD_FORMATS)}: "
                         f"{payload_format!r}")
    payload_schema = get.text("payloadSchema")
    if payload_format != "binary" and not payload_schema:
        raise ValueError(f"option payloadFormat={payload_format} needs payloadSchema, a DDL "
                         "string of the payload's fields, e.g. 'user string, amount double'")
    if payload_format == "binary" and payload_schema:
        raise ValueError("option payloadSchema needs payloadFormat json or msgpack")
    return SourceOptions(
        urls=urls,
        logs=logs,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=get.non_negative("startingTimestamp", None),
        max_records_per_trigger=max_records,
        fail_on_data_loss=get.boolean("failOnDataLoss", True),
        include_gaps=get.boolean("includeGaps", False),
        payload_format=payload_format,
        payload_schema=payload_schema,
        records_per_partition=get.positive("recordsPerPartition", 100_000) or 100_000,
        records_per_read=min(get.positive("recordsPerRead", 2_000) or 2_000,
                             RECORDS_PER_READ_MAX),
        timeout_ms=get.positive("timeoutMs", 30_000) or 30_000,
        stall_timeout_ms=get.positive("stallTimeoutMs", 60_000) or 60_000,
        ca=get.text("ca") or os.environ.get("SEQLOG_CA") or None,
        token=get.text("token"),
    )


def parse_logs(text: str) -> tuple[int, ...]:
    """``"1,2,5-9"`` -> ``(1, 2, 5, 6, 7, 8, 9)``: sorted, without repeats."""
    logs: set[int] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        low_text, dash, high_text = item.partition("-")
        low = _log_id(low_text.strip(), text)
        high = _log_id(high_text.strip(), text) if dash else low
        if high < low:
            raise ValueError(f"option logs: range {item!r} goes backwards")
        if high - low + 1 + len(logs) > LOGS_MAX:
            raise ValueError(f"option logs: more than {LOGS_MAX} logs in {text!r}")
        logs.update(range(low, high + 1))
    if not logs:
        raise ValueError(f"option logs: no log ids in {text!r}; e.g. '1,2,5-9'")
    return tuple(sorted(logs))


def parse_offsets(name: str, text: str | None, default: Literal["earliest", "latest"],
                  logs: tuple[int, ...]) -> OffsetSpec:
    """``earliest``, ``latest``, or JSON ``{"7": 1234, "8": "e2n5", "9": -2}``; logs left
    out of the JSON get ``default``."""
    if text is None or not text.strip():
        return default
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return "earliest" if word == "earliest" else "latest"
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"option {name}: expected earliest, latest or a JSON object of "
                         f"per-log LSNs like {{\"7\": 1234}}: {text!r}") from None
    if not isinstance(decoded, dict):
        raise ValueError(f"option {name}: the JSON must be an object of log id -> LSN: {text!r}")
    known = set(logs)
    fallback = EARLIEST if default == "earliest" else LATEST
    chosen = dict.fromkeys(logs, fallback)
    for key, value in decoded.items():
        log = _log_id(str(key), text)
        if log not in known:
            raise ValueError(f"option {name}: log {log} is not among the logs option's logs")
        chosen[log] = _offset_value(name, log, value)
    return chosen


def _offset_value(name: str, log: int, value: object) -> int:
    if value in (EARLIEST, LATEST) and type(value) is int:
        return value
    lsn = parse_lsn(value) if isinstance(value, str) else value
    if type(lsn) is not int or lsn < 1:
        raise ValueError(f"option {name}: log {log}: expected an LSN >= 1 (an integer or "
                         f"'e5n8'), -2 (earliest) or -1 (latest): {value!r}")
    return lsn


def _log_id(text: str, whole: str) -> int:
    if not text.isdigit() or not LOG_ID_MIN <= int(text) <= LOG_ID_MAX:
        raise ValueError(f"option logs: {text!r} in {whole!r} is not a log id "
                         f"(an integer in 1..2**62-1)")
    return int(text)


class _Getter:
    """Typed, case-insensitive access to the string options, naming the option on errors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = {str(k).lower(): str(v) for k, v in options.items()}

    def text(self, name: str) -> str | None:
        return self._options.get(name.lower())

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None or not value.strip():
            raise ValueError(f"option {name} is required")
        return value

    def positive(self, name: str, default: int | None) -> int | None:
        value = self.text(name)
        if value is None:
            return default
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"option {name}: expected a positive integer: {value!r}")
        return int(value)

    def non_negative(self, name: str, default: int | None) -> int | None:
        value = self.text(name)
        if value is None:
            return default
        if not value.strip().isdigit():
            raise ValueError(f"option {name}: expected milliseconds since the Unix epoch "
                             f"(an integer >= 0): {value!r}")
        return int(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        if value.strip().lower() not in ("true", "false"):
            raise ValueError(f"option {name}: expected true or false: {value!r}")
        return value.strip().lower() == "true"
