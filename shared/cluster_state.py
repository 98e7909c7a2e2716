"""The cluster-wide state of storage shards (LogDevice's event log, kept in the epoch store).

One small document for the whole cluster, changed only by compare-and-swap on its version
(``ClusterStateStore``: the file store keeps it beside the epoch journal, ZooKeeper in one
znode), so every node and tool agrees on it and it survives restarts of any node:

- per storage node (a shard), the **generation** of the disk it holds (``disk_identity``
  writes the same number into a marker on the disk) and whether that disk is known to have
  held data: a node that comes back with a fresh disk while the cluster knows its shard held
  data has lost it;
- the shard's **status**: ``AUTHORITATIVE`` (complete), ``REBUILDING`` (since when, who asked,
  for which generation, and every donor's progress: its checkpoint, records and bytes sent,
  done or not; and its scope: the whole shard, or for a **mini-rebuild** of damaged copies
  only the LSN ranges of the logs they were in, ``dirty``), ``DRAINING``/``DRAINED`` (an
  operator moves its copies elsewhere while it still serves reads), ``REMOVED``.

Everything here is pure: the document model, its JSON form (validated once, hostile input
answers None), and the transitions, each a function ``state -> state | None`` (None: nothing
to change) that ``change`` applies by read, plan, compare-and-swap, retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from shared.status import Status
from shared.types import LSN_MAX, node_id_valid

FORMAT_VERSION = 1
SHARDS_MAX = 4096
DOCUMENT_BYTES_MAX = 4 * 1024 * 1024
"""A document bigger than this is refused (ZooKeeper's znode limit is 1 MiB by default; the
file store has no limit of its own)."""
CHANGE_ATTEMPTS_MAX = 64
DIRTY_RANGES_MAX = 512
"""LSN ranges a mini-rebuild's scope may hold (all its logs together): a damage that needs
more is rebuilt as the whole shard (``storage_node.core.rebuild_scope``, and
``rebuild_started`` past it). A range is at most about 45 bytes of JSON, so a shard's scope
is at most about 23 KB of the document."""
DOCUMENT_DIRTY_RANGES_MAX = 4096
"""Ranges of all the shards' scopes in the document together (about 190 KB at most): a
mini-rebuild that would take it past this is recorded as a whole-shard rebuild, so the
document stays well under ZooKeeper's 1 MiB znode limit (past it, every write of the
cluster state fails) however many shards are being mini-rebuilt at once. Scopes are kept
only while their rebuild runs (``rebuild_finished`` drops them, keeping their size)."""
DIRTY_RANGES_DECODE_MAX = 4096
"""A stored scope may hold this many (documents written when that was the bound)."""

LsnRange = tuple[int, int]
DirtyRanges = tuple[tuple[int, tuple[LsnRange, ...]], ...]
"""A mini-rebuild's scope: per log (ascending ids, each once), its LSN ranges (inclusive,
ascending, disjoint). ``()`` is not "nothing": a rebuild with no ranges is of the whole
shard (every log, every LSN)."""


class ShardStatus(StrEnum):
    AUTHORITATIVE = "AUTHORITATIVE"
    REBUILDING = "REBUILDING"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    REMOVED = "REMOVED"


@dataclass(frozen=True, slots=True)
class DonorProgress:
    """One donor's part of a rebuild: resumes from (``log_id``, ``next_lsn``) after a
    restart; everything of logs below ``log_id`` and of ``log_id`` below ``next_lsn`` was
    sent and is durable on the target."""

    log_id: int = 0
    next_lsn: int = 0
    records: int = 0
    bytes: int = 0
    bytes_total: int = 0
    """The donor's estimate of what it has to scan (its live record bytes when it began)."""
    done: bool = False
    updated_ms: int = 0


