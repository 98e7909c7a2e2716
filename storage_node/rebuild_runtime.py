"""Disk identity, the shard's place in the cluster state, and rebuilding: the asyncio driver.

Every storage node runs one ``RebuildRuntime`` beside its ``StorageNode``:

1. **Before the record store opens** (``before_start``): the disk identity marker
   (``storage_node.disk_identity``) is checked against the cluster state
   (``shared.cluster_state``, in the epoch store). A new, wiped or damaged disk on a shard the
   cluster knows held data, or a marker of another generation than the cluster's, means the
   shard lost copies: a new generation is written to the marker, and after the store opened
   (``after_start``) the node vouches for nothing (``AuthorityStatus.unsure_of_everything``,
   durable) and records REBUILDING for its new generation, with every other storage node as
   a donor. A new shard (a new cluster, an added node) is registered as AUTHORITATIVE. A
   marker of another node or cluster stops the start (``ForeignDiskError``).
2. **Every ``poll_interval_ms``** it reads the cluster state:
   - as a donor, for every other shard being rebuilt (or drained) it runs a ``DonorCore``
     (``storage_node.core.rebuild``): a plan first (the sequencers' tails, through the
     node's ``FrontEnd``: ``sequencer_tail``/``active_tails``, released before the walk),
     then chunks of its copies go to that shard in REBUILD_STORE
     frames, under a token-bucket rate limit, with checkpoints saved in the cluster state
     (so a restarted donor resumes there), and finally ``done``;
   - as the shard being rebuilt, once every donor is done it vouches for everything again
     (``AuthorityStatus.clear``, durable first) and then records AUTHORITATIVE; damage found
     since the rebuild began (its start-up scan, a read) makes it begin the rebuild again
     for a new generation instead, over the old scope and the new damage's;
   - as an authoritative shard that found damaged copies (its start-up scan, the scrub, a
     read), it records a rebuild of their scope (``storage_node.core.rebuild_scope``): a
     mini-rebuild of the damaged LSN ranges when they are known, in which donors walk only
     those, else the whole shard (``target_decision``).
3. **As the target** (``on_rebuild_store``) it writes the copies a donor sends where it holds
   none (in its index, or of equal or higher precedence queued for its writer:
   ``storage_node.core.rebuild_accept``), adopting the donor's release pointer, trim point
   and seal when they are higher.

Nothing here runs per record on the append path: a rebuild costs one frame per chunk.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shared import cluster_state as cs
from shared.cluster_state import (
    ClusterState,
    ClusterStateStore,
    DirtyRanges,
    DonorProgress,
    ShardStatus,
)
from shared.status import Status
from shared.types import LSN_MAX, Epoch, LogId, Lsn, NodeId, epoch_valid, node_id_valid
from shared.wire.codec import Message, decode_store_fields
from shared.wire.rebuild import REBUILD_ENTRIES_MAX, RebuildStore, RebuildStored
from shared.wire.release import Release
from shared.wire.store import RecordFlags, Store, copy_precedence
from shared.wire.trim import Trim
from storage_node import disk_identity
from storage_node.core.rebuild import (
    READ_RECORDS_MAX,
    AskTails,
    DonorCore,
    Finished,
    ListLogs,
    ReadChunk,
    SaveCheckpoint,
    SendChunk,
    Sleep,
    Tail,
    TargetStep,
    TokenBucket,
    narrowed,
)
from storage_node.core.rebuild_accept import (
    PRECEDENCE_LOWEST,
    HeldCopy,
    contested,
    outranked,
    outside,
    queued_winners,
    rebuild_pieces,
)
from storage_node.core.rebuild_scope import TargetDecision, as_dirty, merged, target_decision
from storage_node.core.store_machine import store_fields_status
from storage_node.disk_identity import DiskState, ForeignDiskError
from storage_node.rebuild_reads import read_pieces
from storage_node.runtime import StorageNode
from storage_node.segment_format import SealEntry, TrimEntry

log = logging.getLogger(__name__)

ReplyFn = Callable[[Message], None]
SequencerTailFn = Callable[[LogId], Awaitable[tuple[Lsn, Lsn] | None]]
"""``(release_lsn, tail_lsn)`` of a log's sequencer, or None (``FrontEnd.inflight_tail``)."""
ActiveTailsFn = Callable[[], Awaitable[dict[LogId, tuple[Lsn, Lsn]] | None]]
"""The same for every log active on any sequencer node, or None (``FrontEnd.active_tails``)."""
TAIL_ASKS_CONCURRENT_MAX = 64
"""Sequencer questions one donor has in flight at once while planning."""
RequestFn = Callable[[NodeId, Message, Callable[[Any], None], int], None]
"""``request(node, message, callback, timeout_ms)``: ``callback`` gets the answer or a Status."""
START_STATE_WAIT_MS = 15_000
DRAIN_SETTLE_POLLS = 2
DRAIN_SETTLE_MARGIN_MS = 1_000
DRAIN_SETTLE_MAX_MS = 60_000
_NO_NEW_COPIES = (ShardStatus.DRAINING, ShardStatus.DRAINED, ShardStatus.REMOVED)
"""How long a start waits for the cluster state before deciding without it."""
REBUILD_SLICE_ENTRIES = 64
"""Copies of one REBUILD_STORE the rebuilt node decides and queues per event-loop iteration
(a chunk holds up to 4096): a whole chunk of single-record entries at once held the loop for
tens of milliseconds, and the appends' STOREs waiting behind it (docs/BENCHMARKS.md)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildConfig:
    rate_bytes_per_s: int = 32 * 1024 * 1024
    """Each donor's rate limit (0: none)."""
    burst_bytes: int = 1024 * 1024
    chunk_bytes_max: int = 512 * 1024
    """Bytes of copies per REBUILD_STORE (see ``storage_node.core.rebuild``)."""
    poll_interval_ms: int = 1_000
    checkpoint_interval_ms: int = 2_000
    send_timeout_ms: int = 30_000
    by_copyset: bool = False
    """Send only copies whose copyset names the lost shard (see ``storage_node.core.rebuild``
    for why this is not the default)."""


