"""Pure per-log decision logic of a storage node (no I/O, no clock).

For every log the node knows it keeps the durable seal (written by recovery's SEAL), the soft
seal (inferred from STOREs of newer epochs, LogDevice's ``SoftSealStorageTask``), the release
pointer and the highest LSN stored. ``on_store`` decides whether a STORE is persisted or
answered at once with an error; the runtime executes the decision with the record store and
reports back through ``on_persisted``. Decisions are plain values so they can be tested
without a disk.

Lifecycle: built empty, ``restore``d from what the record store found on disk, then driven by
messages until the node closes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shared.limits import (
    BATCH_RECORDS_MAX,
    COPYSET_SIZE_MAX,
    KEY_BYTES_MAX,
    READ_RECORDS_MAX,
    READ_WAIT_MS_MAX,
)
from shared.status import Status
from shared.types import (
    EPOCH_INVALID,
    EPOCH_MAX,
    EPOCH_MIN,
    ESN_MAX,
    LOG_ID_MAX,
    LOG_ID_MIN,
    LSN_INVALID,
    LSN_MAX,
    Epoch,
    Esn,
    LogId,
    Lsn,
    NodeId,
    compose_lsn,
    epoch_valid,
    log_id_valid,
    lsn_to_epoch,
    lsn_to_esn,
    lsn_valid,
    node_id_valid,
)
from shared.wire.read import GetLogState, LogState, Read
from shared.wire.recovery import Clean, Cleaned, Digest, EpochTail, GetDigest, Seal, Sealed
from shared.wire.release import Release
from shared.wire.store import (
    RECOVERY_ATTEMPT_MAX,
    RECOVERY_BRIDGE,
    RECOVERY_HOLE,
    RecordFlags,
    Store,
    Stored,
    payloads_checksum,
    recovery_wave,
    seal_epoch_of_wave,
    stored_of,
)
from shared.wire.trim import Trim, Trimmed

LSN_READABLE_MAX = Lsn(LSN_MAX - 1)
"""Highest LSN a read may reach, so that ``next_lsn = last + 1`` still fits in 64 bits."""
NODE_IDS_CACHED_MAX = 4096
"""Distinct node ids remembered as valid; past it ids are checked every time."""
UNCLEAN_EPOCHS_REPORTED_MAX = 64
"""Unsettled epochs one GET_LOG_STATE answer lists (lowest first); the purging sequencer
asks again once it has cleaned those."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogStorageState:
    """What a storage node knows about one log. Every field only ever increases, except that
    the soft seal is forgotten by a restart (it is rebuilt from the newest stored record)."""

    sealed_epoch: Epoch = EPOCH_INVALID
    sealed_by: NodeId | None = None
    soft_sealed_epoch: Epoch = EPOCH_INVALID
    soft_sealed_by: NodeId | None = None
    release_lsn: Lsn = LSN_INVALID
    last_lsn: Lsn = LSN_INVALID
    """Highest LSN durably stored on this node."""
    epoch_tails: Mapping[Epoch, tuple[int, int]] = field(default_factory=dict)
    """Per epoch with copies here: (highest last-known-good ESN seen, highest ESN held). The
    last-known-good ESN comes only from what STOREs carried (the sequencer's LNG, or the one a
    recovery trusted): every ESN up to it is a record on R nodes, so recovery may skip it."""
    trim_lsn: Lsn = LSN_INVALID
    """Records at or below it are trimmed: never served again."""
    settled: Mapping[Epoch, int] = field(default_factory=dict)
    """Per epoch, the ESN up to which a CLEAN's purge (or the last RELEASE of a drained
    epoch) settled the copies held here (``clean_mark``, ``drained_mark``): the epoch is not
    reported unsettled while nothing is held above it. Not a last-known-good ESN, and never
    reported to recovery as one: a CLEAN's purge leaves holes past the epoch's bridge, which
    are no record (see ``clean_mark``)."""

    @property
    def effective_seal(self) -> tuple[Epoch, NodeId | None]:
        """The seal that STOREs are checked against: the higher of durable and soft."""
        if self.soft_sealed_epoch > self.sealed_epoch:
            return self.soft_sealed_epoch, self.soft_sealed_by
        return self.sealed_epoch, self.sealed_by


