"""The storage node's asyncio driver: wires the pure ``StoreMachine`` to the ``RecordStore``.

``on_message`` is the transport's MessageHandler entry point. It runs synchronously on the
event loop and never blocks: a STORE is decided by the core and queued for the group-commit
writer (``reply`` is called once it is durable, or at once with an error status); a RELEASE
updates the pointer (persisted with the next batch); a READ runs in a read thread; a
GET_LOG_STATE is answered at once.

Retention: a background task runs ``retention_pass()`` every ``retention_interval_ms``: it
trims every log with a backlog (``BacklogTable``) up to its records older than the backlog
(the pure ``plan_age_trims``), writing the same durable TRIM entry a TRIM message writes, then
has the record store reclaim disk (delete and compact segments).

Lifecycle: ``start()`` (recover from disk) -> messages -> ``close()`` (drain and fsync).
Messages before ``start`` get NOTREADY, after ``close`` SHUTDOWN.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.config import StorageConfig
from shared.limits import PRODUCER_ID_BYTES_MAX
from shared.status import Status
from shared.types import (
    LSN_INVALID,
    LogId,
    Lsn,
    NodeId,
    log_id_valid,
)
from shared.wire.codec import Message
from shared.wire.producer import GetProducer, ProducerEntry, ProducerState
from shared.wire.read import GetLogState, Read, ReadReply
from shared.wire.recovery import Clean, GetDigest, Seal
from shared.wire.release import Release
from shared.wire.store import RecordFlags, Store
from shared.wire.store_batch import ReleaseBatch, StoreBatch
from shared.wire.trim import FindTime, FoundTime, Trim
from storage_node.core.authority import annotated_reply
from storage_node.core.retention import BacklogTable, plan_age_trims
from storage_node.core.store_machine import (
    LSN_READABLE_MAX,
    LogStorageState,
    StoreMachine,
    read_fields_status,
)
from storage_node.handlers import StorageHandlers
from storage_node.record_reads import CopiesResult, ReadResult
from storage_node.record_store import ReclaimReport, RecordStore
from storage_node.segment_format import TrimEntry

log = logging.getLogger(__name__)

ReplyFn = Callable[[Message], None]
READS_INFLIGHT_MAX = 256
"""READs being served at once; more are answered OVERLOADED."""
READ_WAITERS_MAX = 4096
"""Long-poll READs held at once; past this a READ is answered at once, as if it had no wait
(the reader just asks again), so that idle tailing readers cannot pin unbounded memory."""
READ_RELEASE_WAIT_MS = 1_000
"""How long a READ is held at most when it carries a release pointer above this node's and
the node holds a copy in between that its own pointer does not release yet (the READ would be
answered short): the sequencer's RELEASE (within ``release_delay_ms`` of the acknowledgement)
or its periodic broadcast (``release_broadcast_interval_ms``) normally comes first, and a
reader right after an acknowledged append then reads it. Then what is released here is
served."""
_STORE_REPLIES = ("OK", "PREEMPTED", "BADMSG", "CHECKSUM_MISMATCH", "DISABLED", "NOSPC",
                  "OVERLOADED", "NOTREADY", "SHUTDOWN", "INTERNAL")
COUNTERS = (
    "store_messages", "store_batches", "release_messages", "read_messages", "seals",
    "unexpected_messages",
    "digests", "cleans", "purged_records", "retention_passes", "retention_trims",
    "producer_lookups", "stores_joined",
    *(f"stored_{name.lower()}" for name in _STORE_REPLIES),
    *(f"read_{name.lower()}" for name in ("BADMSG", "OVERLOADED", "NOTREADY", "SHUTDOWN")),
)
"""Always present in ``stats()`` besides the record store's counters."""


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one retention pass did."""

    trims: list[tuple[LogId, Lsn]]
    """(log, new trim point) raised by age."""
    reclaim: ReclaimReport


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _read_answer(read: Read, result: ReadResult, release_lsn: Lsn, trim_lsn: Lsn) -> ReadReply:
    return ReadReply(status=result.status, log_id=read.log_id, release_lsn=release_lsn,
                     records=result.records, next_lsn=Lsn(max(result.next_lsn, read.from_lsn)),
                     markers=result.markers, trim_lsn=trim_lsn, blocks=result.blocks)


class _Waiter:
    """A long-poll READ held until the node's release pointer passes its ``from_lsn``."""

    __slots__ = ("read", "reply", "timer")

    def __init__(self, read: Read, reply: ReplyFn) -> None:
        self.read = read
        self.reply = reply
        self.timer: asyncio.TimerHandle | None = None


