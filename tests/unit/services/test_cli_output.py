"""``seqlog read``'s output formats (services.cli_output): any payload is one text line of
five columns that reads back as the same bytes; JSON lines carry the bytes exactly; raw is the
payloads themselves; ISO 8601 UTC times."""

from __future__ import annotations

import base64
import codecs
import io
import json

from hypothesis import given
from hypothesis import strategies as st

from seqlog import Gap, Record
from services.cli_output import TEXT_HEADER, EntryWriter, escape_payload, iso_time, text_line
from shared.types import Lsn


def _unescape(text: str) -> bytes:
    """The inverse of ``escape_payload``, for the property below."""
    return codecs.escape_decode(text.encode("utf-8"))[0]


@given(st.binary(max_size=200), st.one_of(st.none(), st.text(max_size=20)))
def test_any_payload_is_one_line_of_five_columns_that_reads_back(payload: bytes,
                                                                 key: str | None) -> None:
    record = Record(lsn=Lsn(7), timestamp_ms=1_700_000_000_123, key=key, payload=payload)
    line = text_line(record)
    assert "\n" not in line and "\r" not in line and line.count("\t") == 4
    assert _unescape(line.split("\t")[4]) == payload
    assert _unescape(escape_payload(payload)) == payload


@given(st.binary(max_size=200))
def test_json_lines_carry_the_bytes(payload: bytes) -> None:
    out = io.BytesIO()
    EntryWriter(out, "json").write([Record(lsn=Lsn(9), timestamp_ms=0, key=None,
                                           payload=payload)])
    doc = json.loads(out.getvalue())
    assert out.getvalue().count(b"\n") == 1
    assert base64.b64decode(doc["payload_base64"]) == payload
    assert doc["payload"] == (payload.decode() if _utf8(payload) else None)


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_text_has_a_header_even_when_empty_and_raw_skips_gaps() -> None:
    out = io.BytesIO()
    writer = EntryWriter(out, "text")
    writer.finish()
    assert out.getvalue() == TEXT_HEADER.encode() + b"\n"
    out = io.BytesIO()
    EntryWriter(out, "raw").write([Gap(type="HOLE", lo=Lsn(1), hi=Lsn(2)),
                                   Record(lsn=Lsn(3), timestamp_ms=0, key=None, payload=b"x\ty")])
    assert out.getvalue() == b"x\ty\n"


def test_iso_time_is_utc_with_milliseconds() -> None:
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"
    assert iso_time(1_795_496_240_047) == "2026-11-24T04:57:20.047Z"