_EMPTY = LogStorageState()


@dataclass(slots=True, kw_only=True)
class StoreDecision:
    """What to do with one STORE (never changed once built; not frozen because one is built
    per STORE, and a frozen dataclass's ``__init__`` costs about four times as much).

    ``status`` OK: persist the STORE, then reply ``Stored(OK)``. Any other status: send
    ``reply`` at once. ``release_lsn``, when set, is a release pointer that advanced and must be
    persisted whatever the status.
    """

    status: Status
    reply: Stored | None
    release_lsn: Lsn | None


_ESN_MASK = 0xFFFFFFFF
"""The ESN bits of an LSN (``shared.types.lsn_to_esn``)."""


def store_fields_status(store: Store, node_id_ok: Callable[[str], bool] = node_id_valid) -> Status:
    """BADMSG when a STORE's fields are out of range. The codec checks the top-level types but
    not the elements of tuples, so those are checked here before anything hashes them.
    (``log_id_valid``, ``lsn_valid``, ``epoch_valid`` and ``records_count`` inlined: this runs
    for every STORE, one per record with many logs.)"""
    lsn = store.lsn
    first_esn = lsn & _ESN_MASK
    payloads = store.payloads
    records_count = store.records if store.compression else len(payloads)
    log_id = store.log_id
    release_lsn = store.release_lsn
    if not (type(log_id) is int and LOG_ID_MIN <= log_id <= LOG_ID_MAX) or not (
            type(release_lsn) is int and 0 <= release_lsn <= LSN_MAX):
        return Status.BADMSG
    if not EPOCH_MIN <= lsn >> 32 <= EPOCH_MAX or first_esn < 1:
        return Status.BADMSG
    # A batch lives in one epoch: its last ESN must still be a valid ESN.
    if not 1 <= records_count <= BATCH_RECORDS_MAX or first_esn + records_count - 1 > ESN_MAX:
        return Status.BADMSG
    if not 0 <= store.last_known_good <= ESN_MAX or store.timestamp_ms < 0:
        return Status.BADMSG
    copyset = store.copyset
    if not node_id_ok(store.sequencer_node) or len(copyset) > COPYSET_SIZE_MAX:
        return Status.BADMSG
    for payload in payloads:
        if type(payload) is not bytes:
            return Status.BADMSG
    for node in copyset:
        if not node_id_ok(node):
            return Status.BADMSG
    key = store.key
    if key is not None and len(key.encode("utf-8", "replace")) > KEY_BYTES_MAX:
        return Status.BADMSG
    return store.validate()


def read_fields_status(read: Read) -> Status:
    if not log_id_valid(read.log_id):
        return Status.BADMSG
    if not (lsn_valid(read.from_lsn) and lsn_valid(read.until_lsn) and lsn_valid(read.release_lsn)):
        return Status.BADMSG
    if not 1 <= read.records_max <= READ_RECORDS_MAX or read.bytes_max < 1:
        return Status.BADMSG
    if not 0 <= read.wait_ms <= READ_WAIT_MS_MAX:
        return Status.BADMSG
    return Status.OK


