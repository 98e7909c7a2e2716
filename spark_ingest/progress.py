"""What the ingest job counts per micro-batch and prints while it runs.

Each committed micro-batch reports (through Spark's observed metrics) its record count,
payload bytes and every gap row. Per log, the records of a batch are the LSNs between its
start and end offsets minus the LSNs its gaps cover (every LSN is a record or inside a gap),
so per-log counts need no per-log aggregation in Spark. Reports are kept by batch id: a
batch that Spark runs again after a crash replaces its earlier report instead of adding to it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seqlog.results import GAP_TYPES
from shared.types import Lsn, format_lsn, lsn_to_epoch, lsn_to_esn

METRICS_NAME = "seqlog"
"""Name of the observed metrics of the ingest query."""
LOSS_GAP_TYPES = ("TRIM", "DATALOSS")
ROWS_SHOWN_MAX = 20
"""Logs in the progress table; the ones furthest behind are shown."""
GAPS_LISTED_MAX = 1_000
"""Data-loss gaps kept in a report (totals stay exact beyond it)."""


@dataclass(frozen=True, slots=True)
class GapSpan:
    log_id: int
    type: str
    lo: int
    hi: int

    @property
    def lsns(self) -> int:
        return self.hi - self.lo + 1


@dataclass(slots=True)
class BatchReport:
    batch_id: int
    records: int
    payload_bytes: int
    duration_ms: int
    start: dict[int, int]
    end: dict[int, int]
    records_by_log: dict[int, int]
    gap_lsns_by_log: dict[int, dict[str, int]]
    loss_gaps: list[GapSpan] = field(default_factory=list)


def _offsets(raw: Any) -> dict[int, int]:
    """A source offset from a progress event (a JSON string, a dict, or null)."""
    if raw is None:
        return {}
    decoded = json.loads(raw) if isinstance(raw, str) else raw
    return {int(k): int(v) for k, v in decoded.items()}


def batch_report(progress: Mapping[str, Any], initial: Mapping[int, int]
                 ) -> BatchReport | None:
    """The report of one ``StreamingQueryProgress`` (as JSON), or None for a progress event
    that ran no batch (an idle trigger). ``initial`` is the first batch's start, which
    progress events leave out."""
    metrics = (progress.get("observedMetrics") or {}).get(METRICS_NAME)
    sources = progress.get("sources") or []
    if metrics is None or not sources:
        return None
    start = _offsets(sources[0].get("startOffset")) or dict(initial)
    end = _offsets(sources[0].get("endOffset"))
    gaps = [GapSpan(int(g["log_id"]), str(g["gap_type"]), int(g["lsn"]), int(g["gap_last_lsn"]))
            for g in metrics.get("gaps") or []]
    gap_lsns: dict[int, dict[str, int]] = {}
    for gap in gaps:
        per_type = gap_lsns.setdefault(gap.log_id, {})
        per_type[gap.type] = per_type.get(gap.type, 0) + gap.lsns
    records_by_log = {
        log: lsn - start.get(log, lsn) - sum(gap_lsns.get(log, {}).values())
        for log, lsn in end.items()
    }
    return BatchReport(
        batch_id=int(progress["batchId"]),
        records=int(metrics.get("records") or 0),
        payload_bytes=int(metrics.get("payload_bytes") or 0),
        duration_ms=int((progress.get("durationMs") or {}).get("triggerExecution") or 0),
        start=start,
        end=end,
        records_by_log=records_by_log,
        gap_lsns_by_log=gap_lsns,
        loss_gaps=[g for g in gaps if g.type in LOSS_GAP_TYPES][:GAPS_LISTED_MAX],
    )


@dataclass(slots=True)
class IngestReport:
    """All batch reports of one checkpoint, kept in a JSON file beside it."""

    batches: dict[int, BatchReport] = field(default_factory=dict)

    def add(self, report: BatchReport) -> None:
        self.batches[report.batch_id] = report

    @property
    def records(self) -> int:
        return sum(b.records for b in self.batches.values())

    @property
    def payload_bytes(self) -> int:
        return sum(b.payload_bytes for b in self.batches.values())

    def records_by_log(self) -> dict[int, int]:
        totals: dict[int, int] = {}
        for batch in self.batches.values():
            for log, count in batch.records_by_log.items():
                totals[log] = totals.get(log, 0) + count
        return totals

    def gap_lsns_by_log(self) -> dict[int, dict[str, int]]:
        totals: dict[int, dict[str, int]] = {}
        for batch in self.batches.values():
            for log, per_type in batch.gap_lsns_by_log.items():
                mine = totals.setdefault(log, dict.fromkeys(GAP_TYPES, 0))
                for kind, lsns in per_type.items():
                    mine[kind] = mine.get(kind, 0) + lsns
        return totals

    def next_lsns(self) -> dict[int, int]:
        """Each log's end offset in the newest batch."""
        if not self.batches:
            return {}
        return dict(self.batches[max(self.batches)].end)

    def loss_gaps(self) -> list[GapSpan]:
        return [g for b in sorted(self.batches) for g in self.batches[b].loss_gaps]

    def summary(self) -> dict[str, Any]:
        gaps = self.gap_lsns_by_log()
        return {
            "batches": len(self.batches),
            "records": self.records,
            "payload_bytes": self.payload_bytes,
            "records_by_log": {str(k): v for k, v in sorted(self.records_by_log().items())},
            "next_lsn_by_log": {str(k): v for k, v in sorted(self.next_lsns().items())},
            "data_loss_lsns_by_log": {
                str(log): {kind: per[kind] for kind in LOSS_GAP_TYPES if per.get(kind)}
                for log, per in sorted(gaps.items())
                if any(per.get(kind) for kind in LOSS_GAP_TYPES)
            },
            "data_loss_gaps": [asdict(g) for g in self.loss_gaps()],
        }

    def save(self, path: Path) -> None:
        """Atomically (write a temporary file, then rename), so a kill leaves the old one."""
        body = json.dumps({"batches": [asdict(b) for b in self.batches.values()]})
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(body)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> IngestReport:
        report = cls()
        if not path.exists():
            return report
        for raw in json.loads(path.read_text())["batches"]:
            report.add(BatchReport(
                batch_id=raw["batch_id"], records=raw["records"],
                payload_bytes=raw["payload_bytes"], duration_ms=raw["duration_ms"],
                start=_int_keys(raw["start"]), end=_int_keys(raw["end"]),
                records_by_log=_int_keys(raw["records_by_log"]),
                gap_lsns_by_log={int(k): dict(v) for k, v in raw["gap_lsns_by_log"].items()},
                loss_gaps=[GapSpan(**g) for g in raw["loss_gaps"]],
            ))
        return report


