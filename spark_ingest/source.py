"""The ``seqlog`` PySpark data source: ``spark.read.format("seqlog")`` and
``spark.readStream.format("seqlog")``.

Planning (``partitions``, ``initialOffset``, ``latestOffset``) runs in a Python process on the
driver and talks to the cluster with the public client; ``read`` runs in executor Python
workers, one task per planned LSN range. Readers and partitions hold only plain values, so
they pickle; each call opens its own client (an event loop per call) because Spark may call
them from different processes.

Streaming offsets are ``{"<log id>": next_lsn}`` (JSON, logs in increasing order). An end
offset is never above the log's ``release_lsn + 1``. A micro-batch reads exactly the LSNs
between its start and end offsets, and released records do not change, so replaying a batch
after a crash yields the same records; with Spark's file sink and checkpoint the output gets
each released record exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_ingest import planning
from spark_ingest.options import SourceOptions, parse_options
from spark_ingest.planning import LogRange, LogTail
from spark_ingest.reading import read_range
from spark_ingest.schema import Layout, layout, schema_ddl

SOURCE_NAME = "seqlog"


class RangePartition(InputPartition):
    """One task: LSNs ``start_lsn .. end_lsn - 1`` of ``log_id``."""

    def __init__(self, log_id: int, start_lsn: int, end_lsn: int) -> None:
        super().__init__((log_id, start_lsn, end_lsn))
        self.log_id = log_id
        self.start_lsn = start_lsn
        self.end_lsn = end_lsn


def _partitions(pieces: Sequence[LogRange]) -> list[RangePartition]:
    return [RangePartition(p.log_id, p.start_lsn, p.end_lsn) for p in pieces]


def _read(partition: InputPartition, shape: Layout, options: SourceOptions
          ) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition):
        return iter(())  # Spark's stand-in partition for a plan with nothing to read
    piece = LogRange(partition.log_id, partition.start_lsn, partition.end_lsn)
    return read_range(piece, shape, options)


class SeqlogDataSource(DataSource):
    """Released records of Seqlog logs; options are described in spark_ingest/README.md."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        # Streaming-only options make no difference to the columns.
        return schema_ddl(_parse(self.options, streaming=False, lenient=True))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = _parse(self.options, streaming=False)
        return SeqlogBatchReader(options, layout(schema, options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = _parse(self.options, streaming=True)
        return SeqlogStreamReader(options, layout(schema, options))


def _parse(options: Mapping[str, str], *, streaming: bool, lenient: bool = False
           ) -> SourceOptions:
    if lenient:
        # schema() is called for batch and stream alike: check only what shapes the columns.
        options = {k: v for k, v in options.items()
                   if k.lower() not in ("maxrecordspertrigger", "endingoffsets")}
    return parse_options(options, streaming=streaming)


class SeqlogBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, shape: Layout) -> None:
        self.options = options
        self.shape = shape

    def partitions(self) -> list[InputPartition]:
        return list(_partitions(asyncio.run(self._plan())))

    async def _plan(self) -> list[LogRange]:
        async with planning.new_client(self.options) as client:
            log_tails = await planning.tails(client, self.options.logs)
            first = await planning.starts(client, self.options, log_tails)
            last = planning.ends(self.options.ending, log_tails)
            spans = [LogRange(log, first[log], last[log]) for log in self.options.logs]
            return await planning.cut_all(client, spans, self.options.records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.shape, self.options)


class SeqlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, shape: Layout) -> None:
        self.options = options
        self.shape = shape
        self.target: dict[int, int] | None = None
        """Trigger.AvailableNow: the release pointers (+1) when the query started."""
        self.latest: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        async def plan() -> dict[int, int]:
            async with planning.new_client(self.options) as client:
                log_tails = await planning.tails(client, self.options.logs)
                return await planning.starts(client, self.options, log_tails)

        return _offset(asyncio.run(plan()))

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {log: tail.end for log, tail in asyncio.run(self._tails()).items()}

    async def _tails(self) -> dict[int, LogTail]:
        async with planning.new_client(self.options) as client:
            return await planning.tails(client, self.options.logs)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        return _offset(asyncio.run(self._latest(_lsns(start), limit)))

    async def _latest(self, begin: dict[int, int], limit: ReadLimit) -> dict[int, int]:
        async with planning.new_client(self.options) as client:
            log_tails = await planning.tails(client, self.options.logs)
            self.latest = _offset({log: tail.end for log, tail in log_tails.items()})
            new = [log for log in self.options.logs if log not in begin]
            # A log added to the logs option since the checkpoint: its first batch only pins
            # where it starts (earliest), so that a replay of that batch cannot differ.
            pinned = {log: log_tails[log].earliest for log in new}
            ends: dict[int, int] = {}
            for log in self.options.logs:
                if log in pinned:
                    ends[log] = pinned[log]
                    continue
                end = log_tails[log].end
                if self.target is not None:
                    end = min(end, self.target.get(log, end))
                # Never go back: a node may briefly report an older release pointer.
                ends[log] = max(begin[log], end)
            if isinstance(limit, ReadMaxRows):
                known = {log: begin[log] for log in ends if log in begin}
                ends = await planning.budget_ends(client, known, ends, limit.max_rows)
            return ends

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self.latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = _lsns(start), _lsns(end)
        spans = [LogRange(log, begin.get(log, lsn), lsn) for log, lsn in finish.items()]

        async def plan() -> list[LogRange]:
            async with planning.new_client(self.options) as client:
                return await planning.cut_all(client, spans, self.options.records_per_partition)

        return list(_partitions(asyncio.run(plan())))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.shape, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Seqlog keeps no consumer positions; the checkpoint is the truth."""


def _offset(lsns: Mapping[int, int]) -> dict[str, int]:
    return {str(log): int(lsns[log]) for log in sorted(lsns)}


def _lsns(offset: Mapping[str, Any]) -> dict[int, int]:
    try:
        return {int(log): int(lsn) for log, lsn in offset.items()}
    except (TypeError, ValueError):
        raise ValueError(f"not a seqlog offset (log id -> next LSN): {offset!r}") from None