@dataclass(slots=True)
class _LogState:
    """Mutable twin of ``LogStorageState``: the STORE path updates it in place."""

    sealed_epoch: Epoch = EPOCH_INVALID
    sealed_by: NodeId | None = None
    soft_sealed_epoch: Epoch = EPOCH_INVALID
    soft_sealed_by: NodeId | None = None
    release_lsn: Lsn = LSN_INVALID
    last_lsn: Lsn = LSN_INVALID
    epoch_tails: dict[Epoch, tuple[int, int]] = field(default_factory=dict)
    trim_lsn: Lsn = LSN_INVALID
    settled: dict[Epoch, int] = field(default_factory=dict)
    recovery_wave_max: int = 0
    """The highest recovery wave (seal epoch, attempt) accepted since the node started."""

    def snapshot(self) -> LogStorageState:
        return LogStorageState(
            sealed_epoch=self.sealed_epoch, sealed_by=self.sealed_by,
            soft_sealed_epoch=self.soft_sealed_epoch, soft_sealed_by=self.soft_sealed_by,
            release_lsn=self.release_lsn, last_lsn=self.last_lsn,
            epoch_tails=dict(self.epoch_tails), trim_lsn=self.trim_lsn,
            settled=dict(self.settled))

    def settled_to(self, epoch: Epoch) -> int:
        """The ESN up to which the epoch's copies here need no purge: settled, or known good."""
        tail = self.epoch_tails.get(epoch)
        return max(tail[0] if tail is not None else 0, self.settled.get(epoch, 0))

    def effective_seal(self) -> tuple[Epoch, NodeId | None]:
        if self.soft_sealed_epoch > self.sealed_epoch:
            return self.soft_sealed_epoch, self.soft_sealed_by
        return self.sealed_epoch, self.sealed_by


_ACCEPT = StoreDecision(status=Status.OK, reply=None, release_lsn=None)
"""The decision to write a STORE that moved no release pointer (shared: never changed)."""


