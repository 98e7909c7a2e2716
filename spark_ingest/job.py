"""The ingest job behind ``seqlog ingest``: released records into Parquet, exactly once.

``python -m spark_ingest.job --url URL --logs 1,2,5-9 --to PATH --checkpoint PATH`` runs a
Structured Streaming query from the ``seqlog`` source into Spark's Parquet file sink,
partitioned by ``log_id`` and ``date`` (UTC day of the record's timestamp). Exactly once comes
from Spark: the source's offsets (per-log next LSNs, never above the release pointer) are
written to the checkpoint before a batch runs and the sink lists a batch's files in
``PATH/_spark_metadata`` only when the batch commits, so after a crash the batch runs again
over the same LSNs and readers that go through ``_spark_metadata`` (every Spark reader of
PATH) see each record once. Files of a batch that never committed may stay in PATH: readers
that list files themselves must read only the ones ``_spark_metadata`` names.

While it runs it prints one line per committed batch and, every ``--progress-interval-ms``,
a table of records and lag per log. On exit (AvailableNow finished, SIGTERM or SIGINT) it
prints a JSON summary line. Exit codes: 0 done or stopped, 1 the query failed (for example
data loss with ``--fail-on-data-loss true``), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.streaming.query import StreamingQuery

from seqlog import Client
from shared.types import Lsn, format_lsn
from spark_ingest.options import parse_logs, parse_offsets, parse_options
from spark_ingest.planning import new_client, starts, tails
from spark_ingest.progress import METRICS_NAME, IngestReport, batch_report, progress_table
from spark_ingest.session import local_session

TRIGGERS = ("available-now", "continuous-interval")
REPORT_FILE = "seqlog-ingest-report.json"
"""Per-batch reports, kept in the checkpoint directory (only for a local checkpoint path)."""
START_FILE = "seqlog-ingest-start.json"
"""Where each log started, resolved once per checkpoint (see ``IngestJob.starting_offsets``)."""
PROGRESS_EVENTS_MAX = 10_000
"""Progress events waiting for the main thread; more means it is stuck, and extras drop."""
FINAL_EVENT_WAIT_MS = 5_000
"""How long to wait, after the query ends, for the progress event of its last batch."""
_MESSAGE_MARKERS = ("seqlog data loss:", "ValueError: ", "TimeoutError: ", "LogError: ")
"""Where our own message starts inside Spark's exception text (which embeds the Python
traceback of the worker that raised it), most specific first."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqlog ingest",
        description="Copy released records of Seqlog logs into Parquet with Spark, exactly once")
    add_arguments(parser)
    parser.add_argument("--url", action="append", required=True,
                        help="node URL (repeatable or comma-separated)")
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's options (``seqlog ingest`` declares the same ones, plus ``--dir``)."""
    parser.add_argument("--logs", required=True, help="log ids, e.g. 1,2,5-9")
    parser.add_argument("--to", required=True, help="output directory (Parquet)")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--trigger", choices=TRIGGERS, default="continuous-interval",
                        help="available-now: ingest what is released now, then stop; "
                             "continuous-interval: a micro-batch every --interval-ms, until "
                             "stopped (default)")
    parser.add_argument("--interval-ms", type=_positive, default=1_000)
    parser.add_argument("--master", default="local[*]",
                        help="Spark master (default local[*]; e.g. local[2], spark://host:7077)")
    parser.add_argument("--max-records-per-trigger", type=_positive)
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new checkpoint starts: earliest (default), latest, or "
                             "JSON per-log LSNs like '{\"7\": 1234}'")
    parser.add_argument("--starting-timestamp-ms", type=_positive,
                        help="start each log at its first record at or after this time")
    parser.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                        help="fail when records were trimmed or lost before they were read "
                             "(default), or skip and report them")
    parser.add_argument("--payload-format", choices=("binary", "json", "msgpack"),
                        default="binary")
    parser.add_argument("--payload-schema", help="DDL of payload fields to decode into columns")
    parser.add_argument("--records-per-partition", type=_positive)
    parser.add_argument("--records-per-read", type=_positive)
    parser.add_argument("--progress-interval-ms", type=int, default=5_000,
                        help="progress table every this often (0: only per-batch lines)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="Spark configuration (repeatable)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer: {text!r}")
    return int(text)


def source_options(args: argparse.Namespace) -> dict[str, str]:
    urls = [u.strip() for item in args.url for u in item.split(",") if u.strip()]
    options = {
        "urls": ",".join(urls),
        "logs": args.logs,
        "startingOffsets": args.starting_offsets,
        "failOnDataLoss": args.fail_on_data_loss,
        "includeGaps": "true",  # gap rows are counted, then filtered out before the sink
        "payloadFormat": args.payload_format,
    }
    optional = {
        "maxRecordsPerTrigger": args.max_records_per_trigger,
        "startingTimestamp": args.starting_timestamp_ms,
        "payloadSchema": args.payload_schema,
        "recordsPerPartition": args.records_per_partition,
        "recordsPerRead": args.records_per_read,
    }
    options.update({k: str(v) for k, v in optional.items() if v is not None})
    return options


def ingest_frame(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    """The records to write, with the metrics the progress report needs observed first."""
    frame = spark.readStream.format("seqlog").options(**options).load()
    record = F.col("gap_type").isNull()
    observed = frame.observe(
        METRICS_NAME,
        F.count(F.when(record, 1)).alias("records"),
        F.coalesce(F.sum(F.when(record, F.length("payload"))), F.lit(0)).alias("payload_bytes"),
        F.collect_list(F.when(~record, F.struct("log_id", "gap_type", "lsn", "gap_last_lsn")))
        .alias("gaps"),
    )
    return (observed.where(record).drop("gap_type", "gap_last_lsn")
            .withColumn("date", F.to_date("timestamp")))


class _Progress(StreamingQueryListener):
    """Hands progress events (as JSON) from Spark's callback thread to the main thread."""

    def __init__(self) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=PROGRESS_EVENTS_MAX)

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        # When the main thread is far behind, drop: a later event has newer offsets.
        with contextlib.suppress(queue.Full):
            self.events.put_nowait(json.loads(event.progress.json))

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass


class IngestJob:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.logs = parse_logs(args.logs)
        self.urls = source_options(args)["urls"].split(",")
        checkpoint = str(args.checkpoint)
        local = "://" not in checkpoint or checkpoint.startswith("file://")
        self.local_dir = Path(checkpoint.removeprefix("file://")) if local else None
        self.report_path = self.local_dir / REPORT_FILE if self.local_dir else None
        self.report = (IngestReport.load(self.report_path) if self.report_path
                       else IngestReport())
        self.start: dict[int, int] = {}
        self.last_table = ""
        self.summary: dict[str, Any] = {}
        self.stop_requested = threading.Event()
        self.started_s = time.monotonic()
        self.records_at_start = self.report.records

    def run(self, spark: SparkSession | None = None) -> int:
        """Runs the query to its end; with ``spark`` given, in that session (left running)."""
        own = spark is None
        if spark is None:
            conf = dict(item.split("=", 1) for item in self.args.conf)
            spark = local_session(self.args.master, conf=conf)
            spark.sparkContext.setLogLevel("ERROR")
        listener = _Progress()
        spark.streams.addListener(listener)
        try:
            return self._run(spark, listener)
        finally:
            spark.streams.removeListener(listener)
            if own:
                spark.stop()

    def _run(self, spark: SparkSession, listener: _Progress) -> int:
        try:
            query = self._start(spark)
        except Exception as exc:  # a bad option, an unreachable cluster, ...: say what
            print(f"seqlog ingest: cannot start: {_reason(str(exc))}", file=sys.stderr,
                  flush=True)
            return 1
        _print(f"seqlog ingest: logs {self.args.logs} -> {self.args.to} (checkpoint "
               f"{self.args.checkpoint}, {self.args.trigger}, master {self.args.master})")
        status = self._watch(query, listener)
        self._drain(listener, query, final=True)
        error = query.exception()
        if error is not None:
            status = "failed"
            print(f"seqlog ingest: the query failed: {_reason(str(error))}", file=sys.stderr,
                  flush=True)
        summary = {"event": "summary", "status": status,
                   "elapsed_s": round(time.monotonic() - self.started_s, 3),
                   "records_this_run": self.report.records - self.records_at_start,
                   **self.report.summary()}
        _print(json.dumps(summary))
        self.summary = summary
        return 1 if status == "failed" else 0

    def _start(self, spark: SparkSession) -> StreamingQuery:
        options = source_options(self.args)
        self.start = self.starting_offsets()
        options.pop("startingTimestamp", None)
        options["startingOffsets"] = json.dumps({str(log): self.start[log] for log in self.logs})
        writer = (ingest_frame(spark, options).writeStream
                  .format("parquet").option("path", self.args.to)
                  .option("checkpointLocation", self.args.checkpoint)
                  .partitionBy("log_id", "date").queryName("seqlog_ingest"))
        if self.args.trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.args.interval_ms} milliseconds")
        return writer.start()

    def starting_offsets(self) -> dict[int, int]:
        """Each log's first LSN, resolved (earliest, latest, timestamp) once per checkpoint
        and kept beside it: Spark asks the source for its initial offset again when the
        first batch is run again after a crash, and "latest" or "earliest" may have moved
        by then; the first batch's report also needs its start (progress events leave it
        out)."""
        path = self.local_dir / START_FILE if self.local_dir else None
        kept: dict[int, int] = {}
        if path is not None and path.exists():
            kept = {int(k): int(v) for k, v in json.loads(path.read_text()).items()}
        missing = [log for log in self.logs if log not in kept]
        if not missing:
            return kept
        options = parse_options(source_options(self.args), streaming=True)

        async def resolve() -> dict[int, int]:
            async with new_client(options) as client:
                return await starts(client, options, await tails(client, missing))

        resolved = {**kept, **asyncio.run(resolve())}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(k): v for k, v in resolved.items()}))
            tmp.replace(path)
        return resolved

    def _watch(self, query: StreamingQuery, listener: _Progress) -> str:
        interval_s = self.args.progress_interval_ms / 1000
        next_table_s = time.monotonic() + interval_s
        while query.isActive:
            if self.stop_requested.is_set():
                _print("seqlog ingest: stopping (the current batch is abandoned and runs "
                       "again on restart)")
                query.stop()
                return "stopped"
            self._drain(listener, query, final=False)
            if interval_s > 0 and time.monotonic() >= next_table_s:
                next_table_s = time.monotonic() + interval_s
                self._print_table()
            self.stop_requested.wait(0.2)
        return "finished"

    def _drain(self, listener: _Progress, query: StreamingQuery, *, final: bool) -> None:
        deadline_s = time.monotonic() + FINAL_EVENT_WAIT_MS / 1000
        while True:
            try:
                event = listener.events.get(timeout=0.1 if final else 0)
            except queue.Empty:
                if not final or self._caught_up(query) or time.monotonic() > deadline_s:
                    return
                continue
            if event.get("id") != str(query.id):
                continue  # another query of the same session
            report = batch_report(event, self.start)
            if report is None:
                continue
            self.report.add(report)
            if self.report_path is not None:
                self.report.save(self.report_path)
            rate = report.records / report.duration_ms * 1000 if report.duration_ms else 0.0
            _print(f"batch {report.batch_id}: {report.records} records, "
                   f"{report.payload_bytes / 2**20:.1f} MiB in {report.duration_ms} ms "
                   f"({rate:.0f} records/s); total {self.report.records} records")
            for gap in report.loss_gaps:
                _print(f"  skipped log {gap.log_id} {gap.type} LSNs {format_lsn(Lsn(gap.lo))}.."
                       f"{format_lsn(Lsn(gap.hi))} ({gap.lsns} LSNs)")

    def _caught_up(self, query: StreamingQuery) -> bool:
        """True when the last batch the query ran has a report (or it ran none)."""
        last = query.lastProgress
        if last is None:
            return True
        event = json.loads(last.json)
        return (batch_report(event, self.start) is None
                or int(event["batchId"]) in self.report.batches)

    def _print_table(self) -> None:
        async def releases() -> dict[int, int]:
            async with Client(self.urls, timeout_ms=5_000) as client:
                found = await tails(client, self.logs)
                return {log: t.release_lsn for log, t in found.items()}

        try:
            now = asyncio.run(releases())
        except Exception as exc:  # progress display must never stop the ingest
            _print(f"progress: cannot read release pointers: {exc}")
            return
        table = progress_table(self.report, now, self.logs)
        if table != self.last_table:
            _print(table)
            self.last_table = table


def _reason(error: str) -> str:
    """Our own message out of Spark's long exception text, if it is in there."""
    lines = error.splitlines()
    for marker in _MESSAGE_MARKERS:
        for line in lines:
            if marker in line:
                return line[line.index(marker):].removeprefix("ValueError: ").strip()
    return lines[0] if lines else "unknown error"


def _print(text: str) -> None:
    print(text, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_logs(args.logs)
        parse_offsets("--starting-offsets", args.starting_offsets, "earliest",
                      parse_logs(args.logs))
        if any("=" not in item for item in args.conf):
            raise ValueError("--conf takes KEY=VALUE")
    except ValueError as exc:
        parser.error(str(exc))
    job = IngestJob(args)

    def stop(signum: int, frame: FrameType | None) -> None:
        job.stop_requested.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
