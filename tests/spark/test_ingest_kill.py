"""Exactly once through a crash: ``seqlog ingest`` (a real Spark driver process) is SIGKILLed
in the middle of a micro-batch while appends go on, then restarted on the same checkpoint;
in the end the Parquet output holds every released record exactly once and nothing above
the release pointer. Checked twice: through Spark's reader, and by reading only the files
that the sink's ``_spark_metadata`` log lists (the uncommitted files of the killed batch stay
on disk and must not count)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from seqlog import Client
from tests.spark.support import (
    SparkCluster,
    append_many,
    client_records,
    committed_files,
    data_files,
    fresh_log,
    wait_released,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
MID_BATCH_TIMEOUT_S = 240
JVM = "-XX:TieredStopAtLevel=1"
"""Quicker JVM start-up (no C2 compiler); the runs here are short."""
CATCH_UP_TIMEOUT_S = 240


class Appends:
    """Appends to the logs from a thread until stopped, a trickle of about 50 records/s per
    log (the machine also runs Spark and the cluster); keeps the last LSN per log."""

    def __init__(self, urls: list[str], logs: list[int]) -> None:
        self.urls, self.logs = urls, logs
        self.last = dict.fromkeys(logs, 0)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def go() -> None:
            seq = 10_000
            async with Client(self.urls) as client:
                while not self.stop.is_set():
                    for log in self.logs:
                        self.last[log] = await append_many(client, log, 10, first_seq=seq,
                                                           batch=10)
                    seq += 10
                    await asyncio.sleep(0.2)

        try:
            asyncio.run(go())
        except BaseException as exc:
            self.error = exc


def ingest(cluster: SparkCluster, logs: list[int], out: Path, checkpoint: Path,
           log_file: Path) -> subprocess.Popen[bytes]:
    """``seqlog ingest`` in its own process group (Python driver, JVM, Python workers)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable}
    with log_file.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli", "ingest", "--url", cluster.urls_option,
             "--logs", ",".join(map(str, logs)), "--to", str(out), "--checkpoint",
             str(checkpoint), "--master", "local[2]", "--interval-ms", "300",
             "--max-records-per-trigger", "1000", "--records-per-partition", "300",
             "--progress-interval-ms", "2000", "--conf", f"spark.driver.extraJavaOptions={JVM}"],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def batches(checkpoint: Path, kind: str) -> set[int]:
    folder = checkpoint / kind
    if not folder.is_dir():
        return set()
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()}


def in_flight(checkpoint: Path, out: Path, after_batch: int) -> int | None:
    """The batch after ``after_batch`` that is planned (its offsets are in the checkpoint),
    not committed, and has written files that the sink has not committed, if there is one
    (a batch's files are all in ``_spark_metadata`` before the next batch is planned)."""
    open_batches = {b for b in batches(checkpoint, "offsets") - batches(checkpoint, "commits")
                    if b > after_batch}
    # Listing the output costs more than listing the checkpoint: only while a batch runs.
    if open_batches and data_files(out) - committed_files(out):
        return max(open_batches)
    return None


def kill_mid_batch(proc: subprocess.Popen[bytes], checkpoint: Path, out: Path,
                   after_batch: int) -> int:
    """SIGKILLs the ingest's process group in the middle of a batch; returns that batch.

    Once a batch looks in flight the group is frozen (SIGSTOP) and checked again, so a
    batch that commits between the check and the kill cannot fool the test."""
    deadline = time.monotonic() + MID_BATCH_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the ingest exited before it could be killed"
        if in_flight(checkpoint, out, after_batch) is not None:
            os.killpg(proc.pid, signal.SIGSTOP)
            batch = in_flight(checkpoint, out, after_batch)
            if batch is not None:
                killpg(proc)
                return batch
            os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("never saw a batch in the middle of writing its files")