class StoreMachine:
    """Per-log seals and release pointers; decides the fate of STOREs."""

    def __init__(self, *, accept_writes: bool) -> None:
        self._accept_writes = accept_writes
        self._logs: dict[LogId, _LogState] = {}
        self._valid_node_ids: set[str] = set()

    def set_accept_writes(self, accept: bool) -> None:
        """False: every STORE answers DISABLED (a node being drained takes no new copies)."""
        self._accept_writes = accept

    def restore(self, log_id: LogId, state: LogStorageState) -> None:
        """Load what the record store recovered for ``log_id`` (only at start)."""
        assert log_id not in self._logs, log_id
        self._logs[log_id] = _LogState(
            sealed_epoch=state.sealed_epoch, sealed_by=state.sealed_by,
            soft_sealed_epoch=state.soft_sealed_epoch, soft_sealed_by=state.soft_sealed_by,
            release_lsn=state.release_lsn, last_lsn=state.last_lsn,
            epoch_tails=dict(state.epoch_tails), trim_lsn=state.trim_lsn,
            settled=dict(state.settled))

    def state(self, log_id: LogId) -> LogStorageState:
        log = self._logs.get(log_id)
        return log.snapshot() if log is not None else _EMPTY

    def log_ids(self) -> list[LogId]:
        return list(self._logs)

    def on_store(self, store: Store, *, disk_low: bool) -> StoreDecision:
        status = store_fields_status(store, self._node_id_ok)
        if status != Status.OK:
            return StoreDecision(status=status, reply=stored_reply(store, status),
                                 release_lsn=None)
        log = self._log(store.log_id)
        release_lsn = None
        if store.release_lsn > log.release_lsn:
            log.release_lsn = release_lsn = store.release_lsn
        epoch = lsn_to_epoch(store.lsn)
        seal_epoch, seal_by = log.effective_seal()
        if store.flags:
            return self._on_recovery_store(store, log, epoch, disk_low)
        if epoch <= seal_epoch:
            reply = stored_reply(store, Status.PREEMPTED, seal_epoch, seal_by)
            return StoreDecision(status=Status.PREEMPTED, reply=reply, release_lsn=release_lsn)
        if epoch - 1 > log.soft_sealed_epoch:
            # A sequencer of epoch e exists, so no STORE of an epoch below e may be accepted
            # any more: that stops zombie sequencers before recovery seals durably.
            log.soft_sealed_epoch = Epoch(epoch - 1)
            log.soft_sealed_by = store.sequencer_node
        if not self._accept_writes:
            status = Status.DISABLED
        elif disk_low:
            status = Status.NOSPC
        if status is Status.OK and release_lsn is None:
            return _ACCEPT  # the common case: nothing to build per STORE
        refusal = stored_reply(store, status) if status != Status.OK else None
        return StoreDecision(status=status, reply=refusal, release_lsn=release_lsn)

    def _on_recovery_store(self, store: Store, log: _LogState, epoch: Epoch,
                           disk_low: bool) -> StoreDecision:
        """A copy written by recovery (LogDevice's mutation STORE): ``wave`` carries its seal
        epoch and attempt. Preempted by a higher seal (the epoch itself is sealed by design),
        or by a later attempt of the same recovery seen since the node started: a late STORE
        of an abandoned attempt must not overwrite a newer attempt's decision with a copy of
        lower precedence. It never raises the soft seal."""
        recovery_seal = Epoch(seal_epoch_of_wave(store.wave))
        if epoch > recovery_seal or not epoch_valid(recovery_seal):
            return StoreDecision(status=Status.BADMSG,
                                 reply=stored_reply(store, Status.BADMSG), release_lsn=None)
        seal_epoch, seal_by = log.effective_seal()
        if recovery_seal < seal_epoch or store.wave < log.recovery_wave_max:
            reply = stored_reply(store, Status.PREEMPTED, seal_epoch, seal_by)
            return StoreDecision(status=Status.PREEMPTED, reply=reply, release_lsn=None)
        log.recovery_wave_max = store.wave
        status = Status.OK
        if not self._accept_writes:
            status = Status.DISABLED
        elif disk_low:
            status = Status.NOSPC
        refusal = stored_reply(store, status) if status != Status.OK else None
        return StoreDecision(status=status, reply=refusal, release_lsn=None)

    def note_recovery_wave(self, log_id: LogId, wave: int) -> None:
        """A copy recovery wrote with ``wave`` came from a rebuilding donor: a later STORE of
        an earlier attempt is preempted here as on a node that got the recovery's STORE."""
        log = self._log(log_id)
        if wave > log.recovery_wave_max:
            log.recovery_wave_max = wave

    def on_purge_store(self, store: Store, *, disk_low: bool) -> StoreDecision:
        """A hole or bridge this node writes over its own copies to apply a CLEAN
        (``recovery_hole_stores``). Not checked against the seal: the CLEAN's outcome is
        final whatever newer seal the node holds (see ``clean_status``)."""
        status = store_fields_status(store, self._node_id_ok)
        if status is Status.OK and (not store.flags & RecordFlags.HOLE or not epoch_valid(
                seal_epoch_of_wave(store.wave))):
            status = Status.BADMSG
        elif status is Status.OK and not self._accept_writes:
            status = Status.DISABLED
        elif status is Status.OK and disk_low:
            status = Status.NOSPC
        refusal = stored_reply(store, status) if status != Status.OK else None
        return StoreDecision(status=status, reply=refusal, release_lsn=None)

    def on_persisted(self, store: Store) -> Stored:
        """The STORE is durable (per the fsync mode): note it and build the reply."""
        self.note_persisted(store)
        return stored_reply(store, Status.OK)

    def note_persisted(self, store: Store) -> None:
        """``on_persisted`` but for the reply (a STORED_BATCH answers with a status)."""
        log = self._log(store.log_id)
        last_lsn = store.last_lsn
        if last_lsn > log.last_lsn:
            log.last_lsn = last_lsn
        epoch = lsn_to_epoch(store.lsn)
        tail = log.epoch_tails.get(epoch)
        last_esn = lsn_to_esn(last_lsn)
        if tail is None or store.last_known_good > tail[0] or last_esn > tail[1]:
            log.epoch_tails[epoch] = (max(tail[0] if tail else 0, store.last_known_good),
                                      max(tail[1] if tail else 0, last_esn))

    def on_release(self, release: Release) -> Lsn | None:
        """The new release pointer to persist, or None when the RELEASE is stale or invalid."""
        if not log_id_valid(release.log_id) or not lsn_valid(release.release_lsn):
            return None
        return self.on_release_pointer(release.log_id, release.release_lsn)

    def on_release_pointer(self, log_id: LogId, release_lsn: Lsn) -> Lsn | None:
        """``on_release`` of a pointer already checked (a RELEASE_BATCH's pairs)."""
        log = self._log(log_id)
        if release_lsn <= log.release_lsn:
            return None
        log.release_lsn = release_lsn
        return release_lsn

    def drained_mark(self, release: Release) -> int | None:
        """For the last RELEASE of a drained epoch (``Release.drained_epoch``): the ESN up to
        which that epoch is settled here (durably, ``on_clean_marked``), as ``clean_mark``
        does, when the node holds unsettled copies, all of them at or below the release
        pointer (so records); else None."""
        epoch = release.drained_epoch
        log = self._logs.get(release.log_id)
        if (not epoch_valid(epoch) or log is None or not lsn_valid(release.release_lsn)
                or lsn_to_epoch(release.release_lsn) != epoch):
            return None
        tail = log.epoch_tails.get(epoch)
        if (tail is None or log.settled_to(epoch) >= tail[1]
                or tail[1] > lsn_to_esn(release.release_lsn)):
            return None
        return tail[1]

    def seal(self, log_id: LogId, epoch: Epoch, sealed_by: NodeId) -> Status:
        """Raise the durable seal to ``epoch``. OK when raised (the caller must persist it);
        UPTODATE when it already is at ``epoch``; PREEMPTED when a higher seal exists;
        INVALID_PARAM for an invalid log id, epoch or node id."""
        if not log_id_valid(log_id) or not epoch_valid(epoch) or not node_id_valid(sealed_by):
            return Status.INVALID_PARAM
        log = self._log(log_id)
        if epoch < log.sealed_epoch:
            return Status.PREEMPTED
        if epoch == log.sealed_epoch:
            return Status.UPTODATE
        log.sealed_epoch, log.sealed_by = epoch, sealed_by
        return Status.OK

    def on_seal(self, seal: Seal) -> Sealed | None:
        """None when the seal must be persisted first (then ``sealed`` builds the answer);
        otherwise the answer at once (PREEMPTED or INVALID_PARAM)."""
        if not epoch_valid(seal.from_epoch) or seal.from_epoch > seal.seal_epoch:
            return self.sealed(seal, Status.INVALID_PARAM)
        status = self.seal(seal.log_id, seal.seal_epoch, seal.sealed_by)
        if status in (Status.OK, Status.UPTODATE):
            return None
        return self.sealed(seal, status)

    def sealed(self, seal: Seal, status: Status) -> Sealed:
        """SEALED for ``seal``; with OK, the node's tails of the sealed epochs."""
        log = self._logs.get(seal.log_id) if log_id_valid(seal.log_id) else None
        tails: tuple[EpochTail, ...] = ()
        sealed_epoch, sealed_by = EPOCH_INVALID, None
        if log is not None:
            sealed_epoch, sealed_by = log.sealed_epoch, log.sealed_by
            if status is Status.OK:
                tails = tuple((epoch, lng, last) for epoch, (lng, last)
                              in sorted(log.epoch_tails.items())
                              if seal.from_epoch <= epoch <= seal.seal_epoch)
        return Sealed(status=status, log_id=seal.log_id, seal_epoch=seal.seal_epoch,
                      sealed_epoch=sealed_epoch, sealed_by=sealed_by, tails=tails)

    def digest_status(self, request: GetDigest) -> Status:
        """OK when the digest may be served: valid, and the node is not sealed above the
        recovery that asks (a newer recovery owns the epoch then)."""
        if not log_id_valid(request.log_id) or not epoch_valid(request.epoch) or (
                not epoch_valid(request.seal_epoch) or request.epoch > request.seal_epoch):
            return Status.BADMSG
        if not 0 <= request.from_esn <= ESN_MAX or not 1 <= request.records_max <= (
                READ_RECORDS_MAX) or request.bytes_max < 1:
            return Status.BADMSG
        if self.state(request.log_id).sealed_epoch > request.seal_epoch:
            return Status.PREEMPTED
        return Status.OK

    def digest_refused(self, request: GetDigest, status: Status) -> Digest:
        sealed_epoch, sealed_by = EPOCH_INVALID, None
        if status is Status.PREEMPTED:
            sealed_epoch, sealed_by = self.state(request.log_id).effective_seal
        return Digest(status=status, log_id=request.log_id, epoch=request.epoch, entries=(),
                      next_esn=request.from_esn, sealed_epoch=sealed_epoch, sealed_by=sealed_by)

    def clean_status(self, clean: Clean) -> Cleaned | None:
        """None when the CLEAN may be applied; otherwise the answer (BADMSG).

        A CLEAN is applied (its purge) even on a node sealed above ``clean.seal_epoch``: it
        is sent only once its recovery wrote every decision to R nodes of an f-majority that
        had sealed, so any later recovery of the epoch digests those copies and decides the
        same (LogDevice: a recovered epoch is immutable). A node that missed that recovery
        and was sealed by a newer one before the CLEAN reached it would otherwise keep its
        stray copies for good. ``cleaned_after_purge`` still answers PREEMPTED then, so that
        a recovery whose member was sealed by a newer one stops."""
        valid = (log_id_valid(clean.log_id) and epoch_valid(clean.epoch)
                 and epoch_valid(clean.seal_epoch) and clean.epoch <= clean.seal_epoch
                 and 0 <= clean.bridge_esn <= ESN_MAX and node_id_valid(clean.sealed_by)
                 and 0 <= clean.attempt <= RECOVERY_ATTEMPT_MAX
                 and all(type(r) is tuple and len(r) == 2 and type(r[0]) is int
                         and type(r[1]) is int and 1 <= r[0] <= r[1] <= ESN_MAX
                         for r in clean.holes))
        if not valid:
            return self.cleaned(clean, Status.BADMSG)
        return None

    def cleaned_after_purge(self, clean: Clean, status: Status) -> Cleaned:
        """CLEANED once the purge of a valid CLEAN is done (``status`` is how the writes
        went): PREEMPTED when this node is sealed above the recovery that sent it, even though
        it purged (the sender may then forget the CLEAN: nothing of it is left to do)."""
        if status is Status.OK and self.state(clean.log_id).effective_seal[0] > (
                clean.seal_epoch):
            status = Status.PREEMPTED
        return self.cleaned(clean, status)

    def cleaned(self, clean: Clean, status: Status) -> Cleaned:
        state = self.state(clean.log_id) if log_id_valid(clean.log_id) else _EMPTY
        sealed_epoch, sealed_by = state.effective_seal
        return Cleaned(status=status, log_id=clean.log_id, epoch=clean.epoch,
                       sealed_epoch=sealed_epoch, sealed_by=sealed_by)

    def on_get_log_state(self, message: GetLogState) -> LogState:
        """``sealed_epoch`` is the effective seal: STOREs of that epoch or below are refused."""
        if not log_id_valid(message.log_id):
            return LogState(status=Status.BADMSG, log_id=message.log_id,
                            release_lsn=LSN_INVALID, sealed_epoch=EPOCH_INVALID,
                            last_lsn=LSN_INVALID)
        state = self.state(message.log_id)
        return LogState(status=Status.OK, log_id=message.log_id, release_lsn=state.release_lsn,
                        sealed_epoch=state.effective_seal[0], last_lsn=state.last_lsn,
                        trim_lsn=state.trim_lsn, unclean=unsettled_epochs(state))

    def epoch_last_esn(self, log_id: LogId, epoch: Epoch) -> int:
        """The highest ESN of ``epoch`` held here (0 if none)."""
        log = self._logs.get(log_id)
        tail = log.epoch_tails.get(epoch) if log is not None else None
        return tail[1] if tail is not None else 0

    def clean_mark(self, clean: Clean, purged_last_esn: int) -> int | None:
        """Once a CLEAN's purge is written: the ESN up to which the epoch is settled here
        (durably, ``on_clean_marked``), so that the node no longer reports it as unsettled
        (``LogState.unclean``); None when there is nothing to mark. ``purged_last_esn`` is
        the highest ESN the node held when the purge was decided (``epoch_last_esn``): a copy
        that came later (a late STORE of an abandoned recovery attempt) was not purged and
        stays unsettled.

        The mark is not a last-known-good ESN. The purge wrote holes over the node's copies
        past the bridge, and a hole that only this node holds is no decision any other node
        knows of: if the next attempt of the same recovery (its CLEANED was lost) trusted the
        mark as last-known-good it would digest nothing below it, bridge after it and take
        it as the epoch's last record, while readers without this node find no copy there.
        Recovery digests from the LNG the STOREs carried instead, finds the decision (written
        to R nodes with its precedence) and decides the same again."""
        log = self._logs.get(clean.log_id)
        if log is None or clean.epoch not in log.epoch_tails:
            return None
        last = min(purged_last_esn, log.epoch_tails[clean.epoch][1])
        return last if last > log.settled_to(clean.epoch) else None

    def on_clean_marked(self, log_id: LogId, epoch: Epoch, esn: int) -> None:
        """The mark of ``clean_mark`` or ``drained_mark`` is durable."""
        log = self._log(log_id)
        if esn > log.settled.get(epoch, 0):
            log.settled[epoch] = esn

    def trim(self, trim: Trim) -> Status:
        """Raise the trim point: OK when raised (the caller must persist it), UPTODATE when it
        already is at or above, INVALID_PARAM for an invalid log id or LSN."""
        if not log_id_valid(trim.log_id) or not lsn_valid(trim.trim_lsn) or (
                trim.trim_lsn > LSN_READABLE_MAX):
            return Status.INVALID_PARAM
        log = self._log(trim.log_id)
        if trim.trim_lsn <= log.trim_lsn:
            return Status.UPTODATE
        log.trim_lsn = trim.trim_lsn
        return Status.OK

    def trimmed(self, trim: Trim, status: Status) -> Trimmed:
        log = self._logs.get(trim.log_id)
        return Trimmed(status=status, log_id=trim.log_id,
                       trim_lsn=log.trim_lsn if log is not None else LSN_INVALID)

    def trim_lsn(self, log_id: LogId) -> Lsn:
        log = self._logs.get(log_id)
        return log.trim_lsn if log is not None else LSN_INVALID

    def release_lsn(self, log_id: LogId) -> Lsn:
        log = self._logs.get(log_id)
        return log.release_lsn if log is not None else LSN_INVALID

    def readable_until(self, read: Read,
                       first_copy: Callable[[LogId, Lsn, Lsn], Lsn | None]) -> Lsn:
        """Highest LSN the READ may return, within its range: this node's own release pointer,
        which only a sequencer moves (RELEASE, or the pointer a STORE carries). Any client may
        send a READ, so the pointer it carries never makes a copy above the node's own pointer
        readable (it may be unreleased, or a stray copy recovery has not plugged yet). It only
        lets the node say, past its own pointer, that it holds nothing up to there: a node
        outside the newest copysets learns the pointer late (periodic broadcast), and readers
        need not wait for it. ``first_copy(log, lo, hi)``: the first LSN in ``[lo, hi]`` this
        node holds a copy of (record, hole or bridge), or None."""
        log_id = read.log_id
        cap = self.release_lsn(log_id)
        carried = read.release_lsn
        if carried > cap:
            # Below the trim point, or the READ's start, nothing is served anyway.
            base = max(cap, self.trim_lsn(log_id), read.from_lsn - 1)
            first = first_copy(log_id, Lsn(base + 1), carried) if carried > base else None
            cap = Lsn(carried if first is None else max(cap, first - 1))
        return Lsn(min(read.until_lsn, cap, LSN_READABLE_MAX))

    def _log(self, log_id: LogId) -> _LogState:
        log = self._logs.get(log_id)
        if log is None:
            log = self._logs[log_id] = _LogState()
        return log

    def _node_id_ok(self, node_id: str) -> bool:
        # Node ids come from a small set, so the regex runs once per id, not per STORE.
        if node_id in self._valid_node_ids:
            return True
        if not node_id_valid(node_id):
            return False
        if len(self._valid_node_ids) < NODE_IDS_CACHED_MAX:
            self._valid_node_ids.add(node_id)
        return True


