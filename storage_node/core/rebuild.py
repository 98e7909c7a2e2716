"""Rebuilding, the donor's side, pure (no I/O, no clock: ``now_ms`` in, effects out).

When a shard loses its copies (a replaced or damaged disk; ``shared.cluster_state`` says
REBUILDING), every other storage node is a donor: it walks its logs in id order and LSN
order, and sends each copy that may have been on the lost shard back to it, exactly as it is
stored (same payload, wave, flags, copyset, timestamp, producer tags: the LSN's identity does
not change), so that every record has its R copies again. The driver
(``storage_node.rebuild_runtime``) reads chunks, sends them, and saves checkpoints in the
cluster state, so a donor that restarts resumes where its last checkpoint says.

Which copies: a copy whose copyset names the lost shard, or that has no copyset (copies written
by recovery carry none) is always sent. A copy whose copyset does not name the shard may still
be one of the record's R counted copies: an appender whose first wave timed out counts the
nodes that stored in it ("amends") in a later wave whose copyset they never learn, so a
surviving copy's copyset can name a wave the lost shard was not in while the lost copy was
counted. Unless ``by_copyset`` is set, every copy is therefore sent (the shard ends up holding
every record of every log, each sent by each of its holders); with ``by_copyset`` only the
copies that name the shard are, which is exact only for records whose copies all came from
their last wave.

The rate limit is a token bucket in bytes per second (``TokenBucket``), taken before each chunk
is sent, so that a rebuild leaves the disks and the network to appends. Chunks are small
(``chunk_bytes_max``): the rebuilt node writes each in a group commit shared with appends'
STOREs, and an 8 MiB chunk there held those appends behind it (p50 append latency 8 -> 27 ms
during a rebuild limited to 8 MB/s per donor; 512 KiB chunks: see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shared.cluster_state import DonorProgress
from shared.compression import expand_stored
from shared.status import Status
from shared.types import LSN_MAX, Lsn
from shared.wire.rebuild import REBUILD_BYTES_MAX, REBUILD_ENTRIES_MAX
from shared.wire.store import Store, payloads_checksum

READ_RECORDS_MAX = 2048
"""Records one read of the donor's store covers at most."""
SEND_RETRY_MS_MIN = 200
SEND_RETRY_MS_MAX = 5_000


class TokenBucket:
    """``rate_bytes_per_s`` on average, bursts up to ``burst_bytes``; 0 is unlimited. A take
    bigger than the tokens left is allowed once the bucket is positive and leaves a debt, so
    a chunk larger than the burst still goes (and the next waits longer)."""

    def __init__(self, rate_bytes_per_s: int, burst_bytes: int, now_ms: int) -> None:
        assert rate_bytes_per_s >= 0 and burst_bytes > 0
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes
        self._tokens = float(burst_bytes)
        self._at_ms = now_ms

    def delay_ms(self, now_ms: int, size_bytes: int) -> int:
        """0 and the bytes are taken, or how long to wait before asking again."""
        if self.rate_bytes_per_s == 0:
            return 0
        elapsed_ms = max(0, now_ms - self._at_ms)
        self._at_ms = max(self._at_ms, now_ms)
        self._tokens = min(float(self.burst_bytes),
                           self._tokens + elapsed_ms * self.rate_bytes_per_s / 1000)
        if self._tokens > 0:
            self._tokens -= size_bytes
            return 0
        return int(-self._tokens * 1000 / self.rate_bytes_per_s) + 1


def wanted(copyset: tuple[str, ...], shard: str, *, by_copyset: bool) -> bool:
    """Whether a copy with ``copyset`` is sent to the lost ``shard`` (module docstring)."""
    return not by_copyset or not copyset or shard in copyset


def narrowed(store: Store, first_lsn: int, last_lsn: int) -> Store | Status:
    """``store`` cut to its records ``first_lsn..last_lsn`` (the part a donor's index still
    resolves to it), same wave, flags, copyset and timestamp; a compressed batch is expanded
    (as recovery's copies are). BADMSG if the blob does not expand."""
    if first_lsn == store.lsn and last_lsn == store.last_lsn:
        return store
    payloads = store.payloads
    if store.compression:
        expanded = expand_stored(store.payloads[0], store.compression, store.records)
        if isinstance(expanded, Status):
            return Status.BADMSG
        payloads = expanded
    sliced = tuple(payloads[first_lsn - store.lsn:last_lsn - store.lsn + 1])
    producers = tuple(tag for tag in store.producers
                      if tag[2] <= last_lsn and tag[3] >= first_lsn)
    return dataclasses.replace(store, lsn=Lsn(first_lsn), payloads=sliced,
                               checksum=payloads_checksum(sliced), producers=producers,
                               compression=0, records=0)


@dataclass(frozen=True, slots=True)
class Piece:
    """A part of a donor's stored entry the index resolves to: its copyset and the packed
    STORE fields of exactly those records."""

    first_lsn: int
    last_lsn: int
    copyset: tuple[str, ...]
    body: bytes
    payload_bytes: int


# ---- effects --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadChunk:
    log_id: int
    from_lsn: int
    until_lsn: int


@dataclass(frozen=True, slots=True)
class SendChunk:
    log_id: int
    entries: tuple[bytes, ...]
    records: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Sleep:
    until_ms: int


@dataclass(frozen=True, slots=True)
class SaveCheckpoint:
    progress: DonorProgress


@dataclass(frozen=True, slots=True)
class Finished:
    progress: DonorProgress


Effect = ReadChunk | SendChunk | Sleep | SaveCheckpoint | Finished