def killpg(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def committed_offsets(checkpoint: Path) -> dict[int, int]:
    """The end offsets of the newest committed batch."""
    done = batches(checkpoint, "commits")
    if not done:
        return {}
    lines = (checkpoint / "offsets" / str(max(done))).read_text().splitlines()
    return {int(k): int(v) for k, v in json.loads(lines[-1]).items()}


@pytest.mark.timeout(900)
def test_sigkill_mid_batch_then_restart_gives_every_record_exactly_once(
        spark: SparkSession, spark_cluster: SparkCluster, tmp_path: Path) -> None:
    logs = [fresh_log(), fresh_log()]

    async def prefill() -> None:
        async with Client(spark_cluster.urls) as client:
            for log in logs:
                await append_many(client, log, 1000)

    asyncio.run(prefill())
    out, checkpoint, log_file = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "ingest.log"
    appends = Appends(spark_cluster.urls, logs)
    appends.thread.start()
    try:
        first = ingest(spark_cluster, logs, out, checkpoint, log_file)
        try:
            killed_batch = kill_mid_batch(first, checkpoint, out, after_batch=0)
        finally:
            if first.poll() is None:
                killpg(first)
        assert killed_batch not in batches(checkpoint, "commits")
        orphans = data_files(out) - committed_files(out)
        assert orphans, "the killed batch left no files behind"

        second = ingest(spark_cluster, logs, out, checkpoint, log_file)
        try:
            # The killed batch runs again (and one more) while appends continue.
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while max(batches(checkpoint, "commits"), default=-1) < killed_batch + 1:
                assert second.poll() is None, log_file.read_text()[-5000:]
                assert time.monotonic() < deadline, "the restarted ingest made no progress"
                time.sleep(0.05)
            appends.stop.set()
            appends.thread.join(timeout=60)
            assert appends.error is None, appends.error

            async def final_releases() -> dict[int, int]:
                async with Client(spark_cluster.urls) as client:
                    return {log: await wait_released(client, log, appends.last[log])
                            for log in logs}

            release = asyncio.run(final_releases())
            while any(committed_offsets(checkpoint).get(log, 0) < release[log] + 1
                      for log in logs):
                assert second.poll() is None, log_file.read_text()[-5000:]
                assert time.monotonic() < deadline, "the ingest did not catch up"
                time.sleep(0.05)
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=120) == 0, log_file.read_text()[-5000:]
        finally:
            if second.poll() is None:
                killpg(second)
    finally:
        appends.stop.set()
        appends.thread.join(timeout=60)

    async def truth() -> dict[int, list[tuple[int, bytes]]]:
        async with Client(spark_cluster.urls) as client:
            return {log: [(r.lsn, r.payload)
                          for r in await client_records(client, log, 1, release[log] + 1)]
                    for log in logs}

    expected = asyncio.run(truth())
    assert all(len(v) > 1000 for v in expected.values())  # the appends did go on

    # Every offset the source ever handed out is at or below release + 1.
    for batch in batches(checkpoint, "offsets"):
        line = (checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1]
        for log, lsn in json.loads(line).items():
            assert lsn <= release[int(log)] + 1

    # Through Spark (which reads only what _spark_metadata lists).
    frame = spark.read.parquet(str(out))
    got = {log: sorted((r.lsn, bytes(r.payload)) for r in
                       frame.where(frame.log_id == log).select("lsn", "payload").collect())
           for log in logs}
    for log in logs:
        assert len(got[log]) == len(set(got[log])), "a record was written twice"
        assert got[log] == expected[log]

    # Directly: only committed files, each row once; the killed batch's files are left over.
    rows: Counter[tuple[int, int]] = Counter()
    for path in committed_files(out):
        log = int(next(p for p in path.parts if p.startswith("log_id=")).split("=")[1])
        for lsn in pq.read_table(path, columns=["lsn"]).column("lsn").to_pylist():
            rows[(log, lsn)] += 1
    assert max(rows.values()) == 1
    assert sorted(rows) == sorted((log, lsn) for log in logs for lsn, _ in expected[log])
    assert orphans <= data_files(out) - committed_files(out)

    summaries = [json.loads(line) for line in log_file.read_text().splitlines()
                  if line.startswith('{"event": "summary"')]
    assert len(summaries) == 1  # the killed run printed none
    summary = summaries[0]
    assert summary["status"] == "stopped"
    assert summary["records"] <= sum(len(v) for v in expected.values())
