"""Batch reads (``spark.read.format("seqlog")``) on a real local Spark against a real local
cluster: the rows equal what the client reads for the same LSN ranges (also across an epoch
change), starting offsets by LSN or by time, payload decoding, clear errors for bad options,
and trimmed records with ``failOnDataLoss`` true and false."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from seqlog import Client, Record
from services import local_cluster as lc
from shared.types import format_lsn, lsn_to_epoch
from tests.spark.support import (
    SparkCluster,
    append_many,
    client_records,
    fresh_log,
    wait_released,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

Row = tuple[int, int, int, int, int, str | None, bytes]


@dataclass(frozen=True)
class Logs:
    two_epochs: int
    """1500 records in one epoch, then 700 in a later one."""
    json_log: int
    """300 JSON records."""
    first_epoch: int
    release: dict[int, int]


@pytest.fixture(scope="module")
def logs(spark_cluster: SparkCluster) -> Logs:
    async def fill() -> Logs:
        a, b = fresh_log(), fresh_log()
        async with Client(spark_cluster.urls) as client:
            await append_many(client, a, 1500)
            await append_many(client, b, 300)
            first_epoch = (await client.tail(a)).epoch
        # A graceful restart of both sequencers moves every log to a new epoch.
        for node in ("seq1", "seq2"):
            await asyncio.to_thread(lc.restart, spark_cluster.dir, node)
        async with Client(spark_cluster.urls) as client:
            last = await append_many(client, a, 700, first_seq=1500)
            assert lsn_to_epoch(last) > first_epoch, "the restarts did not change the epoch"
            release = {a: await wait_released(client, a, last),
                       b: (await client.tail(b)).release_lsn}
        return Logs(two_epochs=a, json_log=b, first_epoch=first_epoch, release=release)

    return asyncio.run(fill())


def seqlog_read(spark: SparkSession, cluster: SparkCluster, logs: str, **options: str
                ) -> DataFrame:
    return (spark.read.format("seqlog").option("urls", cluster.urls_option)
            .option("logs", logs).options(**options).load())


def frame_rows(frame: DataFrame) -> list[Row]:
    picked = frame.select("log_id", "lsn", "epoch", "esn", F.unix_millis("timestamp"),
                          "key", "payload")
    return sorted(tuple(r) for r in picked.collect())  # type: ignore[misc]


def record_rows(log: int, records: list[Record]) -> list[Row]:
    return sorted((log, r.lsn, r.lsn >> 32, r.lsn & 0xFFFFFFFF, r.timestamp_ms, r.key,
                   r.payload) for r in records)


def truth(cluster: SparkCluster, ranges: dict[int, tuple[int, int]]) -> list[Row]:
    async def read() -> list[Row]:
        async with Client(cluster.urls) as client:
            rows: list[Row] = []
            for log, (start, end) in ranges.items():
                rows += record_rows(log, await client_records(client, log, start, end))
            return sorted(rows)

    return asyncio.run(read())


def test_batch_read_equals_client_reads_for_the_same_ranges(
        spark: SparkSession, spark_cluster: SparkCluster, logs: Logs) -> None:
    a, b = logs.two_epochs, logs.json_log
    everything = seqlog_read(spark, spark_cluster, f"{a},{b}", recordsPerPartition="400")
    expected = truth(spark_cluster, {a: (1, logs.release[a] + 1), b: (1, logs.release[b] + 1)})
    assert len(expected) == 2500
    assert frame_rows(everything) == expected
    # 2500 records in tasks of at most 400; the 2**32-LSN jump between epochs costs no tasks.
    assert 7 <= everything.rdd.getNumPartitions() <= 12

    # Explicit per-log ranges: LSNs (also as e5n8), end exclusive, the range crosses epochs.
    first = logs.first_epoch
    start_a, end_a = (first << 32) + 1400, logs.release[a] - 99
    ranged = seqlog_read(
        spark, spark_cluster, f"{a},{b}", recordsPerPartition="400",
        startingOffsets=json.dumps({str(a): format_lsn(start_a), str(b): (first << 32) + 50}),
        endingOffsets=json.dumps({str(a): end_a, str(b): (first << 32) + 250}))
    expected = truth(spark_cluster, {a: (start_a, end_a),
                                     b: ((first << 32) + 50, (first << 32) + 250)})
    assert len({lsn_to_epoch(row[1]) for row in expected if row[0] == a}) >= 2
    assert len(expected) == 101 + 700 - 100 + 200  # seq 1399..2099 of a, 49..248 of b
    assert frame_rows(ranged) == expected


def test_starting_timestamp_uses_find_time(
        spark: SparkSession, spark_cluster: SparkCluster, logs: Logs) -> None:
    a = logs.two_epochs

    async def pick() -> tuple[int, int]:
        async with Client(spark_cluster.urls) as client:
            records = await client_records(client, a, 1, logs.release[a] + 1)
            moment = records[1600].timestamp_ms
            return moment, await client.find_time(a, moment)

    moment, found = asyncio.run(pick())
    frame = seqlog_read(spark, spark_cluster, str(a), startingTimestamp=str(moment))
    assert frame_rows(frame) == truth(spark_cluster, {a: (found, logs.release[a] + 1)})
    assert frame.agg(F.min(F.unix_millis("timestamp"))).first()[0] >= moment  # type: ignore[index]


def test_json_and_msgpack_payloads_decode_into_columns(
        spark: SparkSession, spark_cluster: SparkCluster, logs: Logs) -> None:
    decoded = seqlog_read(spark, spark_cluster, str(logs.json_log), payloadFormat="json",
                          payloadSchema="log bigint, seq bigint, missing string")
    rows = decoded.select("log", "seq", "missing").collect()
    assert sorted(r.seq for r in rows) == list(range(300))
    assert {r.log for r in rows} == {logs.json_log} and {r.missing for r in rows} == {None}

    mp = fresh_log()
    payloads = [msgpack.packb({"name": "a", "n": 1, "tags": ["x", "y"]}),
                msgpack.packb({"name": "b", "n": "not a number"}),
                b"\xc1 not msgpack", msgpack.packb([1, 2])]

    async def write() -> None:
        async with Client(spark_cluster.urls) as client:
            result = await client.append_batch(mp, payloads)
            await wait_released(client, mp, result.last_lsn)

    asyncio.run(write())
    frame = seqlog_read(spark, spark_cluster, str(mp), payloadFormat="msgpack",
                        payloadSchema="name string, n int, tags array<string>")
    got = [(r.name, r.n, r.tags, r.payload) for r in frame.orderBy("lsn").collect()]
    assert got == [("a", 1, ["x", "y"], payloads[0]), ("b", None, None, payloads[1]),
                   (None, None, None, payloads[2]), (None, None, None, payloads[3])]


@pytest.mark.parametrize(("options", "message"), [
    ({"logs": "1,x"}, "option logs: 'x'"),
    ({"logs": "1", "startingOffsets": "{oops"}, "option startingOffsets"),
    ({"logs": "1", "payloadFormat": "json"}, "needs payloadSchema"),
    ({"logs": "1", "payloadFormat": "json", "payloadSchema": "lsn bigint"},
     "appears twice"),
])
def test_bad_options_fail_with_a_clear_message(
        spark: SparkSession, spark_cluster: SparkCluster, options: dict[str, str],
        message: str) -> None:
    with pytest.raises(Exception, match=message):
        (spark.read.format("seqlog").option("urls", spark_cluster.urls_option)
         .options(**options).load().collect())


def test_start_beyond_the_release_pointer_is_refused(
        spark: SparkSession, spark_cluster: SparkCluster, logs: Logs) -> None:
    b = logs.json_log
    beyond = logs.release[b] + 5
    with pytest.raises(Exception, match="beyond its release pointer"):
        seqlog_read(spark, spark_cluster, str(b),
                    startingOffsets=json.dumps({str(b): beyond})).collect()


@pytest.fixture(scope="module")
def trimmed(spark_cluster: SparkCluster) -> Iterator[tuple[int, int, int]]:
    """A log of 100 records trimmed through its 30th: (log, trim LSN, release LSN)."""
    log = fresh_log()

    async def fill() -> tuple[int, int, int]:
        async with Client(spark_cluster.urls) as client:
            last = await append_many(client, log, 100)
            release = await wait_released(client, log, last)
            trim_lsn = await client.trim(log, last - 70)
            return log, trim_lsn, release

    yield asyncio.run(fill())


def test_trimmed_records_fail_the_read_or_are_skipped_and_shown(
        spark: SparkSession, spark_cluster: SparkCluster,
        trimmed: tuple[int, int, int]) -> None:
    log, trim_lsn, release = trimmed
    from_start = {"startingOffsets": json.dumps({str(log): 1})}
    # Asked for LSNs that are gone: data loss, as Kafka's source reports offsets out of range.
    with pytest.raises(Exception, match=(f"seqlog data loss: log {log}: LSNs e0n1.."
                                         f"{format_lsn(trim_lsn)} .* were trimmed")):
        seqlog_read(spark, spark_cluster, str(log), **from_start).collect()

    skipped = seqlog_read(spark, spark_cluster, str(log), failOnDataLoss="false",
                          includeGaps="true", **from_start)
    rows: list[Any] = skipped.orderBy("lsn").collect()
    gaps = [(r.gap_type, r.lsn, r.gap_last_lsn) for r in rows if r.gap_type]
    assert gaps == [("TRIM", 1, trim_lsn)]
    assert [r.lsn for r in rows if not r.gap_type] == list(range(trim_lsn + 1, release + 1))

    # "earliest" starts after the trim point: nothing is lost, nothing to report.
    earliest = seqlog_read(spark, spark_cluster, str(log))
    assert earliest.count() == 70