def _int_keys(raw: Mapping[str, int]) -> dict[int, int]:
    return {int(k): int(v) for k, v in raw.items()}


def lag_text(next_lsn: int, release_lsn: int) -> str:
    """Records behind, exact within an epoch; across epochs the count is unknown without
    reading, so it says how many of the newest epoch's records are at least behind."""
    if next_lsn > release_lsn:
        return "0"
    if lsn_to_epoch(Lsn(next_lsn)) == lsn_to_epoch(Lsn(release_lsn)):
        return str(release_lsn - next_lsn + 1)
    return f">={lsn_to_esn(Lsn(release_lsn))} (epoch {lsn_to_epoch(Lsn(next_lsn))}->" \
           f"{lsn_to_epoch(Lsn(release_lsn))})"


def progress_table(report: IngestReport, releases: Mapping[int, int],
                   logs: Iterable[int]) -> str:
    """One line per log (the ``ROWS_SHOWN_MAX`` furthest behind): records so far, next LSN
    to read, release pointer, lag, and data-loss LSNs skipped."""
    counts = report.records_by_log()
    nexts = report.next_lsns()
    gaps = report.gap_lsns_by_log()
    rows = []
    for log in logs:
        next_lsn = nexts.get(log, 0)
        release = releases.get(log, 0)
        behind = max(release + 1 - next_lsn, 0) if next_lsn else release
        loss = ", ".join(f"{kind} {gaps[log][kind]}" for kind in LOSS_GAP_TYPES
                         if gaps.get(log, {}).get(kind))
        rows.append((behind, log, (
            str(log), str(counts.get(log, 0)),
            format_lsn(Lsn(next_lsn)) if next_lsn else "-",
            format_lsn(Lsn(release)), lag_text(next_lsn or 1, release), loss or "-")))
    rows.sort(key=lambda r: (-r[0], r[1]))
    shown = [("LOG", "RECORDS", "NEXT_LSN", "RELEASE_LSN", "LAG", "SKIPPED_LSNS")]
    shown += [r[2] for r in rows[:ROWS_SHOWN_MAX]]
    widths = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in shown]
    if len(rows) > ROWS_SHOWN_MAX:
        lines.append(f"  ... and {len(rows) - ROWS_SHOWN_MAX} more logs")
    return "\n".join(lines)
