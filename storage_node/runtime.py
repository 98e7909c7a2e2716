"""The storage node's asyncio driver: wires the pure ``StoreMachine`` to the ``RecordStore``.

``on_message`` is the transport's MessageHandler entry point. It runs synchronously on the
event loop and never blocks: a STORE is decided by the core and queued for the group-commit
writer (``reply`` is called once it is durable, or at once with an error status); a RELEASE
updates the pointer (persisted with the next batch); a READ runs in a read thread; a
GET_LOG_STATE is answered at once.

Lifecycle: ``start()`` (recover from disk) -> messages -> ``close()`` (drain and fsync).
Messages before ``start`` get NOTREADY, after ``close`` SHUTDOWN.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from shared.config import StorageConfig
from shared.status import Status
from shared.types import EPOCH_INVALID, LSN_INVALID, Epoch, LogId, Lsn, NodeId
from shared.wire.codec import Message
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.release import Release
from shared.wire.store import Store
from storage_node.core.store_machine import (
    LogStorageState,
    StoreMachine,
    read_fields_status,
    stored_reply,
)
from storage_node.record_store import RecordStore
from storage_node.segment_format import SealEntry

log = logging.getLogger(__name__)

ReplyFn = Callable[[Message], None]
READS_INFLIGHT_MAX = 256
"""READs being served at once; more are answered OVERLOADED."""
_STORE_REPLIES = ("OK", "PREEMPTED", "BADMSG", "CHECKSUM_MISMATCH", "DISABLED", "NOSPC",
                  "OVERLOADED", "NOTREADY", "SHUTDOWN", "INTERNAL")
COUNTERS = (
    "store_messages", "release_messages", "read_messages", "seals", "unexpected_messages",
    *(f"stored_{name.lower()}" for name in _STORE_REPLIES),
    *(f"read_{name.lower()}" for name in ("BADMSG", "OVERLOADED", "NOTREADY", "SHUTDOWN")),
)
"""Always present in ``stats()`` besides the record store's counters."""


class StorageNode:
    """One storage node: per-log seals and release pointers plus the durable record store."""

    def __init__(self, *, node_id: NodeId, data_dir: str, config: StorageConfig) -> None:
        self.node_id = node_id
        self._machine = StoreMachine(accept_writes=config.accept_writes)
        self._store = RecordStore(data_dir=data_dir, config=config)
        self._reads: set[asyncio.Task[None]] = set()
        self._started = self._closing = False
        self._counts: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self._handlers: dict[type[Any], Callable[[Any, ReplyFn], None]] = {
            Store: self._on_store,
            Release: self._on_release,
            Read: self._on_read,
            GetLogState: self._on_get_log_state,
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

    async def close(self) -> None:
        """Answer running reads, drain the writer, fsync and close files."""
        if self._closing:
            return
        self._closing = True
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
        handler(message, reply)

    async def seal(self, log_id: LogId, epoch: Epoch, sealed_by: NodeId) -> Status:
        """Durably seal ``log_id`` up to ``epoch``: afterwards every STORE of an epoch <= it
        is PREEMPTED. Returns OK once the seal is durable (also when it already was at
        ``epoch``); PREEMPTED when a higher seal exists (see ``log_state``); INVALID_PARAM;
        or the record store's failure (OVERLOADED, NOSPC, DISABLED, SHUTDOWN, NOTREADY)."""
        if not self._started or self._closing:
            return Status.SHUTDOWN if self._closing else Status.NOTREADY
        status = self._machine.seal(log_id, epoch, sealed_by)
        if status not in (Status.OK, Status.UPTODATE):
            return status
        # Written even when UPTODATE: the earlier identical seal may still be queued, and
        # the FIFO writer makes this one durable only after it.
        done: asyncio.Future[Status] = asyncio.get_running_loop().create_future()

        def persisted(result: Status) -> None:
            if not done.done():
                done.set_result(result)

        status = self._store.submit_seal(SealEntry(log_id, epoch, sealed_by), persisted)
        if status != Status.OK:
            return status
        self._counts["seals"] += 1
        return await done

    def log_state(self, log_id: LogId) -> LogStorageState:
        return self._machine.state(log_id)

    def stats(self) -> dict[str, int]:
        counts = self._store.stats()
        counts.update(self._counts)
        counts["reads_inflight"] = len(self._reads)
        return counts

    # ---- handlers ----

    def _on_store(self, store: Store, reply: ReplyFn) -> None:
        self._counts["store_messages"] += 1
        if not self._started or self._closing:
            self._reply_store(reply, store, Status.SHUTDOWN if self._closing
                              else Status.NOTREADY)
            return
        decision = self._machine.on_store(store, disk_low=self._store.disk_low)
        if decision.release_lsn is not None:
            self._store.note_release(store.log_id, decision.release_lsn)
        if decision.reply is not None:
            self._counts[f"stored_{decision.status.name.lower()}"] += 1
            reply(decision.reply)
            return

        def persisted(status: Status) -> None:
            if status != Status.OK:
                self._reply_store(reply, store, status)
                return
            self._counts["stored_ok"] += 1
            reply(self._machine.on_persisted(store))

        status = self._store.submit_store(store, persisted)
        if status != Status.OK:
            self._reply_store(reply, store, status)

    def _reply_store(self, reply: ReplyFn, store: Store, status: Status) -> None:
        self._counts[f"stored_{status.name.lower()}"] += 1
        reply(stored_reply(store, status))

    def _on_release(self, release: Release, reply: ReplyFn) -> None:
        self._counts["release_messages"] += 1
        if not self._started or self._closing:
            return
        release_lsn = self._machine.on_release(release)
        if release_lsn is not None:
            self._store.note_release(release.log_id, release_lsn)

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
        task = asyncio.get_running_loop().create_task(self._serve_read(read, reply))
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    async def _serve_read(self, read: Read, reply: ReplyFn) -> None:
        until_lsn = self._machine.readable_until(read)
        release_lsn = Lsn(max(self._machine.release_lsn(read.log_id), read.release_lsn))
        try:
            result = await self._store.read(read.log_id, read.from_lsn, until_lsn,
                                            read.records_max, read.bytes_max)
            answer = ReadReply(status=result.status, log_id=read.log_id,
                               release_lsn=release_lsn, records=result.records,
                               next_lsn=result.next_lsn)
        except Exception:
            log.exception("storage node %s: read of log %d failed", self.node_id, read.log_id)
            answer = ReadReply(status=Status.INTERNAL, log_id=read.log_id,
                               release_lsn=release_lsn, records=(), next_lsn=read.from_lsn)
        reply(answer)

    def _on_get_log_state(self, message: GetLogState, reply: ReplyFn) -> None:
        if not self._started or self._closing:
            status = Status.SHUTDOWN if self._closing else Status.NOTREADY
            reply(LogState(status=status, log_id=message.log_id, release_lsn=LSN_INVALID,
                           sealed_epoch=EPOCH_INVALID, last_lsn=LSN_INVALID))
            return
        reply(self._machine.on_get_log_state(message))
