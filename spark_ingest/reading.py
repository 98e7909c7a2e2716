"""Executor-side reading of one planned LSN range into Arrow record batches.

A task reads ``start .. end - 1`` of one log through the public client, page by page, and
turns each page into one ``pyarrow.RecordBatch`` in the Spark schema's column order. Pages
never reach past ``end`` (records beyond it are dropped, gaps are clipped), so two tasks of
adjacent ranges never both emit an LSN and a replayed task emits exactly the same records.

Gaps: HOLE and BRIDGE are part of a healthy log and are skipped. TRIM and DATALOSS mean
records that were (or may have been) released are gone; with ``failOnDataLoss`` (the default)
the task fails with a message naming the log and LSNs, otherwise they are skipped with a
warning. With ``includeGaps`` every gap is also a row, so a query can count them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type

from seqlog import Gap, Record
from shared.types import Lsn, format_lsn
from spark_ingest.options import SourceOptions
from spark_ingest.planning import LogRange, new_client
from spark_ingest.schema import Layout

LOSS_GAPS = frozenset({"TRIM", "DATALOSS"})
"""Gap types that mean released records are gone (the Kafka source's "data loss")."""
STALL_WAIT_MS = 1_000
"""Long poll used when a node answers without progress below the planned end."""
LONG_MAX = 2**63 - 1
PREFETCH_PAGES_MAX = 4
"""Read answers a task fetches ahead of the batch Spark is taking."""

_log = logging.getLogger("spark_ingest")


class DataLossError(RuntimeError):
    """TRIM or DATALOSS inside a range while ``failOnDataLoss`` is true."""


@dataclass(frozen=True, slots=True)
class Page:
    records: list[Record]
    gaps: list[Gap]


async def pages(piece: LogRange, options: SourceOptions) -> AsyncGenerator[Page, None]:
    """Records and gaps covering exactly ``piece``, one read answer at a time."""
    log, end = piece.log_id, piece.end_lsn
    cursor = piece.start_lsn
    stalled_since: float | None = None
    async with new_client(options) as client:
        while cursor < end:
            wait_ms = STALL_WAIT_MS if stalled_since is not None else 0
            limit = max(1, min(options.records_per_read, end - cursor))
            result = await client.read(log, cursor, limit=limit, wait_ms=wait_ms)
            if result.next_lsn <= cursor:
                # The range was released when it was planned, so a node that answers with
                # nothing is behind (e.g. a sequencer still recovering): wait, boundedly.
                now = time.monotonic()
                stalled_since = stalled_since if stalled_since is not None else now
                if (now - stalled_since) * 1000 > options.stall_timeout_ms:
                    raise TimeoutError(
                        f"log {log}: no progress at LSN {format_lsn(Lsn(cursor))} ({cursor}) "
                        f"for {options.stall_timeout_ms} ms although it was released "
                        f"(release pointer now {result.release_lsn})")
                continue
            stalled_since = None
            records = [r for r in result.records if r.lsn < end]
            gaps = [Gap(type=g.type, lo=Lsn(max(g.lo, cursor)), hi=Lsn(min(g.hi, end - 1)))
                    for g in result.gaps if g.lo < end and g.hi >= cursor]
            cursor = min(result.next_lsn, end)
            yield Page(records, gaps)


def check_gaps(log: int, gaps: list[Gap], fail_on_data_loss: bool) -> None:
    for gap in gaps:
        if gap.type not in LOSS_GAPS:
            continue
        span = (f"LSNs {format_lsn(gap.lo)}..{format_lsn(gap.hi)} ({gap.lo}..{gap.hi}, "
                f"{gap.hi - gap.lo + 1} LSNs)")
        what = ("were trimmed" if gap.type == "TRIM"
                else "are lost (records that may have been acknowledged cannot be found)")
        if fail_on_data_loss:
            raise DataLossError(
                f"seqlog data loss: log {log}: {span} {what} before this query read them "
                f"({gap.type} gap). Set the option failOnDataLoss to false to skip such gaps "
                "and go on.")
        _log.warning("seqlog: log %d: skipping %s gap, %s", log, gap.type, span)


class BatchBuilder:
    """Turns pages into Arrow record batches of one fixed schema."""

    def __init__(self, layout: Layout, options: SourceOptions) -> None:
        self._layout = layout
        self._options = options
        self._arrow_schema = to_arrow_schema(layout.schema, timezone="UTC")
        self._decoded_types = {f.name: to_arrow_type(f.dataType, timezone="UTC")
                               for f in layout.schema.fields if f.name in layout.decoded}

    def build(self, log: int, page: Page) -> pa.RecordBatch:
        records = page.records
        gaps = page.gaps if self._layout.gaps else []
        filler: list[None] = [None] * len(gaps)
        lsns = [r.lsn for r in records] + [g.lo for g in gaps]
        columns: dict[str, Any] = {
            "log_id": [log] * len(lsns),
            "lsn": lsns,
            "epoch": [lsn >> 32 for lsn in lsns],
            "esn": [lsn & 0xFFFFFFFF for lsn in lsns],
            "timestamp": [r.timestamp_ms * 1000 for r in records] + filler,
            "key": [r.key for r in records] + filler,
            "payload": [r.payload for r in records] + filler,
            "gap_type": [None] * len(records) + [g.type for g in gaps],
            "gap_last_lsn": [None] * len(records) + [g.hi for g in gaps],
        }
        if self._decoded_types:
            decoded = [self._decode(r.payload) for r in records]
            for name, kind in self._decoded_types.items():
                values = [d.get(name) if d is not None else None for d in decoded]
                columns[name] = _arrow_array(values + filler, kind)
        arrays = [columns[f.name] if isinstance(columns[f.name], pa.Array)
                  else pa.array(columns[f.name], type=f.type) for f in self._arrow_schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self._arrow_schema)

    def _decode(self, payload: bytes) -> dict[str, Any] | None:
        """The payload's top-level fields, or None when it is not an object/map of the format
        (its decoded columns are then null; ``payload`` still holds the bytes)."""
        try:
            if self._options.payload_format == "json":
                value = json.loads(payload)
            else:
                value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException):
            return None
        return value if isinstance(value, dict) else None


