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

Which LSNs: every log's walk goes up to its sequencer's tail when the walk was planned, and
starts only once that tail is released (LogDevice's rebuilding planner does the same). An
append in flight when the shard lost its disk can still be acknowledged counting a STORED
that shard answered from its old disk (an amend from an earlier wave, or the current wave's
answer arriving late), so its other copies may reach the donors after the rebuild began; a
walk bounded by what the donor held when it began would pass before them, and the record
would keep fewer than R copies. So, before walking, the donor plans (``AskTails``): it asks
every sequencer node for the tails of all the logs it has active (only an active sequencer
acknowledges appends; a log the donor holds no copy of yet is planned too) and each of its
own logs' sequencer for its tail (the highest LSN it had handed out, in flight or not; or
"nothing in flight"), and asks again until the release pointer has passed that tail: every
append that could have counted the lost disk is then decided, and its copies on this donor
are durable and inside the walk. The plan is made after the shard was recorded REBUILDING,
so it covers everything in flight when the disk was lost. Logs whose copies reached the
donor meanwhile (their appends done before the sequencers were asked) are planned too: it
lists its logs again until the list stops growing (``ListLogs``).

The node being rebuilt (``target_step``) finishes once every donor is done, unless it found
damage after the rebuild began (a restart's scan, a read: copies the donors already sent may
be gone again): then the rebuild begins again, for a new generation.

