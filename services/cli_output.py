"""How ``seqlog read`` prints records and gaps: ``text`` for people, ``json`` for scripts,
``raw`` for pipes.

- ``text``: a header line, then one tab-separated line per record (LSN as ``e5n8`` and as an
  integer, the time in ISO 8601 UTC with milliseconds, the key or ``-``, the payload) and per
  gap (``GAP`` and its type in the first columns). A payload is decoded as UTF-8 with every
  control character, backslash and undecodable byte escaped (``\\t``, ``\\n``, ``\\\\``,
  ``\\xff``), so that one entry is always one line and the columns stay columns.
- ``json``: one JSON object per line: records with ``payload`` (the UTF-8 text, or null when
  the bytes are not UTF-8) and ``payload_base64`` (always), gaps with their type and span.
- ``raw``: each record's payload bytes followed by a newline, gaps skipped.
"""

from __future__ import annotations

import base64
import datetime
from typing import BinaryIO

import orjson

from seqlog import Gap, Record
from shared.types import Lsn, format_lsn

FORMATS = ("text", "json", "raw")
TEXT_HEADER = "LSN\tLSN_INT\tTIME\tKEY\tPAYLOAD"

_ESCAPES: dict[int, str] = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F)},
    0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x5C: "\\\\",
    # Bytes that are not UTF-8 arrive as lone surrogates (surrogateescape).
    **{0xDC00 + byte: f"\\x{byte:02x}" for byte in range(0x80, 0x100)},
}


def iso_time(timestamp_ms: int) -> str:
    """``2026-11-24T13:20:00.123Z``: ISO 8601, UTC, milliseconds."""
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"


def escape_payload(payload: bytes) -> str:
    """The payload as one line of text, escaped so that it cannot be mistaken for columns."""
    return payload.decode("utf-8", "surrogateescape").translate(_ESCAPES)


def _span(lo: Lsn, hi: Lsn) -> tuple[str, str]:
    return f"{format_lsn(lo)}..{format_lsn(hi)}", f"{lo}..{hi}"


def text_line(entry: Record | Gap) -> str:
    if isinstance(entry, Gap):
        span, numbers = _span(entry.lo, entry.hi)
        return f"{span}\t{numbers}\t-\t-\tGAP {entry.type}"
    key = "-" if entry.key is None else escape_payload(entry.key.encode())
    return (f"{format_lsn(entry.lsn)}\t{entry.lsn}\t{iso_time(entry.timestamp_ms)}\t{key}\t"
            f"{escape_payload(entry.payload)}")


def json_line(entry: Record | Gap) -> bytes:
    if isinstance(entry, Gap):
        doc: dict[str, object] = {
            "type": "gap", "gap": entry.type, "lo": entry.lo, "hi": entry.hi,
            "lo_text": format_lsn(entry.lo), "hi_text": format_lsn(entry.hi)}
    else:
        try:
            text: str | None = entry.payload.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        doc = {"type": "record", "lsn": entry.lsn, "lsn_text": format_lsn(entry.lsn),
               "timestamp_ms": entry.timestamp_ms, "time": iso_time(entry.timestamp_ms),
               "key": entry.key, "payload": text,
               "payload_base64": base64.b64encode(entry.payload).decode("ascii")}
    return orjson.dumps(doc) + b"\n"


class EntryWriter:
    """Writes entries to a binary stream in one of ``FORMATS``; the text header goes out
    before the first entry (also when there is none, at ``finish``)."""

    def __init__(self, out: BinaryIO, output_format: str) -> None:
        assert output_format in FORMATS
        self.out = out
        self.format = output_format
        self._header_due = output_format == "text"

    def _header(self) -> None:
        if self._header_due:
            self._header_due = False
            self.out.write(TEXT_HEADER.encode() + b"\n")

    def write(self, entries: list[Record | Gap]) -> None:
        """One page of entries, flushed: a follower sees each page as it arrives."""
        self._header()
        out = self.out
        if self.format == "text":
            out.write(b"".join(text_line(e).encode() + b"\n" for e in entries))
        elif self.format == "json":
            out.write(b"".join(json_line(e) for e in entries))
        else:
            out.write(b"".join(e.payload + b"\n" for e in entries if isinstance(e, Record)))
        out.flush()

    def finish(self) -> None:
        self._header()
        self.out.flush()
