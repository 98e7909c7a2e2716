"""STORE (sequencer -> storage node) and STORED (the reply).

One STORE carries the records ``lsn .. lsn + len(payloads) - 1`` of one append: a single
record, or an atomic batch with consecutive LSNs. ``checksum`` covers the payloads so that a
storage node can refuse a corrupted copy with ``CHECKSUM_MISMATCH``.

A compressed batch (``compression`` != 0, ``shared.compression``) travels as one blob:
``payloads == (blob,)`` holds the ``records`` records ``lsn .. lsn + records - 1``, and the
checksum covers the blob. Only the sequencer sends them (recovery re-replicates plain records).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag

from isal import isal_zlib

from shared.compression import Codec
from shared.limits import BATCH_RECORDS_MAX, PRODUCER_ID_BYTES_MAX, PRODUCER_SEQ_MAX
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.extension import EXTENSION

ProducerTag = tuple[str, int, int, int]
"""``(producer_id, producer_seq, first_lsn, last_lsn)``: the idempotent append (see
``sequencer.core.producers``) that the records ``first_lsn..last_lsn`` came from. It travels
with every copy of those records, recovery's included, so that storage nodes can tell a new
sequencer which appends a producer already made."""


def producer_tag_valid(tag: object) -> bool:
    if type(tag) is not tuple or len(tag) != 4:
        return False
    producer_id, seq, first_lsn, last_lsn = tag
    return (type(producer_id) is str and 0 < len(producer_id) <= PRODUCER_ID_BYTES_MAX
            and type(seq) is int and 0 <= seq <= PRODUCER_SEQ_MAX
            and type(first_lsn) is int and type(last_lsn) is int
            and 0 < first_lsn <= last_lsn)


COMPRESSION_CODECS = frozenset(int(c) for c in Codec if c is not Codec.NONE)


_crc32 = isal_zlib.crc32
_JOIN_PAYLOADS_MIN = 4
"""From this many payloads on, the checksum joins them first (see ``payloads_checksum``)."""


def payloads_checksum(payloads: tuple[bytes, ...]) -> int:
    """CRC-32 chained over every payload, in order: the CRC-32 of their concatenation (zlib's
    CRC-32; ISA-L computes the same values over ten times faster: 19 against 247 us per MiB).
    A batch is joined and checksummed in one call (a copy costs less than a call per
    payload); the value is the same either way."""
    if len(payloads) >= _JOIN_PAYLOADS_MIN:
        return _crc32(b"".join(payloads))
    crc = 0
    for payload in payloads:
        crc = _crc32(payload, crc)
    return crc


class RecordFlags(IntFlag):
    """How a stored copy came to be (LogDevice's STORE flags)."""

    WRITTEN_BY_RECOVERY = 1
    """Written by epoch recovery; ``wave`` then holds ``recovery_wave(seal epoch, attempt)``."""
    HOLE = 2
    """A plugged hole: no record at this LSN (the payload is empty)."""
    BRIDGE = 4
    """The end of the epoch: no record at or after this LSN in its epoch (a hole too)."""


RECOVERY_HOLE = RecordFlags.WRITTEN_BY_RECOVERY | RecordFlags.HOLE
RECOVERY_BRIDGE = RECOVERY_HOLE | RecordFlags.BRIDGE
FLAGS_ALL = int(RECOVERY_BRIDGE)
_WRITTEN_BY_RECOVERY = int(RecordFlags.WRITTEN_BY_RECOVERY)
_HOLE = int(RecordFlags.HOLE)


RECOVERY_ATTEMPT_BITS = 16
RECOVERY_ATTEMPT_MAX = (1 << RECOVERY_ATTEMPT_BITS) - 1


def recovery_wave(seal_epoch: int, attempt: int) -> int:
    """The ``wave`` of a copy recovery writes: its seal epoch, then which attempt of that
    recovery wrote it, so that a late write of an abandoned attempt never ties with a newer
    attempt's decision (the newer one wins). A storage node's purge writes with the attempt
that decided (carried in CLEAN); attempt 0 only when the CLEAN came from a peer that
predates that field."""
    return seal_epoch << RECOVERY_ATTEMPT_BITS | min(attempt, RECOVERY_ATTEMPT_MAX)


def seal_epoch_of_wave(wave: int) -> int:
    return wave >> RECOVERY_ATTEMPT_BITS


def copy_precedence(flags: int, wave: int) -> tuple[int, int]:
    """Which of two copies of one LSN wins (LogDevice ``Digest::RecordMetadata``): a copy
    written by recovery beats one written by the sequencer; between recovery copies the higher
    seal epoch wins (then the later attempt); between sequencer copies the higher wave."""
    return (flags & RecordFlags.WRITTEN_BY_RECOVERY, wave)


@dataclass(frozen=True, slots=True, kw_only=True)
class Store:
    log_id: LogId
    lsn: Lsn
    wave: int
    sequencer_node: NodeId
    copyset: tuple[NodeId, ...]
    timestamp_ms: int
    last_known_good: Esn
    release_lsn: Lsn
    timeout_ms: int
    key: str | None
    payloads: tuple[bytes, ...]
    checksum: int
    flags: int = 0
    """``RecordFlags``; 0 for the sequencer's own STOREs."""
    producers: tuple[ProducerTag, ...] = ()
    """The producer tags of the appends whose records this STORE carries (each overlaps
    ``lsn..last_lsn``; a recovery STORE of one record carries its append's whole range)."""
    compression: int = field(default=0, metadata=EXTENSION)
    """``shared.compression.Codec`` of a compressed batch (see the module docstring)."""
    records: int = field(default=0, metadata=EXTENSION)
    """With ``compression``: how many records the blob holds."""
    wire_fields: bytes | memoryview | None = field(
        default=None, init=False, compare=False, repr=False, metadata={"wire": False})
    """Not sent: the packed field array this STORE arrived as, set by the codec when it
    decodes one (None when built locally). The storage node writes these bytes to disk as they
    are instead of packing the STORE again. Not an ``__init__`` argument, so that
    ``dataclasses.replace`` can never carry stale bytes over to changed fields."""

    @property
    def records_count(self) -> int:
        return self.records if self.compression else len(self.payloads)

    @property
    def last_lsn(self) -> Lsn:
        return Lsn(self.lsn + self.records_count - 1)

    def validate(self) -> Status:
        if not self.payloads or self.wave < 1 or self.timeout_ms < 0:
            return Status.BADMSG
        if self.compression and (
                self.compression not in COMPRESSION_CODECS or len(self.payloads) != 1
                or not 1 <= self.records <= BATCH_RECORDS_MAX or self.flags):
            return Status.BADMSG
        flags = self.flags
        # (Plain ints: an int & IntFlag goes through enum's __and__, per STORE.)
        if flags and (flags & ~FLAGS_ALL or not flags & _WRITTEN_BY_RECOVERY or (
                flags & _HOLE and any(self.payloads))):
            return Status.BADMSG
        if self.producers and (len(self.producers) > self.records_count or not all(
                producer_tag_valid(tag) and tag[2] <= self.last_lsn and tag[3] >= self.lsn
                for tag in self.producers)):
            return Status.BADMSG
        if payloads_checksum(self.payloads) != self.checksum:
            return Status.CHECKSUM_MISMATCH
        return Status.OK


@dataclass(frozen=True, slots=True, kw_only=True)
class Stored:
    log_id: LogId
    lsn: Lsn
    wave: int
    status: Status
    sealed_epoch: Epoch
    sealed_by: NodeId | None


_new_object = object.__new__
(_set_log_id, _set_lsn, _set_wave, _set_sequencer_node, _set_copyset, _set_timestamp_ms,
 _set_last_known_good, _set_release_lsn, _set_timeout_ms, _set_key, _set_payloads,
 _set_checksum, _set_flags, _set_producers, _set_compression, _set_records,
 _set_wire_fields) = (Store.__dict__[name].__set__ for name in (
     "log_id", "lsn", "wave", "sequencer_node", "copyset", "timestamp_ms", "last_known_good",
     "release_lsn", "timeout_ms", "key", "payloads", "checksum", "flags", "producers",
     "compression", "records", "wire_fields"))
assert len(Store.__dataclass_fields__) == 17 and not hasattr(Store, "__post_init__")


def sequencer_store(
    log_id: LogId, lsn: Lsn, wave: int, sequencer_node: NodeId, copyset: tuple[NodeId, ...],
    timestamp_ms: int, last_known_good: Esn, release_lsn: Lsn, timeout_ms: int,
    key: str | None, payloads: tuple[bytes, ...], checksum: int,
    producers: tuple[ProducerTag, ...], compression: int, records: int,
) -> Store:
    """``Store(..., flags=0)``, a sequencer's own STORE, equal in every way to one built by
    ``Store(...)`` but a quarter of its cost: each slot is set through its descriptor instead
    of the frozen dataclass's ``object.__setattr__`` per field (with 1,000 logs, one STORE
    per record, that ``__init__`` was 4% of the sequencer's CPU)."""
    store = _new_object(Store)
    _set_log_id(store, log_id)
    _set_lsn(store, lsn)
    _set_wave(store, wave)
    _set_sequencer_node(store, sequencer_node)
    _set_copyset(store, copyset)
    _set_timestamp_ms(store, timestamp_ms)
    _set_last_known_good(store, last_known_good)
    _set_release_lsn(store, release_lsn)
    _set_timeout_ms(store, timeout_ms)
    _set_key(store, key)
    _set_payloads(store, payloads)
    _set_checksum(store, checksum)
    _set_flags(store, 0)
    _set_producers(store, producers)
    _set_compression(store, compression)
    _set_records(store, records)
    _set_wire_fields(store, None)
    return store


(_set_stored_log_id, _set_stored_lsn, _set_stored_wave, _set_stored_status,
 _set_stored_sealed_epoch, _set_stored_sealed_by) = (Stored.__dict__[name].__set__ for name in (
     "log_id", "lsn", "wave", "status", "sealed_epoch", "sealed_by"))
assert len(Stored.__dataclass_fields__) == 6 and not hasattr(Stored, "__post_init__")


def stored_of(log_id: LogId, lsn: Lsn, wave: int, status: Status, sealed_epoch: Epoch,
              sealed_by: NodeId | None) -> Stored:
    """``Stored(...)`` built as ``sequencer_store`` builds a STORE: a storage node answers
    every STORE with one, a record each when many logs are written."""
    stored = _new_object(Stored)
    _set_stored_log_id(stored, log_id)
    _set_stored_lsn(stored, lsn)
    _set_stored_wave(stored, wave)
    _set_stored_status(stored, status)
    _set_stored_sealed_epoch(stored, sealed_epoch)
    _set_stored_sealed_by(stored, sealed_by)
    return stored
