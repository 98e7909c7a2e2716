"""How a node writes its log: ``text`` (one human line per record, the default) or ``json``
(``--log-format json`` or ``SEQLOG_LOG_FORMAT=json``): one JSON object per line with ``time``
(ISO 8601 UTC, milliseconds), ``level``, ``logger``, ``node_id``, ``message`` and, where the
record is about a log, ``log_id``, ``epoch`` and ``lsn`` as fields of their own.

Those fields come from the record's ``extra`` when a call passes them, and otherwise from the
message template: the code logs ``"log %d: sequencer active in epoch %d"``, and the word before
each placeholder names its argument (``log`` -> ``log_id``, ``epoch`` -> ``epoch``, ``lsn`` or
``tail`` -> ``lsn``; the first of each wins). Templates are parsed once and remembered, so a
record costs one dictionary lookup beyond the JSON encoding. A record whose message does not
format (bad arguments) is still written, with its raw template. Malformed requests, which
aiohttp logs as errors with a traceback, are one INFO line (``QuietBadRequests``).
"""

from __future__ import annotations

import datetime
import logging
import re
import traceback
from typing import Any

import orjson
from aiohttp.http_exceptions import HttpProcessingError

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELD_OF_WORD: dict[str, str] = {"log": "log_id", "epoch": "epoch", "lsn": "lsn",
                                 "tail": "lsn"}
FIELDS = ("log_id", "epoch", "lsn")
TEMPLATES_CACHED_MAX = 4096

_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[a-zA-Z%]")
_WORD = re.compile(r"[A-Za-z_]+")
_templates: dict[str, tuple[tuple[int, str], ...]] = {}


def template_fields(template: str) -> tuple[tuple[int, str], ...]:
    """(argument index, field) for each placeholder of ``template`` that names a field."""
    found = _templates.get(template)
    if found is not None:
        return found
    fields: list[tuple[int, str]] = []
    taken: set[str] = set()
    index = 0
    previous_end = 0
    for match in _SPEC.finditer(template):
        spec = match.group()
        if spec == "%%":
            previous_end = match.end()
            continue
        words = _WORD.findall(template[previous_end:match.start()])
        field = FIELD_OF_WORD.get(words[-1].lower()) if words else None
        if field is not None and field not in taken and "(" not in spec:
            fields.append((index, field))
            taken.add(field)
        index += 1 + spec.count("*")
        previous_end = match.end()
    result = tuple(fields)
    if len(_templates) < TEMPLATES_CACHED_MAX:
        _templates[template] = result
    return result


def _iso(created_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(created_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(created_s * 1000) % 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module's doc)."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        doc: dict[str, Any] = {"time": _iso(record.created), "level": record.levelname,
                               "logger": record.name, "node_id": self.node_id,
                               "message": message}
        args = record.args if isinstance(record.args, tuple) else ()
        if isinstance(record.msg, str) and args:
            for index, field in template_fields(record.msg):
                if index < len(args) and isinstance(args[index], int) and not isinstance(
                        args[index], bool):
                    doc[field] = args[index]
        for field in FIELDS:
            value = record.__dict__.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                doc[field] = value
        if record.exc_info:
            doc["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.exc_text:
            doc["exception"] = record.exc_text
        return orjson.dumps(doc, default=str).decode()


class QuietBadRequests(logging.Filter):
    """aiohttp logs a malformed request (bad header bytes, a broken request line: the
    client's fault, which the client is answered 400 for) as an ERROR with a traceback, which
    would page someone for nothing: it becomes one INFO line naming the problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 500) < 500:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "refused a malformed request: %s"
            record.args = (" ".join(str(exc).split())[:300],)
            record.exc_info = record.exc_text = None
        return True


def configure(log_format: str, level: str, node_id: str) -> None:
    """The root logger of a node process, writing to stderr in ``log_format``."""
    assert log_format in LOG_FORMATS, log_format
    logging.getLogger("aiohttp.server").addFilter(QuietBadRequests())
    if log_format == "text":
        logging.basicConfig(level=level, format=TEXT_FORMAT)
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(node_id))
    logging.basicConfig(level=level, handlers=[handler])