def unsettled_epochs(state: LogStorageState) -> tuple[tuple[int, int, int], ...]:
    """``(epoch, lng, last)`` of the epochs whose copies here above the last-known-good ESN
    were never settled by a CLEAN or a drained epoch's last RELEASE (``settled``; lowest
    first, at most ``UNCLEAN_EPOCHS_REPORTED_MAX``).
    The newest epoch is among them while its sequencer writes: the asker skips its own.
    Copies at or below the trim point are never served again: they need no settling."""
    unsettled: list[tuple[int, int, int]] = []
    settled = state.settled
    for epoch in sorted(state.epoch_tails):
        lng, last = state.epoch_tails[epoch]
        # The purge re-derives from the last-known-good ESN, not from the settled one: the
        # epoch's bridge lies past the former (see ``sequencer.core.purge``).
        if last > max(lng, settled.get(epoch, 0)) and compose_lsn(epoch, Esn(last)) > (
                state.trim_lsn):
            unsettled.append((epoch, lng, last))
            if len(unsettled) >= UNCLEAN_EPOCHS_REPORTED_MAX:
                break
    return tuple(unsettled)


def stored_reply(store: Store, status: Status, sealed_epoch: Epoch = EPOCH_INVALID,
                 sealed_by: NodeId | None = None) -> Stored:
    return stored_of(store.log_id, store.lsn, store.wave, status, sealed_epoch, sealed_by)


