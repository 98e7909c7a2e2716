"""What ``GET /v1/logs`` answers (served by ``services.http_api``): the logs this node
sequences, one row each, for operators' tools (``seqlog top``) rather than for clients.

A row is read off the node's in-memory sequencer of the log at request time: its state and
epoch, the next LSN it will hand out (so a tool that asks twice gets the append rate from the
difference), the release point, appends in flight and how long ago the last append arrived.
Nothing is counted per append for it. Rows are in log id order and paged (``after``, ``limit``)
so that a node with many thousands of active logs answers in bounded pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sequencer.core.sequencer import Sequencer
from sequencer.runtime import SequencerRuntime
from shared.clock import Clock
from shared.types import compose_lsn

LOGS_PAGE_DEFAULT = 1000
LOGS_PAGE_MAX = 10_000
"""Rows per answer at most (``limit`` is clamped to it)."""


def log_row(log_id: int, sequencer: Sequencer, now_ms: int) -> dict[str, Any]:
    window = sequencer.window
    next_lsn = (compose_lsn(sequencer.epoch, window.next_esn) if window is not None
                else sequencer.release_lsn + 1)
    return {
        "log_id": log_id,
        "state": sequencer.state.value,
        "epoch": int(sequencer.epoch),
        "next_lsn": int(next_lsn),
        "release_lsn": int(sequencer.release_lsn),
        "appends_in_flight": len(sequencer.appenders),
        "recovering": sequencer.recovery is not None,
        "idle_ms": max(0, now_ms - sequencer.last_append_ms) if sequencer.last_append_ms
        else None,
    }


def logs_page(runtime: SequencerRuntime | None, clock: Clock, node_id: str, *, after: int,
              limit: int) -> dict[str, Any]:
    """The answer of ``GET /v1/logs?after=&limit=``."""
    sequencers = runtime.sequencers if runtime is not None else {}
    log_ids = sorted(log_id for log_id in sequencers if log_id > after)
    page = log_ids[:limit]
    now_ms = clock.now_ms()
    return {
        "node_id": node_id,
        "logs": [log_row(log_id, sequencers[log_id], now_ms) for log_id in page],
        "total": len(sequencers),
        "next_after": page[-1] if len(log_ids) > limit else None,
    }


LogsSource = Callable[[int, int], dict[str, Any]]
"""``(after, limit) -> page``: what ``GET /v1/logs`` answers (``services.http_api``)."""


def logs_source(runtime: SequencerRuntime | None, clock: Clock, node_id: str) -> LogsSource:
    """The pages of ``runtime``'s logs (None: a node without the sequencer role, no logs)."""

    def page(after: int, limit: int) -> dict[str, Any]:
        return logs_page(runtime, clock, node_id, after=after, limit=limit)

    return page