The rate limit is a token bucket in bytes per second (``TokenBucket``), taken before each chunk
is sent, so that a rebuild leaves the disks and the network to appends; its burst is bounded
to ``BURST_MS`` of the rate, and so is a chunk, so the limit holds for small shards too.
Chunks are small
(``chunk_bytes_max``): the rebuilt node writes each in a group commit shared with appends'
STOREs, and an 8 MiB chunk there held those appends behind it (p50 append latency 8 -> 27 ms
during a rebuild limited to 8 MB/s per donor; 512 KiB chunks: see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shared.cluster_state import DirtyRanges, DonorProgress, ShardState, ShardStatus
from shared.compression import expand_stored
from shared.status import Status
from shared.types import LSN_MAX, Lsn
from shared.wire.rebuild import REBUILD_BYTES_MAX, REBUILD_ENTRIES_MAX
from shared.wire.store import Store, payloads_checksum
from storage_node.core.rebuild_scope import TargetStep as TargetStep
from storage_node.core.rebuild_scope import triples

READ_RECORDS_MAX = 2048
"""Records one read of the donor's store covers at most."""
SEND_RETRY_MS_MIN = 200
SEND_RETRY_MS_MAX = 5_000
TAIL_RETRY_MS_MIN = 20
"""First wait before asking a log's sequencer again (no answer, or its tail not yet
released); doubles up to ``TAIL_RETRY_MS_MAX``."""
TAIL_RETRY_MS_MAX = 1_000


BURST_MS = 100
"""The bucket holds at most this long's worth of the rate (and each chunk is at most that
big, ``TokenBucket.chunk_bytes_max``): the limit holds over any window, also for a shard
small enough that a burst of ``burst_bytes`` would have sent all of it at once."""
CHUNK_BYTES_MIN = 4096
"""A chunk is never cut below this (the frame's overhead), whatever the rate."""


class TokenBucket:
    """``rate_bytes_per_s`` on average, bursts up to ``burst_bytes`` but never more than
    ``BURST_MS`` worth of the rate; 0 is unlimited. A take bigger than the tokens left is
    allowed once the bucket is positive and leaves a debt, so a chunk larger than the burst
    still goes (and the next waits longer).

    Why the bound: the bucket starts full, and with the 1 MiB default burst at 40 KiB/s a
    small shard's whole 1 MB went out in 0.2 s (25 s of the rate at once), and a 512 KiB
    chunk taken into debt went out ahead of the limit too. Now at most ``BURST_MS`` of the
    rate goes early, plus one chunk, itself at most that much (``chunk_bytes_max``)."""

    def __init__(self, rate_bytes_per_s: int, burst_bytes: int, now_ms: int) -> None:
        assert rate_bytes_per_s >= 0 and burst_bytes > 0
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = (burst_bytes if rate_bytes_per_s == 0 else
                            max(1, min(burst_bytes, rate_bytes_per_s * BURST_MS // 1000)))
        self._tokens = float(self.burst_bytes)
        self._at_ms = now_ms

    @property
    def chunk_bytes_max(self) -> int:
        """The biggest chunk worth sending at once under this rate (``BURST_MS`` of it)."""
        if self.rate_bytes_per_s == 0:
            return REBUILD_BYTES_MAX
        return max(CHUNK_BYTES_MIN, self.rate_bytes_per_s * BURST_MS // 1000)

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


def target_step(shard: ShardState | None, generation: int, damage_found: int,
                damage_covered: int) -> TargetStep:
    """What the node whose shard ``shard`` is (as the cluster state says) does at a poll,
    with its disk of ``generation`` and its authority status's damage counters
    (``AuthorityStatus.damage_found``/``damage_covered``)."""
    if (shard is None or shard.status is not ShardStatus.REBUILDING
            or shard.rebuild_generation != generation):
        return TargetStep.NOTHING
    if damage_found > damage_covered:
        return TargetStep.RESTART
    return TargetStep.FINISH if shard.donors_done else TargetStep.NOTHING


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
    bytes_max: int = REBUILD_BYTES_MAX
    """The read may stop once it has this many bytes (one chunk's worth)."""


@dataclass(frozen=True, slots=True)
class SendChunk:
    log_id: int
    entries: tuple[bytes, ...]
    records: int
    bytes: int


@dataclass(frozen=True, slots=True)
class AskTails:
    """Ask these logs' sequencers for their tails; ``everywhere``: and every sequencer node
    for the tails of all the logs it has active. Answer with ``on_tails``."""

    log_ids: tuple[int, ...]
    everywhere: bool = False


@dataclass(frozen=True, slots=True)
class ListLogs:
    """List the donor's logs again (``on_logs``)."""


@dataclass(frozen=True, slots=True)
class Tail:
    """A log's sequencer's answer, as the driver saw it. ``tail_lsn``: the highest LSN it
    had handed out (0 when nothing can be in flight: no sequencer is active and the log's
    last epoch is clean, or the log does not exist); ``release_lsn``: its release pointer;
    ``held_lsn``: the donor's last LSN of the log when the answer came."""

    release_lsn: int
    tail_lsn: int
    held_lsn: int


@dataclass(frozen=True, slots=True)
class Sleep:
    until_ms: int


@dataclass(frozen=True, slots=True)
class SaveCheckpoint:
    progress: DonorProgress


@dataclass(frozen=True, slots=True)
class Finished:
    progress: DonorProgress


Effect = AskTails | ListLogs | ReadChunk | SendChunk | Sleep | SaveCheckpoint | Finished


class DonorCore:
    """One donor's walk for one lost shard. ``logs``: (log id, last LSN the donor holds) in
    any order. First the plan (module docstring: ``AskTails`` until each log's tail is
    released, ``ListLogs`` until no log is new), then the walk of each log up to its tail or
    what it held, whichever is higher; copies appended after the tail reach the shard from
    their sequencer (it is alive again). ``tails=False`` skips the plan (the walk is bounded
    by ``logs`` alone: not safe against appends in flight when the disk was lost).

    ``dirty`` (a mini-rebuild, ``storage_node.core.rebuild_scope``): only these logs' LSN
    ranges are walked, whatever the donor holds; the plan asks only their sequencers (the
    logs are known: nobody else's, and no list again), and waits as a whole-shard walk does
    for their tails to be released. Checkpoints mean the same: everything of the walk below
    (``log_id``, ``next_lsn``) was sent.

    Call ``next`` whenever the driver is idle and carry out the effect; feed back
    ``on_tails``/``on_logs``/``on_read``/``on_sent``/``on_checkpointed``."""

    def __init__(self, *, shard: str, logs: list[tuple[int, int]], progress: DonorProgress,
                 bucket: TokenBucket, by_copyset: bool, checkpoint_interval_ms: int,
                 now_ms: int, chunk_bytes_max: int = REBUILD_BYTES_MAX,
                 tails: bool = True, dirty: DirtyRanges = ()) -> None:
        self.shard = shard
        # A chunk is at most what the rate limit lets out in a short while (and what the
        # bucket may hold): at a low rate, a 512 KiB chunk went out at once, ahead of it.
        self._chunk_bytes_max = min(chunk_bytes_max, REBUILD_BYTES_MAX,
                                    bucket.chunk_bytes_max)
        self.progress = progress
        self._by_copyset = by_copyset
        self._bucket = bucket
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._saved_ms = now_ms
        self._dirty = dirty
        self._logs = sorted((log_id, until) for log_id, until in logs
                            if log_id >= progress.log_id)
        """A whole-shard walk's logs (log id, up to which LSN)."""
        self._spans: list[tuple[int, int, int]] = []
        """The walk: (log id, from LSN, until LSN), in order, from the checkpoint on."""
        self._index = 0
        self._from_lsn = 1
        self._respan()
        self._pending: SendChunk | None = None
        self._pending_next_lsn = 0
        self._reading = self._sending = self._saving = False
        self._retry_at_ms = 0
        self._retry_ms = SEND_RETRY_MS_MIN
        self._read_at_ms = 0
        self._read_retry_ms = SEND_RETRY_MS_MIN
        self.reads_failed = 0
        self._unsaved = False
        self.sends_failed = 0
        # The plan: per log, the tail its sequencer first reported (None: not answered yet)
        # and the release pointer it last reported.
        self._planning = tails
        self._everywhere = not tails or bool(dirty)
        """Whether every sequencer node has said which logs it has active (a mini-rebuild
        does not ask: its logs are known)."""
        self._tails: dict[int, int | None] = {log_id: None for log_id, _ in (
            dirty if dirty else self._logs) if log_id >= progress.log_id}
        self._released: dict[int, int] = {}
        self._asking = self._listing = False
        self._ask_at_ms = now_ms
        self._ask_retry_ms = TAIL_RETRY_MS_MIN
        self.tails_asked = 0

    @property
    def planning(self) -> bool:
        """Still waiting for the logs' tails to be released (nothing walked yet)."""
        return self._planning

    @property
    def busy(self) -> bool:
        return (self._reading or self._sending or self._saving or self._asking
                or self._listing)

    def next(self, now_ms: int) -> Effect | None:
        """The next thing to do, or None while an effect is under way."""
        if self.busy:
            return None
        if self.progress.done:
            return None
        if self._planning:
            effect = self._plan(now_ms)
            if effect is not None:
                return effect
        if self._unsaved and (now_ms - self._saved_ms >= self._checkpoint_interval_ms
                              or (self._pending is None and self._index >= len(self._spans))):
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
        while self._index < len(self._spans):
            log_id, _, until_lsn = self._spans[self._index]
            if self._from_lsn <= until_lsn:
                if now_ms < self._read_at_ms:
                    return Sleep(self._read_at_ms)
                self._reading = True
                return ReadChunk(log_id, self._from_lsn, until_lsn, self._chunk_bytes_max)
            self._advance_log(now_ms)
        if self._unsaved:
            return self.next(now_ms)  # the last checkpoint first (once: it clears _unsaved)
        self.progress = dataclasses.replace(self.progress, done=True, updated_ms=now_ms)
        return Finished(self.progress)

    def _plan(self, now_ms: int) -> Effect | None:
        """The plan's next question; None once it is made (a mini-rebuild's: its logs'
        tails released)."""
        waiting = tuple(log_id for log_id, tail in self._tails.items()
                        if tail is None or self._released.get(log_id, 0) < tail)
        if not waiting and self._everywhere:
            if self._dirty:
                self._planning = False
                return None
            self._listing = True
            return ListLogs()
        if now_ms < self._ask_at_ms:
            return Sleep(self._ask_at_ms)
        self._asking = True
        self.tails_asked += len(waiting)
        return AskTails(waiting, everywhere=not self._everywhere)

    def on_tails(self, answers: dict[int, Tail | None] | None, now_ms: int) -> None:
        """The answers to ``AskTails`` (a log's None: its sequencer did not answer; all None:
        asked ``everywhere`` and not every sequencer node answered: asked again). A log's tail
        is the one its sequencer reported first; a later answer only says how far it has
        released (a tail that moved on is not waited for). Logs answered that the donor does
        not hold (active elsewhere; asked ``everywhere``) are planned too: a copy of one of
        their appends in flight may still reach this donor."""
        assert self._asking
        self._asking = False
        incomplete = answers is None
        if answers is None:
            answers = {}
        elif not self._everywhere:
            self._everywhere = True
            new = [(log_id, 0) for log_id, answer in answers.items()
                   if answer is not None and log_id not in self._tails
                   and log_id >= self.progress.log_id]
            if new:
                for log_id, _ in new:
                    self._tails[log_id] = None
                self._add_logs(new)
        raised: dict[int, int] = {}
        for log_id, answer in answers.items():
            if answer is None or log_id not in self._tails:
                continue
            if self._tails[log_id] is None:
                self._tails[log_id] = answer.tail_lsn
                raised[log_id] = max(answer.tail_lsn, answer.held_lsn)
            # Nothing in flight (no active sequencer, the epoch clean): all is decided.
            released = LSN_MAX if answer.tail_lsn == 0 else answer.release_lsn
            self._released[log_id] = max(self._released.get(log_id, 0), released)
        if raised:
            self._raise_until(raised)
        if not incomplete and all(tail is not None and self._released.get(log_id, 0) >= tail
                                  for log_id, tail in self._tails.items()):
            self._ask_retry_ms = TAIL_RETRY_MS_MIN
            self._ask_at_ms = now_ms
        else:
            self._ask_at_ms = now_ms + self._ask_retry_ms
            self._ask_retry_ms = min(self._ask_retry_ms * 2, TAIL_RETRY_MS_MAX)

    def on_logs(self, logs: list[tuple[int, int]], now_ms: int) -> None:
        """The donor's logs as they are now: those it did not plan yet are planned too; none
        new, and the walk begins."""
        assert self._listing
        self._listing = False
        new = [(log_id, last) for log_id, last in logs
               if log_id not in self._tails and log_id >= self.progress.log_id]
        if not new:
            self._planning = False
            return
        for log_id, _ in new:
            self._tails[log_id] = None
        self._add_logs(new)
        self._ask_at_ms = now_ms
        self._ask_retry_ms = TAIL_RETRY_MS_MIN

    def _add_logs(self, new: list[tuple[int, int]]) -> None:
        self._logs = sorted([*self._logs, *new])
        self._respan()  # nothing was walked yet

    def _raise_until(self, raised: dict[int, int]) -> None:
        """Walk these logs up to at least these LSNs (their tails)."""
        if self._dirty:
            return  # a mini-rebuild walks its ranges, whatever the tail
        self._logs = [(log, max(until, raised.get(log, 0))) for log, until in self._logs]
        self._respan()

    def _respan(self) -> None:
        """The walk from the checkpoint on (before anything was walked)."""
        ranges = (triples(self._dirty) if self._dirty
                  else [(log_id, 1, until) for log_id, until in self._logs])
        at_log, at_lsn = self.progress.log_id, self.progress.next_lsn
        self._spans = [(log_id, max(lo, at_lsn) if log_id == at_log else lo, hi)
                       for log_id, lo, hi in ranges
                       if log_id > at_log or (log_id == at_log and hi >= at_lsn)]
        self._index = 0
        self._from_lsn = self._spans[0][1] if self._spans else 1

    def on_read(self, pieces: list[Piece], next_lsn: int, now_ms: int) -> None:
        """What the store holds of the chunk asked for, up to (not including) ``next_lsn``."""
        assert self._reading
        self._reading = False
        log_id, _, until_lsn = self._spans[self._index]
        if not pieces and next_lsn <= self._from_lsn:
            # The read stopped where it began (an I/O error): nothing of it is recorded as
            # sent; read again after a while.
            self.reads_failed += 1
            self._read_at_ms = now_ms + self._read_retry_ms
            self._read_retry_ms = min(self._read_retry_ms * 2, SEND_RETRY_MS_MAX)
            return
        self._read_retry_ms = SEND_RETRY_MS_MIN
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
        log_id, _, until_lsn = self._spans[self._index]
        self._moved_to(log_id, self._pending_next_lsn, until_lsn, chunk.records, chunk.bytes,
                       now_ms)

    def on_checkpointed(self, ok: bool, now_ms: int) -> None:
        assert self._saving
        self._saving = False
        if ok:
            self._saved_ms = now_ms
            self._unsaved = False
        else:
            self._saved_ms = now_ms  # try again after an interval

    def _moved_to(self, log_id: int, next_lsn: int, until_lsn: int, records: int,
                  size: int, now_ms: int) -> None:
        self._from_lsn = next_lsn
        self.progress = dataclasses.replace(
            self.progress, log_id=log_id, next_lsn=min(next_lsn, LSN_MAX),
            records=self.progress.records + records, bytes=self.progress.bytes + size,
            updated_ms=now_ms)
        self._unsaved = True
        if next_lsn > until_lsn:
            self._advance_log(now_ms)

    def _advance_log(self, now_ms: int) -> None:
        self._index += 1
        self._from_lsn = 1
        if self._index < len(self._spans):
            log_id, self._from_lsn, _ = self._spans[self._index]
            self.progress = dataclasses.replace(
                self.progress, log_id=log_id, next_lsn=self._from_lsn, updated_ms=now_ms)
            self._unsaved = True