def purge_ranges(held: Sequence[tuple[int, int]],
                 clean: Clean) -> list[tuple[int, int, int]]:
    """``(first_esn, last_esn, flags)`` of ``clean.epoch`` to overwrite on this node: where it
    holds copies but recovery decided there is no record, that is the plugged holes and
    everything after the bridge (holes), and the bridge itself (the bridge again). A copy the
    node got before recovery, which recovery never saw, is then not served once the epoch is
    released. ``held`` is sorted inclusive ESN ranges."""
    cut: list[tuple[int, int, int]] = [(lo, hi, int(RECOVERY_HOLE)) for lo, hi in clean.holes]
    if clean.bridge_esn:
        cut.append((clean.bridge_esn, clean.bridge_esn, int(RECOVERY_BRIDGE)))
        if clean.bridge_esn < ESN_MAX:
            cut.append((clean.bridge_esn + 1, ESN_MAX, int(RECOVERY_HOLE)))
    result: list[tuple[int, int, int]] = []
    for lo, hi in held:
        for cut_lo, cut_hi, flags in cut:
            first, last = max(lo, cut_lo), min(hi, cut_hi)
            if first <= last:
                result.append((first, last, flags))
    result.sort()
    merged: list[tuple[int, int, int]] = []
    for lo, hi, flags in result:
        if merged and lo <= merged[-1][1] + 1 and flags == merged[-1][2]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]), flags)
        else:
            merged.append((lo, hi, flags))
    return merged


