"""The data source's option parsing, budget sharing and the ingest report's arithmetic:
pure functions, no Spark and no cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_ingest.options import EARLIEST, LATEST, parse_logs, parse_offsets, parse_options
from spark_ingest.planning import new_client, share_budget
from spark_ingest.progress import IngestReport, batch_report, lag_text

E1 = 1 << 32
E2 = 2 << 32
BASE = {"urls": "http://127.0.0.1:1", "logs": "1,2,5-9"}


def test_logs_lists_and_ranges() -> None:
    assert parse_logs("1,2,5-9") == (1, 2, 5, 6, 7, 8, 9)
    assert parse_logs(" 9-9 , 3,3 ,") == (3, 9)


@pytest.mark.parametrize(("text", "message"), [
    ("", "no log ids"),
    ("x", "not a log id"),
    ("0", "not a log id"),
    ("5-3", "goes backwards"),
    ("1-20000", "more than 10000 logs"),
    (str(2**62), "not a log id"),
])
def test_bad_logs_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_logs(text)


def test_offsets_like_kafka() -> None:
    logs = (1, 2, 3)
    assert parse_offsets("startingOffsets", None, "latest", logs) == "latest"
    assert parse_offsets("startingOffsets", " Earliest ", "latest", logs) == "earliest"
    parsed = parse_offsets("startingOffsets", '{"1": 5, "2": "e1n7", "3": -2}', "latest", logs)
    assert parsed == {1: 5, 2: E1 + 7, 3: EARLIEST}
    assert parse_offsets("s", '{"1": -1}', "earliest", logs) == {1: LATEST, 2: EARLIEST,
                                                                 3: EARLIEST}


@pytest.mark.parametrize(("text", "message"), [
    ("{", "expected earliest, latest or a JSON object"),
    ("[1]", "must be an object"),
    ('{"4": 1}', "log 4 is not among"),
    ('{"1": 0}', "expected an LSN"),
    ('{"1": "e1x"}', "expected an LSN"),
    ('{"1": 1.5}', "expected an LSN"),
])
def test_bad_offsets_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_offsets("startingOffsets", text, "latest", (1, 2))


def test_options_defaults_differ_for_batch_and_stream() -> None:
    assert parse_options(BASE, streaming=False).starting == "earliest"
    stream = parse_options(BASE, streaming=True)
    assert stream.starting == "latest"
    assert stream.fail_on_data_loss is True
    assert stream.logs == (1, 2, 5, 6, 7, 8, 9)
    keys = parse_options({"URLS": "a,b", "LOGS": "1", "failondataloss": "FALSE"},
                         streaming=False)
    assert keys.urls == ("a", "b") and keys.fail_on_data_loss is False


@pytest.mark.parametrize(("extra", "streaming", "message"), [
    ({"urls": " , "}, False, "at least one node URL"),
    ({"logs": ""}, False, "option logs is required"),
    ({"maxRecordsPerTrigger": "5"}, False, "is for streams"),
    ({"maxRecordsPerTrigger": "3"}, True, "at least the number of logs"),
    ({"maxRecordsPerTrigger": "-1"}, True, "positive integer"),
    ({"endingOffsets": "latest"}, True, "for batch reads"),
    ({"endingOffsets": "earliest"}, False, "would read nothing"),
    ({"failOnDataLoss": "yes"}, False, "true or false"),
    ({"payloadFormat": "avro"}, False, "one of binary, json, msgpack"),
    ({"payloadFormat": "json"}, False, "needs payloadSchema"),
    ({"payloadSchema": "a int"}, False, "needs payloadFormat"),
    ({"startingTimestamp": "yesterday"}, False, "milliseconds since the Unix epoch"),
])
def test_bad_options_say_which(extra: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options({**BASE, **extra}, streaming=streaming)


def test_budget_never_exceeds_the_limit_and_feeds_every_log() -> None:
    starts = {1: E1 + 1, 2: E1 + 1, 3: E1 + 1, 4: 1}
    ends = {1: E1 + 11, 2: E1 + 1001, 3: E1 + 1, 4: E2 + 500}
    shares = share_budget(100, starts, ends)
    assert 3 not in shares  # nothing to read
    assert shares[1] == 10  # holds at most 10 records, gets no more
    assert sum(shares.values()) <= 100 and shares[2] >= 1 and shares[4] >= 1
    assert shares[2] + shares[4] == 90  # the rest is shared
    tight = share_budget(2, {1: 1, 2: 1}, {1: 50, 2: 50})
    assert tight == {1: 1, 2: 1}


def test_batch_report_counts_records_per_log_from_offsets_and_gaps() -> None:
    event = {
        "id": "q", "batchId": 3, "durationMs": {"triggerExecution": 1200},
        "sources": [{"startOffset": json.dumps({"1": E1 + 1, "2": 1}),
                     "endOffset": json.dumps({"1": E1 + 101, "2": E1 + 51})}],
        "observedMetrics": {"seqlog": {"records": 147, "payload_bytes": 999, "gaps": [
            {"log_id": 2, "gap_type": "BRIDGE", "lsn": 1, "gap_last_lsn": E1},
            {"log_id": 1, "gap_type": "TRIM", "lsn": E1 + 1, "gap_last_lsn": E1 + 2},
            {"log_id": 2, "gap_type": "HOLE", "lsn": E1 + 5, "gap_last_lsn": E1 + 5},
        ]}},
    }
    report = batch_report(event, {})
    assert report is not None
    assert report.records_by_log == {1: 98, 2: 49}
    assert sum(report.records_by_log.values()) == report.records
    assert [(g.log_id, g.type, g.lsns) for g in report.loss_gaps] == [(1, "TRIM", 2)]
    first = batch_report({**event, "batchId": 0, "sources": [
        {"startOffset": None, "endOffset": json.dumps({"1": E1 + 101, "2": E1 + 51})}]},
        {1: E1 + 1, 2: 1})
    assert first is not None and first.records_by_log == {1: 98, 2: 49}
    assert batch_report({**event, "observedMetrics": {}}, {}) is None


def test_report_replaces_a_batch_that_ran_again(tmp_path: Path) -> None:
    event = {"id": "q", "batchId": 0, "sources": [{"startOffset": '{"1": 1}',
                                                   "endOffset": '{"1": 11}'}],
             "observedMetrics": {"seqlog": {"records": 10, "payload_bytes": 10, "gaps": []}}}
    report = IngestReport()
    for _ in range(2):
        one = batch_report(event, {})
        assert one is not None
        report.add(one)
    assert report.records == 10 and report.records_by_log() == {1: 10}
    report.save(tmp_path / "r.json")
    assert IngestReport.load(tmp_path / "r.json").summary() == report.summary()


def test_lag_is_exact_within_an_epoch_and_a_bound_across() -> None:
    assert lag_text(E1 + 11, E1 + 10) == "0"
    assert lag_text(E1 + 1, E1 + 10) == "10"
    assert lag_text(E1 + 5, E2 + 7) == ">=7 (epoch 1->2)"


def test_token_option_reaches_the_client_and_stays_out_of_repr() -> None:

    options = parse_options({**BASE, "token": "secret-token"}, streaming=False)
    assert options.token == "secret-token"
    assert "secret-token" not in repr(options)
    assert new_client(options).auth_headers == {"Authorization": "Bearer secret-token"}
    assert parse_options(BASE, streaming=False).token is None