def _arrow_array(values: list[Any], kind: pa.DataType) -> pa.Array:
    """Values of one decoded field; one that does not fit the column's type becomes null."""
    try:
        return pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.array([_fits(v, kind) for v in values], type=kind)


def _fits(value: Any, kind: pa.DataType) -> Any:
    try:
        pa.array([value], type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None
    return value


def read_range(piece: LogRange, layout: Layout, options: SourceOptions
               ) -> Iterator[pa.RecordBatch]:
    """The blocking iterator a Spark task consumes: one Arrow batch per read answer.

    A thread runs the reads (its own event loop) up to ``PREFETCH_PAGES_MAX`` pages ahead,
    so the next answer is on its way while Spark takes the current batch."""
    if piece.end_lsn - 1 > LONG_MAX:
        raise ValueError(f"log {piece.log_id}: LSN {piece.end_lsn - 1} is above 2**63-1 "
                         "(epoch >= 2**31) and does not fit Spark's bigint")
    builder = BatchBuilder(layout, options)
    fetched: queue.Queue[Page | _End] = queue.Queue(maxsize=PREFETCH_PAGES_MAX)
    stop = threading.Event()

    def put(item: Page | _End) -> bool:
        while not stop.is_set():
            try:
                fetched.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fetch() -> None:
        async def run() -> None:
            async for page in pages(piece, options):
                if not put(page):
                    return

        try:
            asyncio.run(run())
        except BaseException as exc:  # handed to the task's thread, which raises it
            put(_End(exc))
        else:
            put(_End(None))

    fetcher = threading.Thread(target=fetch, name=f"seqlog-read-{piece.log_id}", daemon=True)
    fetcher.start()
    try:
        while True:
            item = fetched.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            check_gaps(piece.log_id, item.gaps, options.fail_on_data_loss)
            batch = builder.build(piece.log_id, item)
            if batch.num_rows:
                yield batch
    finally:
        stop.set()
        fetcher.join(timeout=options.timeout_ms / 1000)


@dataclass(frozen=True, slots=True)
class _End:
    """The fetcher is done: ``error`` is why it stopped early, None at the range's end."""

    error: BaseException | None