@dataclass(frozen=True, slots=True)
class ShardState:
    node_id: str
    generation: int
    """The generation of the disk the cluster last knew this shard by."""
    status: ShardStatus = ShardStatus.AUTHORITATIVE
    since_ms: int = 0
    """When the status was entered."""
    reason: str = ""
    requested_by: str = ""
    rebuild_generation: int = 0
    """REBUILDING/DRAINING: the generation being rebuilt (donors check that the target still
    has it)."""
    donors: tuple[tuple[str, DonorProgress], ...] = ()
    finished_ms: int = 0
    """When the last rebuild or drain finished (0: never)."""
    rebuilds_count: int = 0
    dirty: DirtyRanges = ()
    """The scope of the rebuild under way: ``()`` the whole shard, else a mini-rebuild of
    only these logs' LSN ranges (damaged copies; see ``DirtyRanges``). Dropped when it
    finishes (``scope_logs``/``scope_ranges`` keep its size)."""
    mini_rebuilds_count: int = 0
    """How many of ``rebuilds_count`` were mini-rebuilds."""
    scope_logs: int = 0
    """The size of the last rebuild's scope (under way or finished): logs and ranges; 0 the
    whole shard. ``dirty`` itself is dropped when the rebuild finishes (document size)."""
    scope_ranges: int = 0
    rebuild_id: int = 0
    """Which rebuild or drain this is (each one started adds 1): mini-rebuilds keep the
    disk's generation, so a donor's checkpoint or ``done`` names the rebuild it walked for
    (``donor_progressed``), and one for an earlier rebuild of the same generation (another
    scope) is not taken for the one under way. 0 in documents written before it."""

    @property
    def mini(self) -> bool:
        """A mini-rebuild (under way: only ``dirty``'s ranges are walked; or the last one)."""
        return bool(self.dirty) or self.scope_ranges > 0

    def donor(self, node_id: str) -> DonorProgress | None:
        for name, progress in self.donors:
            if name == node_id:
                return progress
        return None

    @property
    def donors_done(self) -> bool:
        return all(progress.done for _, progress in self.donors)


@dataclass(frozen=True, slots=True)
class ClusterState:
    shards: tuple[ShardState, ...] = ()

    def shard(self, node_id: str) -> ShardState | None:
        for shard in self.shards:
            if shard.node_id == node_id:
                return shard
        return None

    def with_shard(self, shard: ShardState) -> ClusterState:
        others = tuple(s for s in self.shards if s.node_id != shard.node_id)
        return ClusterState(tuple(sorted((*others, shard), key=lambda s: s.node_id)))


EMPTY = ClusterState()


# ---- JSON form --------------------------------------------------------------------------


def encode(state: ClusterState) -> bytes:
    return json.dumps({"format": FORMAT_VERSION, "shards": [
        _shard_json(shard) for shard in state.shards]}, sort_keys=True).encode()


def as_json(state: ClusterState) -> list[dict[str, Any]]:
    """The shards as the HTTP API and the CLI show them."""
    return [_shard_json(shard) for shard in state.shards]


def _shard_json(shard: ShardState) -> dict[str, Any]:
    return {
        "node_id": shard.node_id, "generation": shard.generation,
        "status": shard.status.value, "since_ms": shard.since_ms, "reason": shard.reason,
        "requested_by": shard.requested_by, "rebuild_generation": shard.rebuild_generation,
        "finished_ms": shard.finished_ms, "rebuilds_count": shard.rebuilds_count,
        "mini": shard.mini, "mini_rebuilds_count": shard.mini_rebuilds_count,
        "rebuild_id": shard.rebuild_id,
        "scope_logs": shard.scope_logs, "scope_ranges": shard.scope_ranges,
        "dirty_ranges": [[log_id, [list(r) for r in ranges]] for log_id, ranges in shard.dirty],
        "donors": [{"node_id": name, **dataclasses.asdict(progress)}
                   for name, progress in shard.donors],
    }