@dataclass
class _Donation:
    shard: str
    generation: int
    task: asyncio.Task[None]
    core: DonorCore | None = None
    started_ms: int = 0
    bytes_sent: int = 0
    dirty: DirtyRanges = ()
    rebuild_id: int = 0
    """``ShardState.rebuild_id`` of the rebuild walked for (mini-rebuilds share a
    generation): its checkpoints name it, and one of another rebuild is cancelled."""


@dataclass
class RebuildStats:
    chunks_sent: int = 0
    records_sent: int = 0
    bytes_sent: int = 0
    chunks_received: int = 0
    records_received: int = 0
    records_written: int = 0
    send_failures: int = 0
    rebuilds_finished: int = 0
    mini_rebuilds_finished: int = 0
    mini_rebuilds_started: int = 0
    state_reads_failed: int = 0
    precedence_reads: int = 0
    """Slices of donors' chunks that read held copies' precedence (a collision that a
    donor's copy could win: ``storage_node.held_precedence``)."""
    copies_outranked: int = 0
    """Held copies' LSNs replaced by a donor's copy of higher precedence."""
    extra: dict[str, int] = field(default_factory=dict)


class RebuildRuntime:
    def __init__(self, *, node: StorageNode, data_dir: str, cluster_name: str,
                 state_store: ClusterStateStore, storage_nodes: Callable[[], tuple[str, ...]],
                 request: RequestFn, config: RebuildConfig | None = None,
                 wall_ms: Callable[[], int] | None = None,
                 sequencer_tail: SequencerTailFn | None = None,
                 active_tails: ActiveTailsFn | None = None) -> None:
        self._node = node
        self._me = str(node.node_id)
        self._data_dir = data_dir
        self._cluster_name = cluster_name
        self._store = state_store
        self._storage_nodes = storage_nodes
        self._request = request
        self._sequencer_tail = sequencer_tail
        self._active_tails = active_tails
        """Donors plan their walks by the logs' sequencer tails (``storage_node.core.
        rebuild``); None only where no sequencer can be asked (then the walks are bounded by
        what each donor holds, which misses appends in flight when the disk was lost)."""
        self._config = config or RebuildConfig()
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._accept_writes = node.accepts_writes
        self.generation = 0
        self._lost_reason = ""
        """Non-empty once this start found the shard's copies lost (not yet recorded)."""
        self._lost_dirty: DirtyRanges = ()
        """The scope of that loss: ``()`` the whole shard, else a mini-rebuild's ranges."""
        self._lost_found = 0
        """``damage_found`` when ``_lost_dirty`` was taken: the damage that scope repairs."""
        self._register = False
        self.state: ClusterState = cs.EMPTY
        """The cluster state as last read."""
        self._donations: dict[str, _Donation] = {}
        self._poll_task: asyncio.Task[None] | None = None
        self._closing = False
        self._rng = random.Random()
        self.stats = RebuildStats()
        node.add_handler(RebuildStore, self.on_rebuild_store)

    # ---- start -------------------------------------------------------------------------

    async def before_start(self) -> None:
        """Check the disk marker against the cluster state; write a new marker if needed.
        Raises ForeignDiskError for another node's or cluster's disk."""
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, lambda: disk_identity.inspect(
            self._data_dir, cluster=self._cluster_name, node_id=self._me))
        if found.state is DiskState.FOREIGN:
            raise ForeignDiskError(
                f"data directory {self._data_dir} holds a disk of another node or cluster "
                f"({found.detail}); refusing to serve it as {self._me}'s")
        status, state = await self._read_state_patiently()
        shard = state.shard(self._me) if status is Status.OK else None
        known = status is Status.OK
        marker = found.marker
        if found.state is DiskState.OK and marker is not None:
            self.generation = marker.generation
            if known and shard is None:
                self._register = True
            elif shard is not None and shard.generation != marker.generation and not (
                    shard.status is ShardStatus.REBUILDING
                    and shard.rebuild_generation == marker.generation):
                self._lost(f"disk generation {marker.generation} is not the cluster's "
                           f"{shard.generation}", max(shard.generation, marker.generation))
        elif found.state is DiskState.LEGACY:
            self.generation = shard.generation if shard is not None else 1
            self._register = shard is None
        elif found.state is DiskState.NEW:
            if not known:
                # Nobody can say whether this shard held data: vouch for nothing until
                # the cluster state says (the poll loop registers or rebuilds it).
                self._lost("new disk, cluster state unreachable", 0)
            elif shard is None or shard.status is ShardStatus.REMOVED:
                self.generation = shard.generation + 1 if shard is not None else 1
                self._register = True
            else:
                self._lost("data directory missing or empty (disk replaced?)",
                           shard.generation)
        else:  # DAMAGED
            self._lost(f"identity marker damaged ({found.detail})",
                       shard.generation if shard is not None else 1)
        if marker is None or marker.generation != self.generation:
            new = disk_identity.new_marker(cluster=self._cluster_name, node_id=self._me,
                                           generation=self.generation)
            await loop.run_in_executor(None, disk_identity.write, self._data_dir, new)
        if self._lost_reason:
            log.error("storage node %s: %s: coming up non-authoritative as generation %d, "
                      "its shard will be rebuilt", self._me, self._lost_reason,
                      self.generation)

    def _lost(self, reason: str, known_generation: int, dirty: DirtyRanges = (),
              found: int = 0) -> None:
        """``found``: the damage count ``dirty`` was taken at (the same moment: what a rebuild
        of that scope repairs; ``_record_shard`` may widen both, never one alone)."""
        self._lost_reason = reason
        self._lost_dirty = dirty
        self._lost_found = found
        self.generation = known_generation + 1

    async def _begin_again(self, dirty: DirtyRanges) -> None:
        """Damage found while the shard is rebuilt: a rebuild of the next generation, of
        ``dirty`` (the old scope and the new damage's; ``()`` everything), with its marker
        written first (the rebuild is recorded by ``_record_shard``). Called right after
        ``_decide`` took ``dirty``, with no await between: the count taken here is the one
        that scope covers."""
        self._lost("copies found damaged while being rebuilt", self.generation, dirty,
                   self._node.store.authority.damage_found)
        log.error("storage node %s: damage found while its shard is rebuilt: rebuilding %s "
                  "again as generation %d", self._me,
                  f"{_ranges_count(dirty)} damaged ranges" if dirty else "all of it",
                  self.generation)
        await asyncio.get_running_loop().run_in_executor(
            None, disk_identity.write, self._data_dir, disk_identity.new_marker(
                cluster=self._cluster_name, node_id=self._me, generation=self.generation))

    async def after_start(self) -> None:
        """The store is open: make the loss durable, record it, start polling. A node that
        restarts while its shard is rebuilt and whose start found damage (copies the donors
        had sent may be gone) begins its rebuild again (``target_step``)."""
        authority = self._node.store.authority
        if not self._lost_reason:
            decision = self._decide()
            if decision.step is TargetStep.RESTART:
                await self._begin_again(decision.dirty)
        if self._lost_reason:
            authority = self._node.store.authority
            if not self._lost_dirty:
                authority.unsure_of_everything()
                self._lost_found = authority.damage_found
            await self._node.store.save_authority()
            await self._record_shard()
        elif self._register:
            await self._record_shard()
        mine = self.state.shard(self._me)
        if mine is not None and mine.status in _NO_NEW_COPIES:
            self._node.machine.set_accept_writes(False)
        self._poll_task = asyncio.get_running_loop().create_task(
            self._poll(), name=f"seqlog-rebuild-{self._me}")

    async def _record_shard(self) -> bool:
        now_ms = self._wall_ms()
        authority = self._node.store.authority
        applied = [False]
        found = 0
        if self._lost_reason:
            # The damage counted as repaired and the scope recorded are taken here, at one
            # moment (no await between): damage found since ``_lost`` (a read, the scrub;
            # a failed attempt's retry can come much later) is in both or in neither.
            if self._lost_dirty:
                self._lost_dirty = as_dirty(merged(self._lost_dirty, authority.damage_scope()))
            found = authority.damage_found
            started = cs.rebuild_started(self._me, self.generation, self._donors(),
                                         now_ms=now_ms, reason=self._lost_reason,
                                         requested_by=self._me, dirty=self._lost_dirty)

            def recorded(state: ClusterState) -> ClusterState | None:
                new = started(state)
                applied[0] = new is not None  # the last call is the one written
                return new
            transition: cs.Transition = recorded
        else:
            transition = cs.registered(self._me, self.generation, now_ms)
        status, state = await cs.change(self._store, transition, self._rng)
        if status is not Status.OK:
            log.warning("storage node %s: could not record its shard in the cluster state "
                        "(%s); retrying", self._me, status.name)
            return False
        self.state = state
        if self._lost_reason:
            # Recorded already (an earlier attempt's write landed though it was reported
            # failed): its scope is at least the first one's, and its donors may have
            # begun: only the damage that first scope covers is repaired by it (more
            # found since begins the rebuild again, ``target_decision``).
            authority.rebuild_covers(found if applied[0] else self._lost_found)
            await self._node.store.save_authority()
            mine = state.shard(self._me)
            self.stats.mini_rebuilds_started += mine is not None and bool(mine.dirty)
        self._lost_reason = ""
        self._lost_dirty = ()
        self._register = False
        return True

    def _decide(self) -> TargetDecision:
        """``target_decision`` for this node now (``storage_node.core.rebuild_scope``)."""
        authority = self._node.store.authority
        return target_decision(self.state.shard(self._me), self.generation,
                               damaged=authority.damaged, damage_found=authority.damage_found,
                               damage_covered=authority.damage_covered,
                               pending=authority.damage_scope())

    def _donors(self) -> tuple[str, ...]:
        removed = {s.node_id for s in self.state.shards if s.status is ShardStatus.REMOVED}
        return tuple(n for n in self._storage_nodes() if n != self._me and n not in removed)

    async def _read_state_patiently(self) -> tuple[Status, ClusterState]:
        deadline = asyncio.get_running_loop().time() + START_STATE_WAIT_MS / 1000
        while True:
            status, state, _ = await self._store.read()
            if status is Status.OK:
                self.state = state
                return status, state
            if asyncio.get_running_loop().time() >= deadline:
                log.error("storage node %s: cluster state unreadable (%s)", self._me,
                          status.name)
                return status, state
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        self._closing = True
        tasks = [d.task for d in self._donations.values()]
        if self._poll_task is not None:
            tasks.append(self._poll_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._donations.clear()

    # ---- the poll loop -----------------------------------------------------------------

    async def _poll(self) -> None:
        while not self._closing:
            try:
                await self.poll_once()
            except Exception:
                log.exception("storage node %s: rebuild poll failed", self._me)
            await asyncio.sleep(self._config.poll_interval_ms / 1000)

    async def poll_once(self) -> None:
        if self._lost_reason or self._register:
            if self._lost_reason and self.generation == 1:
                # Decided without the cluster state: decide again now that it may be there.
                status, state, _ = await self._store.read()
                if status is Status.OK:
                    shard = state.shard(self._me)
                    if shard is not None and shard.generation >= self.generation:
                        self.generation = shard.generation + 1
                        await asyncio.get_running_loop().run_in_executor(
                            None, disk_identity.write, self._data_dir,
                            disk_identity.new_marker(cluster=self._cluster_name,
                                                     node_id=self._me,
                                                     generation=self.generation))
            if not await self._record_shard():
                return
        status, state, _ = await self._store.read()
        if status is not Status.OK:
            self.stats.state_reads_failed += 1
            return
        self.state = state
        mine = state.shard(self._me)
        self._node.machine.set_accept_writes(self._accept_writes and not (
            mine is not None and mine.status in _NO_NEW_COPIES))
        authority = self._node.store.authority
        decision = self._decide()
        if decision.step is TargetStep.RESTART:
            await self._begin_again(decision.dirty)
            await self._record_shard()  # retried by the next poll if it fails
            return
        if decision.step is TargetStep.FINISH and mine is not None:
            await self._finish(mine.rebuild_generation, mini=mine.mini)
        elif decision.step is TargetStep.START:
            # Copies found damaged (a start-up scan, the scrub, a read): rebuild them from
            # the others: a mini-rebuild of their ranges when those are known, else the
            # whole shard (either writes only what is missing or damaged here).
            found = authority.damage_found
            dirty = decision.dirty
            status, new_state = await cs.change(self._store, cs.rebuild_started(
                self._me, self.generation, self._donors(), now_ms=self._wall_ms(),
                reason=("damaged copies found: mini-rebuild" if dirty
                        else "damaged copies found"),
                requested_by=self._me, dirty=dirty), self._rng)
            if status is Status.OK:
                self.state = state = new_state
                authority.rebuild_covers(found)
                await self._node.store.save_authority()
                recorded = new_state.shard(self._me)
                dirty = recorded.dirty if recorded is not None else ()  # () past the bound
                self.stats.mini_rebuilds_started += bool(dirty)
                if dirty:
                    log.warning("storage node %s: damaged copies found: mini-rebuilding %d "
                                "LSN ranges of %d logs", self._me, _ranges_count(dirty),
                                len(dirty))
                else:
                    log.warning("storage node %s: damaged copies found (their range unknown): "
                                "rebuilding the whole shard", self._me)
        for shard in state.shards:
            # A drain is over once every donor is done; any node may say so (the drained
            # node may be down already).
            if shard.status is ShardStatus.DRAINING and shard.donors_done:
                status, new = await cs.change(self._store, cs.rebuild_finished(
                    shard.node_id, shard.rebuild_generation, self._wall_ms()), self._rng)
                if status is Status.OK:
                    self.state = state = new
        self._run_donations(state)

    async def _finish(self, generation: int, *, mini: bool = False) -> None:
        """Every donor is done: vouch for everything again (durably), then say so. (A
        mini-rebuild too: the node was unsure of no more than its damage's scope, or of
        everything, and the donors have sent that scope.)"""
        authority = self._node.store.authority
        authority.clear(None, 1, LSN_MAX)
        await self._node.store.save_authority()
        status, state = await cs.change(
            self._store, cs.rebuild_finished(self._me, generation, self._wall_ms()), self._rng)
        if status is Status.OK:
            self.state = state
            self.stats.rebuilds_finished += 1
            self.stats.mini_rebuilds_finished += mini
            log.info("storage node %s: %s of generation %d finished: authoritative "
                     "again", self._me, "mini-rebuild" if mini else "rebuild", generation)

    def _run_donations(self, state: ClusterState) -> None:
        wanted: dict[str, tuple[int, DonorProgress, DirtyRanges, int]] = {}
        for shard in state.shards:
            if shard.node_id == self._me or shard.status not in (
                    ShardStatus.REBUILDING, ShardStatus.DRAINING):
                continue
            progress = shard.donor(self._me)
            if progress is None or progress.done:
                continue
            wanted[shard.node_id] = (shard.rebuild_generation, progress, shard.dirty,
                                     shard.rebuild_id)
        for name, donation in list(self._donations.items()):
            target = wanted.get(name)
            # A donation of another rebuild (an earlier mini-rebuild of the same generation,
            # another scope: kept from a stale poll) is not this one's.
            if (target is None or (target[0], target[2], target[3]) != (
                    donation.generation, donation.dirty, donation.rebuild_id)
                    or donation.task.done()):
                if not donation.task.done():
                    donation.task.cancel()
                del self._donations[name]
        loop = asyncio.get_running_loop()
        for name, (generation, progress, dirty, rebuild_id) in wanted.items():
            if name in self._donations:
                continue
            donation = _Donation(name, generation, task=None,  # type: ignore[arg-type]
                                 started_ms=self._wall_ms(), dirty=dirty,
                                 rebuild_id=rebuild_id)
            donation.task = loop.create_task(self._donate(donation, progress),
                                             name=f"seqlog-donate-{self._me}-{name}")
            self._donations[name] = donation

    # ---- donating ----------------------------------------------------------------------

    async def _donate(self, donation: _Donation, progress: DonorProgress) -> None:
        node = self._node
        shard = self.state.shard(donation.shard)
        if shard is not None and shard.status is ShardStatus.DRAINING:
            # A drained node keeps taking copies until its own poll sees DRAINING; a copy it
            # took after this walk's bounds were read would never be sent elsewhere (the walk
            # stops at each log's last LSN when it starts). So the bounds are read once that
            # node has surely stopped: two of its polls after the drain began.
            settle_ms = (shard.since_ms + DRAIN_SETTLE_POLLS * self._config.poll_interval_ms
                         + DRAIN_SETTLE_MARGIN_MS - self._wall_ms())
            if settle_ms > 0:  # bounded: a clock far ahead on the operator's host
                await asyncio.sleep(min(settle_ms, DRAIN_SETTLE_MAX_MS) / 1000)
        now_ms = self._wall_ms()
        logs = [(int(log_id), int(node.log_state(log_id).last_lsn))
                for log_id in node.log_ids()]
        if progress.bytes_total == 0:
            estimate = self._bytes_estimate(donation.dirty)
            progress = DonorProgress(progress.log_id, progress.next_lsn, progress.records,
                                     progress.bytes, max(estimate, 1), progress.done, now_ms)
        bucket = TokenBucket(self._config.rate_bytes_per_s, self._config.burst_bytes, now_ms)
        core = DonorCore(shard=donation.shard, logs=logs, progress=progress, bucket=bucket,
                         by_copyset=self._config.by_copyset,
                         checkpoint_interval_ms=self._config.checkpoint_interval_ms,
                         now_ms=now_ms, chunk_bytes_max=self._config.chunk_bytes_max,
                         tails=self._sequencer_tail is not None
                         and self._active_tails is not None, dirty=donation.dirty)
        donation.core = core
        log.info("storage node %s: donating to the %s of %s (generation %d) from log "
                 "%d LSN %d", self._me,
                 f"mini-rebuild ({_ranges_count(donation.dirty)} ranges)" if donation.dirty
                 else "rebuild", donation.shard, donation.generation, progress.log_id,
                 progress.next_lsn)
        while not self._closing:
            now_ms = self._wall_ms()
            effect = core.next(now_ms)
            if effect is None:
                await asyncio.sleep(0.01)
            elif isinstance(effect, AskTails):
                core.on_tails(await self._ask_tails(effect.log_ids, effect.everywhere),
                              self._wall_ms())
            elif isinstance(effect, ListLogs):
                core.on_logs([(int(log_id), int(node.log_state(log_id).last_lsn))
                              for log_id in node.log_ids()], self._wall_ms())
            elif isinstance(effect, ReadChunk):
                read, next_lsn = await node.store.read_entries(
                    LogId(effect.log_id), Lsn(effect.from_lsn), Lsn(effect.until_lsn),
                    READ_RECORDS_MAX, functools.partial(read_pieces,
                                                        bytes_max=effect.bytes_max))
                if read is None:  # the store is closing
                    return
                pieces, stopped_at = read
                core.on_read(pieces, next_lsn if stopped_at is None else Lsn(stopped_at),
                             self._wall_ms())
            elif isinstance(effect, SendChunk):
                status = await self._send(donation, effect)
                if status is Status.OK:
                    self.stats.chunks_sent += 1
                    self.stats.records_sent += effect.records
                    self.stats.bytes_sent += effect.bytes
                    donation.bytes_sent += effect.bytes
                else:
                    self.stats.send_failures += 1
                    if status is Status.STALE:
                        return  # the shard has another disk now: the next poll decides
                core.on_sent(status, self._wall_ms())
            elif isinstance(effect, Sleep):
                await asyncio.sleep(max(0, effect.until_ms - now_ms) / 1000)
            elif isinstance(effect, SaveCheckpoint):
                status, _ = await cs.change(self._store, cs.donor_progressed(
                    donation.shard, donation.generation, self._me, effect.progress,
                    donation.rebuild_id), self._rng)
                core.on_checkpointed(status is Status.OK, self._wall_ms())
            elif isinstance(effect, Finished):
                status, _ = await cs.change(self._store, cs.donor_progressed(
                    donation.shard, donation.generation, self._me, effect.progress,
                    donation.rebuild_id), self._rng)
                if status is Status.OK:
                    log.info("storage node %s: donated %d records (%d bytes) to the rebuild "
                             "of %s", self._me, effect.progress.records,
                             effect.progress.bytes, donation.shard)
                    return
                core.progress = _undone(effect.progress)
                await asyncio.sleep(1.0)

    def _bytes_estimate(self, dirty: DirtyRanges) -> int:
        """What a donation will scan: the store's live bytes; for a mini-rebuild, the LSNs
        this donor holds in its ranges at the store's mean bytes per index entry."""
        stats = self._node.store.stats()
        live = stats.get("live_bytes", 0)
        if not dirty:
            return int(live)
        per_entry = live / max(1, stats.get("index_entries", 1))
        held = 0
        for log_id, ranges in dirty:
            for lo, hi in ranges:
                held += sum(b - a + 1 for a, b in self._node.store.held_ranges(
                    LogId(log_id), Lsn(lo), Lsn(hi)))
        return int(min(live, held * per_entry))

    async def _ask_tails(self, log_ids: tuple[int, ...], everywhere: bool
                         ) -> dict[int, Tail | None] | None:
        """Each log's sequencer's tail (``FrontEnd.inflight_tail``), a bounded number at a
        time; a question that fails is None (the core asks again). ``everywhere``: first
        every sequencer node's active logs (``FrontEnd.active_tails``; None if one did not
        answer), which answer for those logs and add the ones this donor does not hold."""
        ask, ask_all = self._sequencer_tail, self._active_tails
        assert ask is not None and ask_all is not None
        answers: dict[int, Tail | None] = {}
        gate = asyncio.Semaphore(TAIL_ASKS_CONCURRENT_MAX)
        if everywhere:
            try:
                active = await ask_all()
            except Exception:  # a peer failure: asked again
                log.debug("storage node %s: active logs: no answer", self._me, exc_info=True)
                active = None
            if active is None:
                return None
            for log_id, (release, tail) in active.items():
                held = int(self._node.log_state(log_id).last_lsn)
                answers[int(log_id)] = Tail(int(release), int(tail), held)
            log_ids = tuple(log_id for log_id in log_ids if log_id not in answers)

        async def one(log_id: int) -> None:
            async with gate:
                try:
                    found = await ask(LogId(log_id))
                except Exception:  # an epoch store or peer failure: asked again
                    log.debug("storage node %s: tail of log %d: no answer", self._me, log_id,
                              exc_info=True)
                    found = None
            held = int(self._node.log_state(LogId(log_id)).last_lsn)
            answers[log_id] = (None if found is None
                               else Tail(int(found[0]), int(found[1]), held))

        await asyncio.gather(*(one(log_id) for log_id in log_ids))
        return answers

    def _target(self, donation: _Donation, log_id: int) -> str | None:
        """Where a chunk goes: back to the rebuilt shard, or for a drain to another node
        that takes copies (spread by log)."""
        shard = self.state.shard(donation.shard)
        if shard is None or shard.status is not ShardStatus.DRAINING:
            return donation.shard
        candidates = sorted(s.node_id for s in self.state.shards
                            if s.node_id not in (self._me, donation.shard)
                            and s.status is ShardStatus.AUTHORITATIVE)
        return candidates[log_id % len(candidates)] if candidates else None

    async def _send(self, donation: _Donation, chunk: SendChunk) -> Status:
        target = self._target(donation, chunk.log_id)
        if target is None:
            return Status.NOSPC  # nowhere to put the copies yet: retried
        state = self._node.log_state(LogId(chunk.log_id))
        seal_epoch, sealed_by = state.sealed_epoch, state.sealed_by or ""
        message = RebuildStore(shard=donation.shard, generation=donation.generation,
                               log_id=chunk.log_id, release_lsn=int(state.release_lsn),
                               trim_lsn=int(state.trim_lsn), sealed_epoch=int(seal_epoch),
                               sealed_by=sealed_by, entries=chunk.entries)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(answer: Any) -> None:
            if not future.done():
                future.set_result(answer)

        self._request(NodeId(target), message, done, self._config.send_timeout_ms)
        answer = await future
        if isinstance(answer, RebuildStored):
            return answer.status
        return answer if isinstance(answer, Status) else Status.BADMSG

    # ---- receiving ---------------------------------------------------------------------

    def on_rebuild_store(self, message: RebuildStore, reply: ReplyFn) -> None:
        node = self._node
        self.stats.chunks_received += 1

        def answer(status: Status, written: int = 0) -> None:
            reply(RebuildStored(status=status, log_id=message.log_id, written=written))

        refused = node.not_serving()
        if refused is not None:
            answer(refused)
            return
        if not self._accepts(message.shard, message.generation):
            answer(Status.STALE)
            return
        if not _frame_ok(message):
            answer(Status.BADMSG)
            return
        log_id = LogId(message.log_id)
        machine = node.machine
        pending: list[Status] = []
        outstanding = [1]
        written = [0]

        def finished_one(status: Status) -> None:
            if status is not Status.OK:
                pending.append(status)
            outstanding[0] -= 1
            if outstanding[0] == 0:
                self.stats.records_written += written[0]
                answer(pending[0] if pending else Status.OK, written[0])

        # What a SEAL, TRIM and RELEASE would have set here had the node not lost them.
        if (epoch_valid(message.sealed_epoch) and node_id_valid(message.sealed_by)
                and machine.seal(log_id, Epoch(message.sealed_epoch),
                                 NodeId(message.sealed_by)) is Status.OK):
            outstanding[0] += 1
            status = node.store.submit_seal(SealEntry(log_id, Epoch(message.sealed_epoch),
                                                      NodeId(message.sealed_by)), finished_one)
            if status is not Status.OK:
                finished_one(status)
        if 0 < message.trim_lsn < LSN_MAX and machine.trim(
                Trim(log_id=log_id, trim_lsn=Lsn(message.trim_lsn))) is Status.OK:
            outstanding[0] += 1
            status = node.store.submit_trim(TrimEntry(log_id, machine.trim_lsn(log_id)),
                                            finished_one)
            if status is not Status.OK:
                finished_one(status)
        if 0 < message.release_lsn < LSN_MAX:
            node.core.on_release(Release(log_id=log_id, release_lsn=Lsn(message.release_lsn)))
        entries = message.entries
        loop = asyncio.get_running_loop()

        def write_slice(start: int, again: Callable[[int, Any], None]) -> None:
            """Entries ``start..start + REBUILD_SLICE_ENTRIES``, then the next slice in a later
            loop iteration: a chunk of thousands of small entries must not hold the appends'
            STOREs behind it (each slice decides against the queue as it is then). Itself
            comes in as ``again``: a closure naming itself is a reference cycle, which kept
            every chunk received (the message, its reply, up to 8 MiB of entries) in memory
            until the cyclic GC ran: a 1 GB rebuild took the node's RSS past 1 GiB."""
            stores = _decoded_entries(log_id, entries[start:start + REBUILD_SLICE_ENTRIES])
            if stores is None:
                pending.append(Status.BADMSG)
                finished_one(Status.OK)
                return
            reads = self._contested(log_id, stores)
            if not reads:
                self._write_copies(log_id, stores, outstanding, written, finished_one)
                next_slice(start, again)
                return

            def read(copies: list[HeldCopy]) -> None:
                self._write_copies(log_id, stores, outstanding, written, finished_one,
                                   copies)
                next_slice(start, again)
            # Some copies could outrank copies held here: their precedence first (a read).
            self.stats.precedence_reads += 1
            node.store.read_precedences(log_id, reads, read)

        def next_slice(start: int, again: Callable[[int, Any], None]) -> None:
            # ``again`` is passed on, never named here: see write_slice on reference cycles.
            following = start + REBUILD_SLICE_ENTRIES
            if self._closing and following < len(entries):
                pending.append(Status.SHUTDOWN)  # not all written: the donor sends it again
            if following >= len(entries) or self._closing:
                finished_one(Status.OK)
            else:
                loop.call_soon(again, following, again)

        write_slice(0, write_slice)

    def _contested(self, log_id: LogId, stores: list[Store]) -> list[tuple[int, int]]:
        """Where donor copies that could outrank a held copy meet one (no I/O)."""
        if all(copy_precedence(s.flags, s.wave) <= PRECEDENCE_LOWEST for s in stores):
            return []
        held = self._node.store.held_ranges(log_id, min(s.lsn for s in stores),
                                            max(s.last_lsn for s in stores))
        return contested(held, ((s.lsn, s.last_lsn, copy_precedence(s.flags, s.wave))
                                for s in stores)) if held else []

    def _write_copies(self, log_id: LogId, stores: list[Store], outstanding: list[int],
                      written: list[int], finished_one: Callable[[Status], None],
                      read: list[HeldCopy] | None = None) -> None:
        """Queue the parts of ``stores`` this node holds no copy of (in its index, or of equal
        or higher precedence queued for its writer: ``storage_node.core.rebuild_accept``);
        ``read``: the precedence of held copies read for them, where the index still
        resolves to those copies a donor's copy of higher precedence replaces them."""
        if not stores:
            return
        node = self._node
        machine = node.machine
        trim_lsn = machine.trim_lsn(log_id)
        first_lsn = min(s.lsn for s in stores)
        last_lsn = max(s.last_lsn for s in stores)
        # One index lookup and one pass over the writer's queue per slice, not per entry.
        held_all = node.store.held_ranges(log_id, first_lsn, last_lsn)
        held_firsts = [lo for lo, _ in held_all]
        damaged_all = node.store.authority.damaged_ranges(log_id, first_lsn, last_lsn)
        queued = node.store.queued_copies(log_id, first_lsn, last_lsn)
        # Where the index resolves the copies read to now (only their LSNs: no I/O).
        current = [now for first, last, _, _ in read or ()
                   for now in node.store.indexed_copies(log_id, Lsn(first), Lsn(last))]
        for store in stores:
            self.stats.records_received += store.records_count
            held: list[tuple[Lsn, Lsn]] = []
            at = max(0, bisect.bisect_right(held_firsts, store.lsn) - 1)
            while at < len(held_all) and held_all[at][0] <= store.last_lsn:
                held.append(held_all[at])
                at += 1
            if damaged_all:
                held = _without(held, damaged_all)  # its own copies there are bad: replaced
            if read and held:
                beaten = outranked(read, current, copy_precedence(store.flags, store.wave))
                if beaten:
                    kept = _without(held, tuple(beaten))  # lower precedence: replaced
                    self.stats.copies_outranked += _width(held) - _width(kept)
                    held = kept
            winners = queued_winners(
                ((a, b, p) for a, b, p in queued if a <= store.last_lsn and b >= store.lsn),
                copy_precedence(store.flags, store.wave)) if queued else []
            if store.flags & RecordFlags.WRITTEN_BY_RECOVERY:
                # As if this node had received the recovery's own STORE: a late one of an
                # earlier attempt is then preempted here too.
                machine.note_recovery_wave(log_id, store.wave)
            for first, last in rebuild_pieces(held, winners, max(store.lsn, trim_lsn + 1),
                                              store.last_lsn):
                piece = narrowed(store, first, last)
                if isinstance(piece, Status):
                    continue
                outstanding[0] += 1
                status = node.store.submit_store(
                    piece, _persisted(machine, piece, written, finished_one), inline_ok=False)
                if status is not Status.OK:
                    finished_one(status)

    def _accepts(self, shard_id: str, generation: int) -> bool:
        """Copies for the rebuild of this node's own disk of ``generation``, or for the drain
        of another node (as this node last read the cluster state)."""
        if shard_id == self._me:
            return generation == self.generation
        shard = self.state.shard(shard_id)
        return (shard is not None and shard.status is ShardStatus.DRAINING
                and shard.rebuild_generation == generation)

    def status_json(self) -> dict[str, Any]:
        return {"shards": cs.as_json(self.state), "node": self._me,
                "generation": self.generation,
                "donating": sorted(self._donations)}

    def metrics(self) -> dict[str, int]:
        stats = self.stats
        remaining = planning = 0
        for donation in self._donations.values():
            if donation.core is not None:
                progress = donation.core.progress
                remaining += max(0, progress.bytes_total - progress.bytes)
                planning += donation.core.planning
        mine = self.state.shard(self._me)
        return {
            "rebuild_chunks_sent": stats.chunks_sent, "rebuild_records_sent": stats.records_sent,
            "rebuild_bytes_sent": stats.bytes_sent,
            "rebuild_chunks_received": stats.chunks_received,
            "rebuild_records_received": stats.records_received,
            "rebuild_records_written": stats.records_written,
            "rebuild_send_failures": stats.send_failures,
            "rebuild_donations_active": len(self._donations),
            # Donations still waiting for the sequencers' tails to be released.
            "rebuild_donations_planning": planning,
            "rebuild_donor_bytes_remaining_estimate": remaining,
            "rebuild_finished": stats.rebuilds_finished,
            "rebuild_mini_started": stats.mini_rebuilds_started,
            "rebuild_mini_finished": stats.mini_rebuilds_finished,
            "rebuild_precedence_reads": stats.precedence_reads,
            "rebuild_copies_outranked": stats.copies_outranked,
            "rebuild_shard_rebuilding": int(mine is not None
                                            and mine.status is ShardStatus.REBUILDING),
            # A mini-rebuild of this node's damaged ranges under way, and how many ranges.
            "rebuild_shard_mini_rebuilding": int(mine is not None and mine.mini
                                                 and mine.status is ShardStatus.REBUILDING),
            "rebuild_shard_dirty_ranges": (_ranges_count(mine.dirty) if mine is not None
                                           and mine.status is ShardStatus.REBUILDING else 0),
            "rebuild_generation": self.generation,
        }


def _ranges_count(dirty: DirtyRanges) -> int:
    return sum(len(ranges) for _, ranges in dirty)


def _undone(progress: DonorProgress) -> DonorProgress:
    return DonorProgress(progress.log_id, progress.next_lsn, progress.records, progress.bytes,
                         progress.bytes_total, False, progress.updated_ms)


def _persisted(machine: Any, store: Store, written: list[int],
               finished_one: Callable[[Status], None]) -> Callable[[Status], None]:
    def done(status: Status) -> None:
        if status is Status.OK:
            machine.on_persisted(store)
            written[0] += store.records_count
        finished_one(status)
    return done


def _frame_ok(message: RebuildStore) -> bool:
    return (type(message.entries) is tuple and len(message.entries) <= REBUILD_ENTRIES_MAX
            and type(message.log_id) is int and 0 < message.log_id < 2**62)


def _decoded(message: RebuildStore) -> list[Store] | None:
    """The message's copies, each checked as a STORE is; None if any is not valid."""
    if not _frame_ok(message):
        return None
    return _decoded_entries(LogId(message.log_id), message.entries)


def _decoded_entries(log_id: LogId, entries: tuple[bytes, ...]) -> list[Store] | None:
    stores: list[Store] = []
    for entry in entries:
        if type(entry) is not bytes:
            return None
        store = decode_store_fields(entry)
        if isinstance(store, Status) or store.log_id != log_id or (
                store.validate() is not Status.OK
                or store_fields_status(store) is not Status.OK):
            return None
        stores.append(store)
    return stores


def _width(ranges: list[tuple[Lsn, Lsn]]) -> int:
    return sum(last - first + 1 for first, last in ranges)


def _without(held: list[tuple[Lsn, Lsn]], damaged: tuple[tuple[int, int], ...]
             ) -> list[tuple[Lsn, Lsn]]:
    """``held`` less the ``damaged`` ranges (both sorted)."""
    kept: list[tuple[Lsn, Lsn]] = []
    for lo, hi in held:
        for first, last in outside(damaged, lo, hi):
            kept.append((Lsn(first), Lsn(last)))
    return kept