def recovery_hole_stores(clean: Clean, ranges: list[tuple[int, int, int]],
                         timestamp_ms: int) -> list[Store]:
    """Recovery STOREs of holes or bridges (at most ``BATCH_RECORDS_MAX`` ESNs each) covering
    ``ranges`` of ``(first_esn, last_esn, flags)``, with the precedence of the recovery attempt
    that decided them (carried in the CLEAN): a node's own copies of that decision are
    rewritten as they are, never demoted below a copy that an abandoned earlier attempt left on
    some other node (which readers would then prefer)."""
    stores: list[Store] = []
    for lo, hi, flags in ranges:
        esn = lo
        while esn <= hi:
            count = min(hi - esn + 1, BATCH_RECORDS_MAX)
            payloads = (b"",) * count
            stores.append(Store(
                log_id=clean.log_id, lsn=compose_lsn(clean.epoch, Esn(esn)),
                wave=recovery_wave(clean.seal_epoch, clean.attempt),
                sequencer_node=clean.sealed_by, copyset=(), timestamp_ms=timestamp_ms,
                last_known_good=Esn(0), release_lsn=LSN_INVALID, timeout_ms=0, key=None,
                payloads=payloads, checksum=payloads_checksum(payloads), flags=flags))
            esn += count
    return stores