class DonorCore:
    """One donor's walk for one lost shard. ``logs``: (log id, last LSN held when the walk
    reaches it is decided by the driver; here the bound given) in any order; copies appended
    after that bound reach the shard from their sequencer (it is alive again). Call ``next``
    whenever the driver is idle and carry out the effect; feed back ``on_read``/``on_sent``/
    ``on_checkpointed``."""

    def __init__(self, *, shard: str, logs: list[tuple[int, int]], progress: DonorProgress,
                 bucket: TokenBucket, by_copyset: bool, checkpoint_interval_ms: int,
                 now_ms: int, chunk_bytes_max: int = REBUILD_BYTES_MAX) -> None:
        self.shard = shard
        self._chunk_bytes_max = min(chunk_bytes_max, REBUILD_BYTES_MAX)
        self.progress = progress
        self._by_copyset = by_copyset
        self._bucket = bucket
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._saved_ms = now_ms
        self._logs = sorted((log_id, until) for log_id, until in logs
                            if log_id >= progress.log_id)
        self._index = 0
        self._from_lsn = 1
        if self._logs and self._logs[0][0] == progress.log_id:
            self._from_lsn = max(1, progress.next_lsn)
        self._pending: SendChunk | None = None
        self._pending_next_lsn = 0
        self._reading = self._sending = self._saving = False
        self._retry_at_ms = 0
        self._retry_ms = SEND_RETRY_MS_MIN
        self._dirty = False
        self.sends_failed = 0

    @property
    def busy(self) -> bool:
        return self._reading or self._sending or self._saving

    def next(self, now_ms: int) -> Effect | None:
        """The next thing to do, or None while an effect is under way."""
        if self.busy:
            return None
        if self.progress.done:
            return None
        if self._dirty and (now_ms - self._saved_ms >= self._checkpoint_interval_ms
                            or (self._pending is None and self._index >= len(self._logs))):
            self._saving = True
            return SaveCheckpoint(self.progress)
        if self._pending is not None:
            if now_ms < self._retry_at_ms:
                return Sleep(self._retry_at_ms)
            delay_ms = self._bucket.delay_ms(now_ms, self._pending.bytes)
            if delay_ms:
                # Taken again when the wait is over (delay_ms took nothing).
                return Sleep(now_ms + delay_ms)
            self._sending = True
            return self._pending
        if self._index >= len(self._logs):
            self.progress = dataclasses.replace(self.progress, done=True, updated_ms=now_ms)
            return Finished(self.progress)
        log_id, until_lsn = self._logs[self._index]
        if self._from_lsn > until_lsn:
            self._advance_log(now_ms)
            return self.next(now_ms)
        self._reading = True
        return ReadChunk(log_id, self._from_lsn, until_lsn)

    def on_read(self, pieces: list[Piece], next_lsn: int, now_ms: int) -> None:
        """What the store holds of the chunk asked for, up to (not including) ``next_lsn``."""
        assert self._reading
        self._reading = False
        log_id, until_lsn = self._logs[self._index]
        entries: list[bytes] = []
        records = size = 0
        for piece in pieces:
            if not wanted(piece.copyset, self.shard, by_copyset=self._by_copyset):
                continue
            if entries and (len(entries) >= REBUILD_ENTRIES_MAX
                            or size + len(piece.body) > self._chunk_bytes_max):
                next_lsn = piece.first_lsn  # the rest is read again next time
                break
            entries.append(piece.body)
            records += piece.last_lsn - piece.first_lsn + 1
            size += len(piece.body)
        next_lsn = max(next_lsn, self._from_lsn)
        if not entries:
            self._moved_to(log_id, next_lsn, until_lsn, 0, 0, now_ms)
            return
        self._pending = SendChunk(log_id, tuple(entries), records, size)
        self._pending_next_lsn = next_lsn

    def on_sent(self, status: Status, now_ms: int) -> None:
        assert self._sending and self._pending is not None
        self._sending = False
        if status is not Status.OK:
            self.sends_failed += 1
            self._retry_at_ms = now_ms + self._retry_ms
            self._retry_ms = min(self._retry_ms * 2, SEND_RETRY_MS_MAX)
            return
        self._retry_ms = SEND_RETRY_MS_MIN
        chunk, self._pending = self._pending, None
        log_id, until_lsn = self._logs[self._index]
        self._moved_to(log_id, self._pending_next_lsn, until_lsn, chunk.records, chunk.bytes,
                       now_ms)

    def on_checkpointed(self, ok: bool, now_ms: int) -> None:
        assert self._saving
        self._saving = False
        if ok:
            self._saved_ms = now_ms
            self._dirty = False
        else:
            self._saved_ms = now_ms  # try again after an interval

    def _moved_to(self, log_id: int, next_lsn: int, until_lsn: int, records: int,
                  size: int, now_ms: int) -> None:
        self._from_lsn = next_lsn
        self.progress = dataclasses.replace(
            self.progress, log_id=log_id, next_lsn=min(next_lsn, LSN_MAX),
            records=self.progress.records + records, bytes=self.progress.bytes + size,
            updated_ms=now_ms)
        self._dirty = True
        if next_lsn > until_lsn:
            self._advance_log(now_ms)

    def _advance_log(self, now_ms: int) -> None:
        self._index += 1
        self._from_lsn = 1
        if self._index < len(self._logs):
            self.progress = dataclasses.replace(
                self.progress, log_id=self._logs[self._index][0], next_lsn=1,
                updated_ms=now_ms)
            self._dirty = True
