"""The history of a chaos run: one JSON object per line (JSONL), written as things happen and
read back by the offline checkers (``tests/chaos/checkers.py``).

Every event has ``ev`` (its kind) and ``t`` (seconds since the run started, monotonic clock).
The kinds and their fields:

- ``meta``: ``seed``, ``replication``, ``logs``, ``nodes``, ``storage_nodes``, settings.
- ``invoke``: ``op``, ``log``, ``node`` (the HTTP node it was sent to), ``writer``,
  ``payloads`` (one for an append, several for an append-batch; unique in the run).
- ``ok``: ``op``, ``lsns`` (one per payload, in order).
- ``fail``: ``op``, ``status``, ``http``: definitely not written (429, 503, 4xx, or the
  connection could not even be opened).
- ``unknown``: ``op``, ``status``, ``http``: the outcome is unknown (504, 500, a client
  timeout, a connection lost after sending, or the run ended first).
- ``read``: ``reader``, ``node``, ``inc`` (the node's incarnation), ``log``, ``from``,
  ``next``, ``release``, ``records`` ([lsn, payload]), ``gaps`` ([type, lo, hi]).
- ``tail``: ``node``, ``inc``, ``log``, ``release``, ``asked_t`` (when the request was
  sent): one GET /v1/logs/{id}/tail answer.
- ``copies``: ``node``, ``log``, ``records`` ([lsn, payload]), ``markers``
  ([first_lsn, last_lsn, flags, wave]; older histories lack the wave): everything a storage
  node holds, released or not, read over the node-to-node protocol after the run.
- ``fault``: ``action`` and its parameters, when the fault scheduler acts.
- ``end``: the workload stopped.

Payloads are ASCII ids made by the workload; a payload that is not is kept as latin-1 text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

Event = dict[str, Any]


def payload_text(payload: bytes) -> str:
    return payload.decode("latin-1")


class History:
    """Appends events to a JSONL file (line-buffered, so a crashed run leaves a readable
    prefix) and keeps them in memory for the checkers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[Event] = []
        self._start_s = time.monotonic()
        self._file: IO[str] = path.open("w", encoding="utf-8", buffering=1)

    def now(self) -> float:
        return round(time.monotonic() - self._start_s, 4)

    def add(self, ev: str, **fields: Any) -> Event:
        event: Event = {"ev": ev, "t": self.now(), **fields}
        self.events.append(event)
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        return event

    def close(self) -> None:
        self._file.close()


def load(path: Path) -> list[Event]:
    return list(iter_events(path))


def iter_events(path: Path) -> Iterator[Event]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError:
                # A run killed mid-write leaves a torn last line; anything else is corrupt.
                if f.readline():
                    raise ValueError(f"{path}:{number}: not JSON") from None
                return
