"""Streaming: the source's offsets against a real cluster while appends go on (never above
the release pointer, micro-batches bounded by maxRecordsPerTrigger, Trigger.AvailableNow
stops at the release pointers it started with), and the ingest job on a real local Spark
through a trim: failOnDataLoss true fails and writes nothing; false skips, counts and goes on.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructField, StructType

from seqlog import Client
from shared.types import format_lsn, lsn_to_epoch
from spark_ingest.job import IngestJob, build_parser
from spark_ingest.options import parse_options
from spark_ingest.schema import RECORD_COLUMNS, layout
from spark_ingest.source import SeqlogStreamReader
from tests.spark.support import (
    SparkCluster,
    append_many,
    client_records,
    fresh_log,
    wait_released,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class Appender:
    """Appends batches of 20 records to one log from a thread until stopped."""

    def __init__(self, urls: list[str], log: int, first_seq: int) -> None:
        self.urls, self.log, self.seq = urls, log, first_seq
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Appender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive() and self.error is None, self.error

    def _run(self) -> None:
        async def go() -> None:
            async with Client(self.urls) as client:
                while not self.stop.is_set():
                    await append_many(client, self.log, 20, first_seq=self.seq, batch=20)
                    self.seq += 20

        try:
            asyncio.run(go())
        except BaseException as exc:
            self.error = exc


def stream_reader(cluster: SparkCluster, log: int, **extra: str) -> SeqlogStreamReader:
    options = parse_options({"urls": cluster.urls_option, "logs": str(log),
                             "startingOffsets": "earliest", **extra}, streaming=True)
    schema = StructType([StructField(name, kind) for name, kind in RECORD_COLUMNS])
    return SeqlogStreamReader(options, layout(schema, options))


def read_batch(reader: SeqlogStreamReader, start: dict[str, Any], end: dict[str, Any]
               ) -> list[int]:
    lsns: list[int] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            assert isinstance(batch, pa.RecordBatch)
            lsns += batch.column("lsn").to_pylist()
    return lsns


def test_offsets_stay_at_or_below_the_release_pointer_while_appends_go_on(
        spark_cluster: SparkCluster) -> None:
    log = fresh_log()

    async def tail() -> int:
        async with Client(spark_cluster.urls) as client:
            return (await client.tail(log)).release_lsn

    asyncio.run(_prefill(spark_cluster, log, 300))
    reader = stream_reader(spark_cluster, log, maxRecordsPerTrigger="50")
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    start = reader.initialOffset()
    assert start == {str(log): 1}
    seen: list[int] = []
    with Appender(spark_cluster.urls, log, first_seq=300):
        for _ in range(12):
            latest = reader.latestOffset(start, ReadAllAvailable())
            assert latest[str(log)] <= asyncio.run(tail()) + 1
            assert reader.reportLatestOffset() is not None
            end = reader.latestOffset(start, ReadMaxRows(50))
            assert end[str(log)] <= asyncio.run(tail()) + 1
            lsns = read_batch(reader, start, end)
            assert 1 <= len(lsns) <= 50, (start, end)
            seen += lsns
            start = end
        # Trigger.AvailableNow: the target is fixed when it starts, appends go on.
        reader.prepareForTriggerAvailableNow()
        assert reader.target is not None
        target = reader.target[log]
        while (end := reader.latestOffset(start, ReadAllAvailable())) != start:
            assert end[str(log)] <= target
            seen += read_batch(reader, start, end)
            start = end
    assert start[str(log)] == target

    async def truth() -> list[int]:
        async with Client(spark_cluster.urls) as client:
            return [r.lsn for r in await client_records(client, log, 1, target)]

    assert seen == sorted(set(seen)) == asyncio.run(truth())


async def _prefill(cluster: SparkCluster, log: int, count: int, first_seq: int = 0) -> int:
    async with Client(cluster.urls) as client:
        last = await append_many(client, log, count, first_seq=first_seq)
        return await wait_released(client, log, last)


def run_job(spark: SparkSession, cluster: SparkCluster, log: int, root: Path,
            *extra: str) -> tuple[int, dict[str, Any]]:
    args = build_parser().parse_args([
        "--url", cluster.urls_option, "--logs", str(log), "--to", str(root / "out"),
        "--checkpoint", str(root / "checkpoint"), "--trigger", "available-now",
        "--progress-interval-ms", "0", *extra])
    job = IngestJob(args)
    code = job.run(spark)
    return code, job.summary


def parquet_lsns(spark: SparkSession, out: Path) -> list[int]:
    rows = spark.read.parquet(str(out)).select("lsn").collect()
    return sorted(r.lsn for r in rows)


def test_ingest_through_a_trim_fails_or_skips_and_reports(
        spark: SparkSession, spark_cluster: SparkCluster, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = fresh_log()
    release = asyncio.run(_prefill(spark_cluster, log, 1000))
    epoch = lsn_to_epoch(release)
    first = (epoch << 32) + 1  # every record of this test is in one epoch

    code, summary = run_job(spark, spark_cluster, log, tmp_path, "--max-records-per-trigger",
                            "400", "--payload-format", "json",
                            "--payload-schema", "seq bigint")
    assert code == 0 and summary["status"] == "finished"
    assert summary["records"] == 1000 and summary["records_by_log"] == {str(log): 1000}
    assert summary["next_lsn_by_log"] == {str(log): release + 1}
    report = json.loads((tmp_path / "checkpoint" / "seqlog-ingest-report.json").read_text())
    sizes = [b["records"] for b in report["batches"]]
    assert max(sizes) <= 400 and sum(sizes) == 1000
    frame = spark.read.parquet(str(tmp_path / "out"))
    assert sorted(r.seq for r in frame.select("seq").collect()) == list(range(1000))
    assert {r.log_id for r in frame.select("log_id").distinct().collect()} == {log}

    # 400 more records; the first 200 of them are trimmed before the job reads them.
    release = asyncio.run(_prefill(spark_cluster, log, 400, first_seq=1000))

    async def trim() -> int:
        async with Client(spark_cluster.urls) as client:
            return await client.trim(log, first + 1199)

    trim_lsn = asyncio.run(trim())
    capsys.readouterr()
    code, summary = run_job(spark, spark_cluster, log, tmp_path)
    assert code == 1 and summary["status"] == "failed"
    err = capsys.readouterr().err
    assert (f"seqlog data loss: log {log}: LSNs {format_lsn(first + 1000)}.."
            f"{format_lsn(trim_lsn)}") in err, err
    assert "failOnDataLoss" in err
    assert parquet_lsns(spark, tmp_path / "out") == list(range(first, first + 1000))

    code, summary = run_job(spark, spark_cluster, log, tmp_path, "--fail-on-data-loss", "false")
    assert code == 0 and summary["status"] == "finished"
    assert summary["records_by_log"] == {str(log): 1200}
    assert summary["data_loss_lsns_by_log"] == {str(log): {"TRIM": 200}}
    assert summary["data_loss_gaps"] == [
        {"log_id": log, "type": "TRIM", "lo": first + 1000, "hi": trim_lsn}]
    assert "skipped log" in capsys.readouterr().out
    expected = [*range(first, first + 1000), *range(trim_lsn + 1, release + 1)]
    assert parquet_lsns(spark, tmp_path / "out") == expected
