"""Cross-log STORE batching (pure): the STOREs that the sequencers of many logs send in one
event-loop iteration go to each storage node in one STORE_BATCH (``shared.wire.store_batch``).

The per-log cores do not change: each still emits ``Send(node, Store)`` and gets one
``on_stored`` per node and STORE. The driver stages those sends here (``add``) instead of
sending each, and when the iteration's work is done ``take``s them: per storage node, in the
order they were staged, cut into chunks of at most ``stores_max`` STOREs and ``bytes_max``
payload bytes. A chunk of one goes as a plain STORE, as before. The answer to a chunk (a
STORED_BATCH, or the ``Status`` that ended the request, e.g. CONNFAILED) is turned back into
one answer per STORE by ``chunk_answers``, for the driver to hand to each STORE's core.

With 1,000 busy logs each log's appender carries about one record, so without this every
record cost R frames each way and R reply callbacks; with it, a loop iteration costs R frames
each way whatever the number of logs.

RELEASEs are staged the same way (``add_release``) and leave per node as one RELEASE_BATCH
(one-way), a log's highest pointer only: with many logs, a release pointer rarely finds a
STORE of its own log to ride on, and the periodic broadcast sends one per log and node.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.release import Release
from shared.wire.store import Store
from shared.wire.store_batch import (
    RELEASE_BATCH_LOGS_MAX,
    STORE_BATCH_STORES_MAX,
    ReleaseBatch,
    StoredBatch,
    StoredResult,
    stored_batch_results,
)

Owner = TypeVar("Owner")
"""Whatever the driver needs to route an answer back (the runtime: the log's ``Sequencer``)."""

STORE_BATCH_BYTES_MAX = 1024 * 1024
"""Payload bytes one STORE_BATCH carries at most: a STORE this big or bigger goes alone (one
frame per STORE is no cost worth saving then), and a chunk never waits long on the wire."""
_STORE_OVERHEAD_BYTES = 64
"""Roughly what a STORE's fields other than its payloads take on the wire."""

Chunk = list[tuple[Owner, Store]]


class StoreBatcher(Generic[Owner]):
    """The STOREs staged for each storage node since the last ``take``."""

    __slots__ = ("_bytes_max", "_releases", "_staged", "_stores_max")

    def __init__(self, *, stores_max: int = STORE_BATCH_STORES_MAX,
                 bytes_max: int = STORE_BATCH_BYTES_MAX) -> None:
        assert 1 <= stores_max <= STORE_BATCH_STORES_MAX and bytes_max >= 1
        self._stores_max = stores_max
        self._bytes_max = bytes_max
        self._staged: dict[NodeId, list[tuple[Owner, Store]]] = {}
        self._releases: dict[NodeId, dict[LogId, Lsn]] = {}

    def __bool__(self) -> bool:
        return bool(self._staged or self._releases)

    def add_release(self, node: NodeId, release: Release) -> bool:
        """Stage a RELEASE for ``node`` (a log's highest pointer wins); True as for ``add``."""
        first = not self._staged and not self._releases
        logs = self._releases.get(node)
        if logs is None:
            self._releases[node] = {release.log_id: release.release_lsn}
        elif logs.get(release.log_id, -1) < release.release_lsn:
            logs[release.log_id] = release.release_lsn
        return first

    def take_releases(self) -> list[tuple[NodeId, Release | ReleaseBatch]]:
        """The staged release pointers, per node: a RELEASE when one (or when
        ``stores_max`` is 1: batching is off), else RELEASE_BATCHes of at most
        ``RELEASE_BATCH_LOGS_MAX``."""
        staged, self._releases = self._releases, {}
        messages: list[tuple[NodeId, Release | ReleaseBatch]] = []
        for node, logs in staged.items():
            if len(logs) == 1 or self._stores_max == 1:
                messages.extend((node, Release(log_id=log_id, release_lsn=release_lsn))
                                for log_id, release_lsn in logs.items())
                continue
            pairs = tuple(logs.items())
            for start in range(0, len(pairs), RELEASE_BATCH_LOGS_MAX):
                messages.append((node, ReleaseBatch(
                    releases=pairs[start:start + RELEASE_BATCH_LOGS_MAX])))
        return messages

    def add(self, node: NodeId, store: Store, owner: Owner) -> bool:
        """Stage ``store`` for ``node``. True when it is the first thing staged since the
        last ``take`` (the driver then arranges a ``take`` before the loop waits again)."""
        staged = self._staged
        first = not staged and not self._releases
        entries = staged.get(node)
        if entries is None:
            staged[node] = [(owner, store)]
        else:
            entries.append((owner, store))
        return first

    def take(self) -> list[tuple[NodeId, Chunk[Owner]]]:
        """Everything staged, per node in staging order, cut into chunks (see the module
        docstring); nothing stays staged."""
        staged, self._staged = self._staged, {}
        stores_max, bytes_max = self._stores_max, self._bytes_max
        chunks: list[tuple[NodeId, Chunk[Owner]]] = []
        for node, entries in staged.items():
            if len(entries) == 1:
                chunks.append((node, entries))
                continue
            chunk: Chunk[Owner] = []
            chunk_bytes = 0
            for entry in entries:
                payloads = entry[1].payloads
                size = (len(payloads[0]) if len(payloads) == 1 else sum(map(len, payloads))) + (
                    _STORE_OVERHEAD_BYTES)
                if size >= bytes_max:
                    chunks.append((node, [entry]))  # alone, as a plain STORE
                    continue
                if chunk and (len(chunk) >= stores_max or chunk_bytes + size > bytes_max):
                    chunks.append((node, chunk))
                    chunk, chunk_bytes = [], 0
                chunk.append(entry)
                chunk_bytes += size
            if chunk:
                chunks.append((node, chunk))
        return chunks


_OK = int(Status.OK)


def all_ok(reply: StoredBatch, count: int) -> bool:
    """Whether a STORED_BATCH answers each of ``count`` STOREs OK, with no seal."""
    statuses = reply.statuses
    return (not reply.seals and len(statuses) == count
            and statuses.count(_OK) == count)


_BADMSG: StoredResult = (Status.BADMSG, Epoch(0), None)


def chunk_answers(reply: Any, count: int) -> list[StoredResult]:
    """One ``(status, sealed_epoch, sealed_by)`` per STORE of a chunk of ``count`` sent as a
    STORE_BATCH, from its ``reply``: the STORED_BATCH's answers; a ``Status`` that ended the
    request (CONNFAILED, OVERLOADED, ...) for every STORE; BADMSG for every STORE when the
    reply is anything else or does not fit the batch."""
    if type(reply) is StoredBatch:
        results = stored_batch_results(reply, count)
        if not isinstance(results, Status):
            return results
        return [_BADMSG] * count
    if isinstance(reply, Status):
        return [(reply, Epoch(0), None)] * count
    return [_BADMSG] * count