def decode(raw: bytes) -> ClusterState | None:
    """The document in ``raw``; None when it is not one (malformed, hostile, too big)."""
    if len(raw) > DOCUMENT_BYTES_MAX:
        return None
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if type(document) is not dict or document.get("format") != FORMAT_VERSION:
        return None
    shards = document.get("shards")
    if type(shards) is not list or len(shards) > SHARDS_MAX:
        return None
    decoded: list[ShardState] = []
    for item in shards:
        shard = _shard_of(item)
        if shard is None or any(s.node_id == shard.node_id for s in decoded):
            return None
        decoded.append(shard)
    return ClusterState(tuple(sorted(decoded, key=lambda s: s.node_id)))


def _int(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _shard_of(item: Any) -> ShardState | None:
    if type(item) is not dict:
        return None
    node_id, status = item.get("node_id"), item.get("status")
    ints = ("generation", "since_ms", "rebuild_generation", "finished_ms", "rebuilds_count")
    if (type(node_id) is not str or not node_id_valid(node_id)
            or status not in ShardStatus.__members__
            or not all(_int(item.get(name)) for name in ints)
            or type(item.get("reason")) is not str or type(item.get("requested_by")) is not str
            or len(item["reason"]) > 1024 or len(item["requested_by"]) > 256
            or type(item.get("donors")) is not list or len(item["donors"]) > SHARDS_MAX):
        return None
    donors: list[tuple[str, DonorProgress]] = []
    for donor in item["donors"]:
        progress = _donor_of(donor)
        if progress is None:
            return None
        donors.append(progress)
    # Absent in documents written before mini-rebuilds (and by nodes that predate them).
    dirty = dirty_of(item.get("dirty_ranges", []))
    mini_count = item.get("mini_rebuilds_count", 0)
    rebuild_id = item.get("rebuild_id", 0)
    if dirty is None or not _int(mini_count) or not _int(rebuild_id):
        return None
    scope_logs = item.get("scope_logs", len(dirty))
    scope_ranges = item.get("scope_ranges", ranges_count(dirty))
    if not _int(scope_logs) or not _int(scope_ranges):
        return None
    return ShardState(node_id, item["generation"], ShardStatus(str(status)), item["since_ms"],
                      item["reason"], item["requested_by"], item["rebuild_generation"],
                      tuple(donors), item["finished_ms"], item["rebuilds_count"], dirty,
                      mini_count, scope_logs, scope_ranges, rebuild_id)


def ranges_count(dirty: DirtyRanges) -> int:
    return sum(len(ranges) for _, ranges in dirty)


def dirty_of(value: Any) -> DirtyRanges | None:
    """A scope from its JSON form (``[[log_id, [[lo, hi], ...]], ...]``) if well formed:
    logs ascending and valid, each with ranges inclusive, ascending, disjoint, within the
    LSN space, at most ``DIRTY_RANGES_DECODE_MAX`` ranges in all; None otherwise."""
    if type(value) is not list or len(value) > DIRTY_RANGES_DECODE_MAX:
        return None
    logs: list[tuple[int, tuple[LsnRange, ...]]] = []
    total = 0
    for item in value:
        if type(item) is not list or len(item) != 2 or type(item[1]) is not list:
            return None
        log_id, raw = item
        if (type(log_id) is not int or not 0 < log_id < 2**62
                or (logs and log_id <= logs[-1][0]) or not raw):
            return None
        total += len(raw)
        if total > DIRTY_RANGES_DECODE_MAX:
            return None
        ranges: list[LsnRange] = []
        previous = 0
        for pair in raw:
            if (type(pair) is not list or len(pair) != 2 or type(pair[0]) is not int
                    or type(pair[1]) is not int
                    or not previous < pair[0] <= pair[1] <= LSN_MAX):
                return None
            ranges.append((pair[0], pair[1]))
            previous = pair[1]
        logs.append((log_id, tuple(ranges)))
    return tuple(logs)


def _donor_of(item: Any) -> tuple[str, DonorProgress] | None:
    if type(item) is not dict:
        return None
    name = item.get("node_id")
    ints = ("log_id", "next_lsn", "records", "bytes", "bytes_total", "updated_ms")
    if (type(name) is not str or not node_id_valid(name)
            or not all(_int(item.get(field)) for field in ints)
            or type(item.get("done")) is not bool):
        return None
    return name, DonorProgress(item["log_id"], item["next_lsn"], item["records"],
                               item["bytes"], item["bytes_total"], item["done"],
                               item["updated_ms"])


# ---- transitions (pure: ``state -> new state``, or None when nothing changes) ------------

Transition = Callable[[ClusterState], ClusterState | None]


def registered(node_id: str, generation: int, now_ms: int) -> Transition:
    """A node started on a new disk the cluster did not know it by, holding no data that
    anyone relies on (a new node, a new cluster): authoritative at ``generation``."""
    def apply(state: ClusterState) -> ClusterState | None:
        shard = state.shard(node_id)
        if shard is not None and shard.generation == generation:
            return None
        if shard is not None and shard.status is not ShardStatus.REMOVED:
            return None  # known already with another disk: that is a replacement
        return state.with_shard(ShardState(node_id, generation, since_ms=now_ms,
                                           reason="new disk"))
    return apply


def rebuild_started(node_id: str, generation: int, donors: tuple[str, ...], *, now_ms: int,
                    reason: str, requested_by: str, dirty: DirtyRanges = ()) -> Transition:
    """The shard's copies are lost (a replaced or damaged disk): REBUILDING for the disk of
    ``generation`` by ``donors``; ``dirty``: only those ranges (a mini-rebuild), ``()``
    everything: also when ``dirty`` has more than ``DIRTY_RANGES_MAX`` ranges or would take
    the document's past ``DOCUMENT_DIRTY_RANGES_MAX`` (the whole shard covers any scope).
    Idempotent for the same generation."""
    def apply(state: ClusterState) -> ClusterState | None:
        shard = state.shard(node_id)
        if (shard is not None and shard.status is ShardStatus.REBUILDING
                and shard.rebuild_generation == generation):
            return None
        scope = dirty
        others = sum(ranges_count(s.dirty) for s in state.shards if s.node_id != node_id)
        if (ranges_count(scope) > DIRTY_RANGES_MAX
                or others + ranges_count(scope) > DOCUMENT_DIRTY_RANGES_MAX):
            scope = ()
        count = shard.rebuilds_count + 1 if shard is not None else 1
        minis = (shard.mini_rebuilds_count if shard is not None else 0) + bool(scope)
        rebuild_id = (shard.rebuild_id if shard is not None else 0) + 1
        return state.with_shard(ShardState(
            node_id, generation, ShardStatus.REBUILDING, now_ms, reason, requested_by,
            generation, tuple((d, DonorProgress(updated_ms=now_ms)) for d in sorted(donors)),
            shard.finished_ms if shard is not None else 0, count, scope, minis, len(scope),
            ranges_count(scope), rebuild_id))
    return apply


def donor_progressed(node_id: str, generation: int, donor: str,
                     progress: DonorProgress, rebuild_id: int | None = None) -> Transition:
    """A donor's checkpoint for the rebuild of ``node_id``'s ``generation`` (ignored when
    that rebuild is over or replaced by a newer one, or when it would go backwards).
    ``rebuild_id``: the rebuild (``ShardState.rebuild_id``) the donor walked for; another
    one's (an earlier mini-rebuild of the same generation) is ignored. None: not checked."""
    def apply(state: ClusterState) -> ClusterState | None:
        shard = state.shard(node_id)
        if (shard is None or shard.status not in (ShardStatus.REBUILDING, ShardStatus.DRAINING)
                or shard.rebuild_generation != generation
                or (rebuild_id is not None and shard.rebuild_id != rebuild_id)):
            return None
        current = shard.donor(donor)
        if current is None or current.done or current == progress:
            return None
        donors = tuple((name, progress if name == donor else p) for name, p in shard.donors)
        return state.with_shard(dataclasses.replace(shard, donors=donors))
    return apply


def rebuild_finished(node_id: str, generation: int, now_ms: int) -> Transition:
    """Every donor is done: the shard is authoritative again (a drain: DRAINED). The
    scope's ranges are dropped (its size is kept): the document must not grow with every
    mini-rebuild finished."""
    def apply(state: ClusterState) -> ClusterState | None:
        shard = state.shard(node_id)
        if (shard is None or shard.rebuild_generation != generation
                or shard.status not in (ShardStatus.REBUILDING, ShardStatus.DRAINING)
                or not shard.donors_done):
            return None
        status = (ShardStatus.AUTHORITATIVE if shard.status is ShardStatus.REBUILDING
                  else ShardStatus.DRAINED)
        return state.with_shard(dataclasses.replace(
            shard, status=status, since_ms=now_ms, finished_ms=now_ms, dirty=()))
    return apply


def drain_started(node_id: str, donors: tuple[str, ...], *, now_ms: int,
                  requested_by: str) -> Transition:
    """An operator drains ``node_id``: its copies are re-replicated elsewhere by ``donors``
    while it keeps serving reads."""
    def apply(state: ClusterState) -> ClusterState | None:
        shard = state.shard(node_id)
        if shard is None:
            return None
        if shard.status in (ShardStatus.DRAINING, ShardStatus.DRAINED, ShardStatus.REMOVED):
            return None
        return state.with_shard(dataclasses.replace(
            shard, status=ShardStatus.DRAINING, since_ms=now_ms, reason="drain",
            requested_by=requested_by, rebuild_generation=shard.generation, dirty=(),
            scope_logs=0, scope_ranges=0,
            rebuild_id=shard.rebuild_id + 1,
            donors=tuple((d, DonorProgress(updated_ms=now_ms)) for d in sorted(donors))))
    return apply


def removed(node_id: str, now_ms: int) -> Transition:
    def apply(state: ClusterState) -> ClusterState | None:
        shard = state.shard(node_id)
        if shard is None or shard.status is not ShardStatus.DRAINED:
            return None
        return state.with_shard(dataclasses.replace(shard, status=ShardStatus.REMOVED,
                                                    since_ms=now_ms, reason="removed"))
    return apply


# ---- the store ---------------------------------------------------------------------------


class ClusterStateStore(Protocol):
    """Where the document lives. ``read`` answers ``(OK, state, version)`` (version 0 and
    ``EMPTY`` when there is none yet); ``write`` stores ``state`` only if the stored version
    is still ``expected_version`` and answers OK, AGAIN (it moved), or a backend error
    (CONNFAILED, TIMEDOUT, INTERNAL). A malformed stored document reads as INTERNAL."""

    async def read(self) -> tuple[Status, ClusterState, int]: ...

    async def write(self, state: ClusterState, *, expected_version: int) -> Status: ...

    async def close(self) -> None: ...


async def change(store: ClusterStateStore, transition: Transition,
                 rng: random.Random | None = None) -> tuple[Status, ClusterState]:
    """Apply ``transition`` by read, plan, compare-and-swap; a lost race is retried with
    jittered backoff. Answers the state after the change (or as read, if nothing changed)."""
    rng = rng or random.Random()
    for attempt in range(CHANGE_ATTEMPTS_MAX):
        status, state, version = await store.read()
        if status is not Status.OK:
            return status, state
        new = transition(state)
        if new is None:
            return Status.OK, state
        status = await store.write(new, expected_version=version)
        if status is Status.OK:
            return Status.OK, new
        if status is not Status.AGAIN:
            return status, state
        await asyncio.sleep(rng.uniform(0, min(0.001 * (1 << min(attempt, 7)), 0.1)))
    return Status.AGAIN, EMPTY