class _NodePorts:
    """``StoragePorts`` of a node: its record store's own methods where they fit as they
    are (no hop per STORE), the node's for the rest."""

    __slots__ = (
        "_node",
        "durable_release_lsn",
        "held_ranges",
        "not_serving",
        "note_release",
        "read_copies",
        "submit_clean_mark",
        "submit_seal",
        "submit_store",
    )

    def __init__(self, node: StorageNode) -> None:
        self._node = node
        store = node.store
        self.submit_store = store.submit_store
        self.submit_seal = store.submit_seal
        self.submit_clean_mark = store.submit_clean_mark
        self.durable_release_lsn = store.durable_release_lsn
        self.held_ranges = store.held_ranges
        self.not_serving = node.not_serving
        self.note_release = node.note_release
        self.read_copies = node.read_copies

    @property
    def disk_low(self) -> bool:
        return self._node.store.disk_low


class StorageNode:
    """One storage node: per-log seals and release pointers plus the durable record store."""

    def __init__(self, *, node_id: NodeId, data_dir: str, config: StorageConfig,
                 backlogs: BacklogTable | None = None,
                 wall_ms: Callable[[], int] = _wall_ms) -> None:
        self.node_id = node_id
        self._config = config
        self._backlogs = backlogs or BacklogTable(0)
        self._wall_ms = wall_ms
        """Wall clock, the one record timestamps come from (tests move it)."""
        self._machine = StoreMachine(accept_writes=config.accept_writes)
        self._store = RecordStore(data_dir=data_dir, config=config)
        self._retention_task: asyncio.Task[None] | None = None
        self._retention_lock = asyncio.Lock()
        self._reads: set[asyncio.Task[None]] = set()
        self._waiters: dict[LogId, dict[_Waiter, None]] = {}
        self._waiters_count = 0
        self._started = self._closing = False
        self._counts: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self._core = StorageHandlers(self._machine, _NodePorts(self), self._counts)
        """STORE, RELEASE, GET_LOG_STATE and epoch recovery (``storage_node.handlers``,
        shared with the deterministic simulation)."""
        core = self._core
        self._handlers: dict[type[Any], Callable[[Any, ReplyFn], None]] = {
            Store: core.on_store,
            StoreBatch: core.on_store_batch,
            ReleaseBatch: core.on_release_batch,
            Release: core.on_release,
            Read: self._on_read,
            GetLogState: core.on_get_log_state,
            Seal: core.on_seal,
            GetDigest: core.on_get_digest,
            Clean: core.on_clean,
            Trim: self._on_trim,
            FindTime: self._on_find_time,
            GetProducer: self._on_get_producer,
        }

    async def start(self) -> None:
        """Open the record store (scan, cut a torn tail, rebuild index, release pointers and
        seals) and start its writer. Raises LogError(EXISTS) if another process holds the
        data directory."""
        assert not self._started
        states = await self._store.open()
        for log_id, state in states.items():
            self._machine.restore(log_id, state)
        self._started = True
        self._retention_task = asyncio.get_running_loop().create_task(
            self._run_retention(), name=f"seqlog-retention-{self.node_id}")

    async def close(self) -> None:
        """Answer running reads, drain the writer, fsync and close files."""
        if self._closing:
            return
        self._closing = True
        if self._retention_task is not None:
            self._retention_task.cancel()
            await asyncio.gather(self._retention_task, return_exceptions=True)
        for log_id in list(self._waiters):
            for waiter in list(self._waiters.get(log_id, ())):
                self._wake(waiter)
        if self._reads:
            await asyncio.gather(*self._reads, return_exceptions=True)
        await self._store.close()

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        handler = self._handlers.get(type(message))
        if handler is None:
            self._counts["unexpected_messages"] += 1
            log.warning("storage node %s: unexpected %s from %s", self.node_id,
                        type(message).__name__, peer)
            return
        if self._store.authority.damaged:
            # The answer says which of what was asked this node cannot vouch for.
            reply = annotated_reply(self._store.authority, message, reply)
        handler(message, reply)

    def add_handler(self, message_type: type[Any],
                    handler: Callable[[Any, ReplyFn], None]) -> None:
        """Serve ``message_type`` with ``handler`` (rebuilding's REBUILD_STORE)."""
        self._handlers[message_type] = handler

    @property
    def accepts_writes(self) -> bool:
        """Whether the configuration lets this node take copies (``accept_writes``)."""
        return self._config.accept_writes

    @property
    def machine(self) -> StoreMachine:
        return self._machine

    @property
    def core(self) -> StorageHandlers:
        return self._core

    def log_state(self, log_id: LogId) -> LogStorageState:
        return self._machine.state(log_id)

    def log_ids(self) -> list[LogId]:
        return self._machine.log_ids()

    @property
    def store(self) -> RecordStore:
        return self._store

    def stats(self) -> dict[str, int]:
        counts = self._store.stats()
        counts.update(self._counts)
        counts["reads_inflight"] = len(self._reads)
        counts["reads_waiting"] = self._waiters_count
        return counts

    # ---- retention ----

    async def retention_pass(self) -> RetentionReport:
        """Trim by age, then reclaim disk; one at a time."""
        async with self._retention_lock:
            if not self._started or self._closing:
                return RetentionReport([], ReclaimReport())
            self._counts["retention_passes"] += 1
            trims = plan_age_trims(
                self._machine.log_ids(), now_ms=self._wall_ms(), backlogs=self._backlogs,
                release_lsn=self._machine.release_lsn, trim_lsn=self._store.durable_trim_lsn,
                last_older_lsn=self._store.last_older_lsn)
            written = await self._write_age_trims(trims)
            return RetentionReport(written, await self._store.reclaim())

    async def _write_age_trims(self, trims: list[tuple[LogId, Lsn]]) -> list[tuple[LogId, Lsn]]:
        """Raise each trim point as a TRIM message would, and wait until the entries are
        written (reclaim then finds the trimmed records gone from the index). A trim that
        could not be queued is decided again by the next pass."""
        if not trims:
            return []
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[Status]] = []
        written: list[tuple[LogId, Lsn]] = []
        for log_id, trim_lsn in trims:
            self._machine.trim(Trim(log_id=log_id, trim_lsn=trim_lsn))
            future: asyncio.Future[Status] = loop.create_future()
            status = self._store.submit_trim(
                TrimEntry(log_id, self._machine.trim_lsn(log_id)), future.set_result)
            if status is Status.OK:
                pending.append(future)
                written.append((log_id, trim_lsn))
        results = await asyncio.gather(*pending)
        done = [trim for trim, result in zip(written, results, strict=True)
                if result is Status.OK]
        self._counts["retention_trims"] += len(done)
        return done

    async def _run_retention(self) -> None:
        interval_s = self._config.retention_interval_ms / 1000
        while not self._closing:
            await asyncio.sleep(interval_s)
            try:
                report = await self.retention_pass()
            except Exception:
                # A failed pass (an I/O error) must not end retention; the next one retries.
                log.exception("storage node %s: retention pass failed", self.node_id)
                continue
            if report.trims or report.reclaim.segments_deleted or (
                    report.reclaim.segments_compacted):
                log.info("storage node %s: retention trimmed %d logs, deleted %d segments "
                         "(%d bytes), compacted %d (%d bytes freed)", self.node_id,
                         len(report.trims), report.reclaim.segments_deleted,
                         report.reclaim.bytes_deleted, report.reclaim.segments_compacted,
                         report.reclaim.bytes_compacted)

    # ---- handlers ----

    def _on_read(self, read: Read, reply: ReplyFn) -> None:
        self._counts["read_messages"] += 1
        status = read_fields_status(read)
        if status == Status.OK and (not self._started or self._closing):
            status = Status.SHUTDOWN if self._closing else Status.NOTREADY
        if status == Status.OK and len(self._reads) >= READS_INFLIGHT_MAX:
            status = Status.OVERLOADED
        if status != Status.OK:
            self._counts[f"read_{status.name.lower()}"] += 1
            reply(ReadReply(status=status, log_id=read.log_id, release_lsn=LSN_INVALID,
                            records=(), next_lsn=read.from_lsn))
            return
        if not self._readable(read) and self._waiters_count < READ_WAITERS_MAX:
            self._hold(read, reply)
            return
        self._start_read(read, reply)

    def _start_read(self, read: Read, reply: ReplyFn) -> None:
        if self._read_now(read, reply):
            return
        task = asyncio.get_running_loop().create_task(self._serve_read(read, reply))
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    # ---- long-poll READs ----

    def _readable(self, read: Read) -> bool:
        """Whether the node answers ``read`` now: it can serve all the READ's pointer says is
        released (no copy here waits for this node's own pointer), and, for a long poll,
        something at or after ``from_lsn`` (a released record, or the trim gap)."""
        until = self._readable_until(read)
        if until < min(read.until_lsn, read.release_lsn, LSN_READABLE_MAX):
            return False  # a copy here the reader was told is released: its RELEASE is due
        return read.wait_ms == 0 or until >= read.from_lsn or (
            self._machine.trim_lsn(read.log_id) >= read.from_lsn)

    def _readable_until(self, read: Read) -> Lsn:
        return self._machine.readable_until(read, self._store.first_copy_lsn)

    def _hold(self, read: Read, reply: ReplyFn) -> None:
        waiter = _Waiter(read, reply)
        # Waiting for a RELEASE that is due takes at most READ_RELEASE_WAIT_MS (then what is
        # released here is served); a long poll for new records takes its wait_ms.
        due = read.wait_ms == 0 or self._readable_until(read) >= read.from_lsn
        waiter.timer = asyncio.get_running_loop().call_later(
            (READ_RELEASE_WAIT_MS if due else read.wait_ms) / 1000, self._wake, waiter)
        self._waiters.setdefault(read.log_id, {})[waiter] = None
        self._waiters_count += 1

    def _wake(self, waiter: _Waiter) -> None:
        """Serve a held READ now (its release came, its wait ran out, or the node closes)."""
        held = self._waiters.get(waiter.read.log_id)
        if held is None or waiter not in held:
            return
        del held[waiter]
        if not held:
            del self._waiters[waiter.read.log_id]
        self._waiters_count -= 1
        if waiter.timer is not None:
            waiter.timer.cancel()
        self._start_read(waiter.read, waiter.reply)

    def _release_moved(self, log_id: LogId) -> None:
        held = self._waiters.get(log_id)
        if held:
            for waiter in [w for w in held if self._readable(w.read)]:
                self._wake(waiter)

    def _read_now(self, read: Read, reply: ReplyFn) -> bool:
        """Serve ``read`` at once if the record store can (a small read of what was just
        written: a tailing reader, often one just woken by a release); False if not."""
        until_lsn = self._readable_until(read)
        trim_lsn = self._machine.trim_lsn(read.log_id)
        from_lsn = Lsn(max(read.from_lsn, trim_lsn + 1))
        if self._bridge_below(read.log_id, from_lsn, trim_lsn) is not None:
            return False  # the bridge's copy is read too (``_serve_read``)
        try:
            result = self._store.read_now(read.log_id, from_lsn, until_lsn, read.records_max,
                                          read.bytes_max)
        except Exception:
            log.exception("storage node %s: read of log %d failed", self.node_id, read.log_id)
            return False  # the read thread tries again and answers INTERNAL if it fails too
        if result is None:
            return False
        reply(_read_answer(read, result, self._machine.release_lsn(read.log_id), trim_lsn))
        return True

    async def _serve_read(self, read: Read, reply: ReplyFn) -> None:
        until_lsn = self._readable_until(read)
        release_lsn = self._machine.release_lsn(read.log_id)
        trim_lsn = self._machine.trim_lsn(read.log_id)
        try:
            # Trimmed records are never served, even if still on disk.
            from_lsn = Lsn(max(read.from_lsn, trim_lsn + 1))
            result = await self._store.read(read.log_id, from_lsn, until_lsn,
                                            read.records_max, read.bytes_max)
            answer = _read_answer(read, result, release_lsn, trim_lsn)
            bridge = self._bridge_below(read.log_id, from_lsn, trim_lsn)
            if bridge is not None and from_lsn <= until_lsn:
                answer = await self._with_bridge(answer, bridge)
        except Exception:
            log.exception("storage node %s: read of log %d failed", self.node_id, read.log_id)
            answer = ReadReply(status=Status.INTERNAL, log_id=read.log_id,
                               release_lsn=release_lsn, records=(), next_lsn=read.from_lsn)
        reply(answer)

    def _bridge_below(self, log_id: LogId, from_lsn: Lsn, trim_lsn: Lsn) -> Lsn | None:
        bridge = self._store.bridge_below(log_id, from_lsn)
        return bridge if bridge is not None and bridge > trim_lsn else None

    async def _with_bridge(self, answer: ReadReply, bridge: Lsn) -> ReadReply:
        """``answer`` with the marker of the bridge that ends its epoch before its first LSN,
        if this node still holds a bridge there: a READ that starts past the bridge (a
        reader's chosen LSN, a producer lookup's check) would otherwise see nothing of it,
        and the merge could serve a stray copy that a node which missed recovery keeps
        behind it (``shared.read_merge``)."""
        found = await self._store.read_copies(answer.log_id, bridge, bridge, 1, 1 << 20)
        if found.status is not Status.OK or not found.copies:
            return answer
        lsn, _, _, _, flags, wave, _ = found.copies[0]
        if lsn != bridge or not flags & RecordFlags.BRIDGE:
            return answer
        return dataclasses.replace(answer, markers=((bridge, bridge, flags, wave),
                                                    *answer.markers))

    # ---- epoch recovery ----

    def not_serving(self) -> Status | None:
        if not self._started or self._closing:
            return Status.SHUTDOWN if self._closing else Status.NOTREADY
        return None

    def note_release(self, log_id: LogId, release_lsn: Lsn) -> None:
        self._store.note_release(log_id, release_lsn)
        self._release_moved(log_id)

    def read_copies(self, log_id: LogId, from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                    bytes_max: int, done: Callable[[CopiesResult], None]) -> Status:
        if len(self._reads) >= READS_INFLIGHT_MAX:
            return Status.OVERLOADED

        async def serve() -> None:
            try:
                result = await self._store.read_copies(log_id, from_lsn, until_lsn,
                                                       records_max, bytes_max)
            except Exception:
                log.exception("storage node %s: copies of log %d failed", self.node_id, log_id)
                result = CopiesResult(Status.INTERNAL, (), from_lsn)
            done(result)

        task = asyncio.get_running_loop().create_task(serve())
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)
        return Status.OK

    def _on_trim(self, trim: Trim, reply: ReplyFn) -> None:
        refused = self.not_serving()
        if refused is not None:
            reply(self._machine.trimmed(trim, refused))
            return
        status = self._machine.trim(trim)
        if status is Status.INVALID_PARAM:
            reply(self._machine.trimmed(trim, status))
            return
        # Written even when UPTODATE: an equal trim point may still be queued (FIFO).
        submitted = self._store.submit_trim(
            TrimEntry(trim.log_id, self._machine.trim_lsn(trim.log_id)),
            lambda result: reply(self._machine.trimmed(trim, result)))
        if submitted is not Status.OK:
            reply(self._machine.trimmed(trim, submitted))

    def _on_find_time(self, request: FindTime, reply: ReplyFn) -> None:
        status = self.not_serving() or Status.OK
        if status is Status.OK and (not log_id_valid(request.log_id)
                                    or not 0 <= request.timestamp_ms < 2**63):
            status = Status.BADMSG
        lsn = LSN_INVALID
        if status is Status.OK:
            found = self._store.find_time(request.log_id, request.timestamp_ms)
            if found is not None:
                # A trimmed record is not served: the first readable one comes after it.
                lsn = Lsn(max(found, self._machine.trim_lsn(request.log_id) + 1))
        reply(FoundTime(status=status, log_id=request.log_id, lsn=lsn))

    def _on_get_producer(self, request: GetProducer, reply: ReplyFn) -> None:
        status = self.not_serving() or Status.OK
        if status is Status.OK and (
                not log_id_valid(request.log_id) or not request.producer_id
                or len(request.producer_id) > PRODUCER_ID_BYTES_MAX):
            status = Status.BADMSG
        entries: tuple[ProducerEntry, ...] = ()
        if status is Status.OK:
            self._counts["producer_lookups"] += 1
            entries = self._store.producer_entries(request.log_id, request.producer_id)
        reply(ProducerState(status=status, log_id=request.log_id,
                            producer_id=request.producer_id, entries=entries))
