"""``--log-format json`` (services.log_format): every record is one JSON line with the node id;
log id, epoch and LSN become fields from the message template or ``extra``; any template and
arguments (fuzzed) give valid JSON, never an exception."""

from __future__ import annotations

import logging
import sys

import orjson
from hypothesis import given
from hypothesis import strategies as st

from services.log_format import JsonFormatter, template_fields


def _record(msg: str, args: tuple[object, ...], **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("sequencer.runtime", logging.INFO, "x.py", 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_log_epoch_and_lsn_become_fields() -> None:
    formatter = JsonFormatter("seq1")
    line = formatter.format(_record("log %d: last clean epoch -> %d (tail %d): %s",
                                    (7, 3, 12884901890, "OK")))
    doc = orjson.loads(line)
    assert doc["node_id"] == "seq1" and doc["level"] == "INFO"
    assert doc["logger"] == "sequencer.runtime" and doc["time"].endswith("Z")
    assert (doc["log_id"], doc["epoch"], doc["lsn"]) == (7, 3, 12884901890)
    assert doc["message"] == "log 7: last clean epoch -> 3 (tail 12884901890): OK"
    # The first of each wins: "(last clean epoch %d)" does not replace the epoch.
    doc = orjson.loads(formatter.format(_record(
        "log %d: sequencer active in epoch %d (last clean epoch %d)", (9, 5, 4))))
    assert (doc["log_id"], doc["epoch"]) == (9, 5)
    doc = orjson.loads(formatter.format(_record("node %s ready", ("seq1",))))
    assert "log_id" not in doc and "epoch" not in doc


def test_extra_fields_and_exceptions() -> None:
    formatter = JsonFormatter("st1")
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed", (), log_id=11, lsn=42)
        record.exc_info = sys.exc_info()
    doc = orjson.loads(formatter.format(record))
    assert (doc["log_id"], doc["lsn"]) == (11, 42)
    assert "ValueError: boom" in doc["exception"]


def test_template_fields_skip_escaped_percent_and_star_widths() -> None:
    assert template_fields("100%% of log %d") == ((0, "log_id"),)
    assert template_fields("%*d epoch %d") == ((2, "epoch"),)


@given(st.text(max_size=60), st.lists(st.one_of(st.integers(), st.text(max_size=5),
                                                st.none(), st.floats()), max_size=4))
def test_any_template_and_arguments_give_one_json_line(msg: str, args: list[object]) -> None:
    line = JsonFormatter("n").format(_record(msg, tuple(args)))
    assert "\n" not in line
    assert orjson.loads(line)["node_id"] == "n"


def test_a_malformed_request_is_one_info_line_not_an_error_traceback() -> None:
    from aiohttp.http_exceptions import BadHttpMessage

    from services.log_format import QuietBadRequests
    try:
        raise BadHttpMessage("Invalid header value char:\n\n  b'X: \\x00'")
    except BadHttpMessage:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, "x.py", 1,
                                   "Error handling request", (), sys.exc_info())
    assert QuietBadRequests().filter(record)
    assert record.levelno == logging.INFO and record.exc_info is None
    line = record.getMessage()
    assert "\n" not in line and "Invalid header value char" in line
    # Other errors keep their level and traceback.
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        bug = logging.LogRecord("aiohttp.server", logging.ERROR, "x.py", 1, "Error handling "
                                "request", (), sys.exc_info())
    assert QuietBadRequests().filter(bug) and bug.levelno == logging.ERROR and bug.exc_info
