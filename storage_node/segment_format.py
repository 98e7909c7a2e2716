"""The on-disk entry format of the record store's segment files, and the segment scanner.

A segment is a sequence of entries, each ``header | body``. The 12-byte header is
``magic:u16 type:u8 reserved:u8 body_bytes:u32 crc32:u32`` (little endian); the CRC covers the
first 8 header bytes and the body, so a flipped type or length byte is caught as well. The
body is a msgpack array:

* STORE_FIELDS (type 6, what every STORE is written as): the STORE message's packed field
  array exactly as it came over the wire (``Store.wire_fields``; ``shared.wire.codec``'s
  ``encode_fields`` for a STORE built locally), so the writer packs nothing again: ``[log_id,
  lsn, wave, sequencer_node, copyset, timestamp_ms, last_known_good, release_lsn, timeout_ms,
  key, payloads, checksum, flags, producers, compression, records]`` (the field order of
  ``Store``; one entry per STORE message, a batch has consecutive LSNs; with
  WRITTEN_BY_RECOVERY in ``flags`` ``wave`` is recovery's seal epoch; ``release_lsn`` and
  ``timeout_ms`` are not used on read). A compressed batch (``compression`` != 0) has
  ``payloads == [blob]`` (the batch exactly as the writer compressed it,
  ``shared.compression``) holding ``records`` records; the entry's CRC covers the blob, the
  index knows its LSN range without expanding it, reads send the blob whole when they cover
  the entry, else expand it and slice (``record_reads``), digests and recovery see its records
  one by one. Trailing fields that hold their default may be absent (the codec leaves them
  out): a field added to ``Store`` later must go at the end with a default, so older entries
  stay readable.
* STORE (type 1, written before STORE_FIELDS existed, still read): ``[log_id, first_lsn,
  record_count, sequencer_node, timestamp_ms, last_known_good, wave, copyset, key, payloads,
  flags, producers]`` (``flags`` absent in entries written before they existed, ``producers``
  absent in older entries); a compressed one has ``payloads == [blob]``, ``record_count`` its
  records, then a 13th field, ``compression`` (the ``Codec`` id).
* RELEASE: ``[log_id, release_lsn]``;
* SEAL: ``[log_id, epoch, sealed_by]``;
* TRIM: ``[log_id, trim_lsn]``;
* CHECKPOINT: ``[log_id, last_lsn, last_sequencer_node, release_lsn, sealed_epoch, sealed_by,
  trim_lsn, [[epoch, last_known_good, last_esn], ...], [[epoch, settled_esn], ...]]``:
  everything a restart derives about one log from all its entries (``""`` for an absent node
  id; the last field, the epochs a CLEAN settled, is absent when empty and in entries written
  before it existed). It is written before segments are deleted or compacted, so that dropping
  their RELEASE, SEAL, TRIM and STORE entries loses no state.

Zero tail: a segment may end in zero bytes after its last entry. The writer zero-fills (and
fsyncs) the space ahead of its write position, so that a commit overwrites blocks that are
already allocated and written and needs an ``fdatasync`` without a journal commit (PostgreSQL's
``wal_init_zero``). No entry starts with a zero byte (``MAGIC``), so when everything from an
entry boundary to the end of the file is zero, the data ends there: the scan reports it as
``zero_tail_bytes`` (a clean end, neither torn nor corrupt). Anything else after the last good
entry (a torn entry, even one followed by zeros; garbage) is reported exactly as in segments
without a zero tail. Segments written before this have no zero tail and scan as before; the
format of entries is unchanged, so an older version reads these segments too (it would cut
the zero tail of the newest segment as a torn tail, and flag one in an older segment as a
bad entry).

Versioning: the entry type is the format version of an entry. A new layout gets a new type
and readers keep every old one, so segments written by older versions stay readable (a
downgrade cannot read the newer types: it would treat them as corruption).

Everything here is pure functions on bytes; the record store does the file I/O.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack
from isal import isal_zlib

from shared.compression import expand_stored
from shared.limits import FRAME_BYTES_MAX
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId
from shared.wire.codec import encode_fields, wire_field_names
from shared.wire.read import WireRecord
from shared.wire.store import COMPRESSION_CODECS, ProducerTag, Store, producer_tag_valid

MAGIC = 0x5153  # b"SQ" little endian
_HEADER = struct.Struct("<HBBII")
HEADER_BYTES = _HEADER.size
_CRC_PREFIX_BYTES = 8
ENTRY_BODY_BYTES_MAX = FRAME_BYTES_MAX
"""A STORE entry is never bigger than the frame that carried it."""
_MAGIC_BYTES = struct.pack("<H", MAGIC)


class EntryType(IntEnum):
    STORE = 1
    RELEASE = 2
    SEAL = 3
    TRIM = 4
    CHECKPOINT = 5
    STORE_FIELDS = 6


@dataclass(frozen=True, slots=True)
class StoreMeta:
    """What the index needs from a STORE entry (its payloads are not decoded)."""

    log_id: LogId
    first_lsn: Lsn
    record_count: int
    sequencer_node: NodeId
    last_known_good: int = 0
    flags: int = 0
    timestamp_ms: int = 0
    producers: tuple[ProducerTag, ...] = ()

    @property
    def last_lsn(self) -> Lsn:
        return Lsn(self.first_lsn + self.record_count - 1)


@dataclass(frozen=True, slots=True)
class ReleaseEntry:
    log_id: LogId
    release_lsn: Lsn


@dataclass(frozen=True, slots=True)
class SealEntry:
    log_id: LogId
    epoch: Epoch
    sealed_by: NodeId


@dataclass(frozen=True, slots=True)
class TrimEntry:
    log_id: LogId
    trim_lsn: Lsn


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One log's durable state as of the checkpoint (see the module docstring)."""

    log_id: LogId
    last_lsn: Lsn
    last_sequencer: NodeId | None
    release_lsn: Lsn
    sealed_epoch: Epoch
    sealed_by: NodeId | None
    trim_lsn: Lsn
    tails: tuple[tuple[int, int, int], ...]
    """(epoch, highest last-known-good ESN, highest ESN) per epoch with copies."""
    settled: tuple[tuple[int, int], ...] = ()
    """(epoch, ESN up to which its copies are settled) per epoch a CLEAN or a drained
    release settled (``LogStorageState.settled``)."""


Entry = StoreMeta | ReleaseEntry | SealEntry | TrimEntry | CheckpointEntry


@dataclass(frozen=True, slots=True)
class ScannedEntry:
    offset: int
    length: int
    """Header plus body bytes."""
    entry: Entry


@dataclass(frozen=True, slots=True)
class SegmentScan:
    entries: list[ScannedEntry]
    valid_bytes: int
    """Offset just after the last good entry before the first bad one (or the end)."""
    bad_offset: int | None
    """Where the first short or bad entry starts; None when the whole segment is good."""
    good_after_bad: bool
    """A well-formed entry exists after ``bad_offset``: corruption in the middle, not a tail
    torn by a crash."""
    zero_tail_bytes: int = 0
    """Zero bytes from ``valid_bytes`` to the end (space the writer zero-filled ahead of its
    writes): the clean end of the data, only when ``bad_offset`` is None."""


_packer = msgpack.Packer(use_bin_type=True)


_PREFIX = struct.Struct("<HBBI")
_CRC = struct.Struct("<I")
_crc32 = isal_zlib.crc32
"""zlib's CRC-32 (the same values, so every segment ever written still checks), computed by
ISA-L: over ten times faster than zlib's, and every entry is checksummed when written and when
read."""


def _frame(entry_type: EntryType, body: bytes) -> bytes:
    assert len(body) <= ENTRY_BODY_BYTES_MAX, len(body)
    prefix = struct.pack("<HBBI", MAGIC, entry_type, 0, len(body))
    crc = _crc32(body, _crc32(prefix))
    return prefix + struct.pack("<I", crc) + body


def store_entry_parts(store: Store) -> tuple[bytes, bytes | memoryview]:
    """A STORE_FIELDS entry as (header, body): the body is the STORE's received bytes when it
    has them (no packing, no copy), so the writer joins both with its other chunks once."""
    body = store.wire_fields
    if body is None:
        body = encode_fields(store)
    assert len(body) <= ENTRY_BODY_BYTES_MAX, len(body)
    prefix = _PREFIX.pack(MAGIC, EntryType.STORE_FIELDS, 0, len(body))
    return prefix + _CRC.pack(_crc32(body, _crc32(prefix))), body


def encode_store(store: Store) -> bytes:
    """A STORE_FIELDS entry (see ``store_entry_parts``)."""
    return b"".join(store_entry_parts(store))


def encode_legacy_store(store: Store) -> bytes:
    """A STORE entry of the layout before STORE_FIELDS (only tests write it: old segments must
    stay readable)."""
    fields = [
        store.log_id, store.lsn, len(store.payloads), store.sequencer_node, store.timestamp_ms,
        store.last_known_good, store.wave, list(store.copyset), store.key, list(store.payloads),
        store.flags, [list(tag) for tag in store.producers],
    ]
    if store.compression:
        fields[2] = store.records
        fields.append(store.compression)
    return _frame(EntryType.STORE, _packer.pack(fields))


def encode_release(log_id: LogId, release_lsn: Lsn) -> bytes:
    return _frame(EntryType.RELEASE, _packer.pack([log_id, release_lsn]))


def encode_seal(log_id: LogId, epoch: Epoch, sealed_by: NodeId) -> bytes:
    return _frame(EntryType.SEAL, _packer.pack([log_id, epoch, sealed_by]))


def encode_trim(log_id: LogId, trim_lsn: Lsn) -> bytes:
    return _frame(EntryType.TRIM, _packer.pack([log_id, trim_lsn]))


def encode_checkpoint(entry: CheckpointEntry) -> bytes:
    return _frame(EntryType.CHECKPOINT, _packer.pack([
        entry.log_id, entry.last_lsn, entry.last_sequencer or "", entry.release_lsn,
        entry.sealed_epoch, entry.sealed_by or "", entry.trim_lsn,
        [list(tail) for tail in entry.tails],
        *([[list(mark) for mark in entry.settled]] if entry.settled else []),
    ]))


def check_entry(data: bytes | memoryview, offset: int) -> tuple[EntryType, int] | None:
    """``(type, body_bytes)`` when a complete entry with a matching CRC starts at ``offset``."""
    if len(data) - offset < HEADER_BYTES:
        return None
    magic, type_id, reserved, body_bytes, crc = _HEADER.unpack_from(data, offset)
    if magic != MAGIC or reserved != 0 or body_bytes > ENTRY_BODY_BYTES_MAX:
        return None
    if type_id not in _ENTRY_TYPES:
        return None
    end = offset + HEADER_BYTES + body_bytes
    if end > len(data):
        return None
    view = memoryview(data)
    expected = _crc32(view[offset + HEADER_BYTES : end],
                          _crc32(view[offset : offset + _CRC_PREFIX_BYTES]))
    if expected != crc:
        return None
    return EntryType(type_id), body_bytes


_ENTRY_TYPES = frozenset(int(t) for t in EntryType)


def decode_meta(entry_type: EntryType, body: bytes | memoryview) -> Entry | None:
    """The indexable part of a CRC-checked body; None if it is not what its type promises
    (which a CRC match makes a bug or a hostile file, never a torn write)."""
    try:
        if entry_type == EntryType.STORE_FIELDS:
            fields = _store_fields(body)
            if fields is None:
                return None
            tags = _producer_tags(fields[_PRODUCERS])
            if tags is None:
                return None
            count = fields[_RECORDS] if fields[_COMPRESSION] else len(fields[_PAYLOADS])
            return StoreMeta(LogId(fields[_LOG_ID]), Lsn(fields[_LSN]), count,
                             NodeId(fields[_NODE]), fields[_LNG], fields[_FLAGS],
                             fields[_TIMESTAMP], tags)
        if entry_type == EntryType.STORE:
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(body)
            fields_count = unpacker.read_array_header()
            if fields_count not in (10, 11, 12, 13):
                return None
            log_id, first_lsn, count, node, timestamp_ms, lng = (
                unpacker.unpack() for _ in range(6))
            if not (_ints(log_id, first_lsn, count, lng, timestamp_ms) and isinstance(node, str)
                    and count >= 1):
                return None
            flags = 0
            producers: tuple[ProducerTag, ...] = ()
            if fields_count >= 11:
                for _ in range(4):  # wave, copyset, key, payloads
                    unpacker.skip()
                flags = unpacker.unpack()
                if not _ints(flags):
                    return None
            if fields_count >= 12:
                tags = _producer_tags(unpacker.unpack())
                if tags is None:
                    return None
                producers = tags
            if fields_count == 13 and not _codec(unpacker.unpack()):
                return None
            return StoreMeta(LogId(log_id), Lsn(first_lsn), count, NodeId(node), lng, flags,
                             timestamp_ms, producers)
        fields = msgpack.unpackb(body, raw=False)
        if entry_type == EntryType.RELEASE and len(fields) == 2 and _ints(*fields):
            return ReleaseEntry(LogId(fields[0]), Lsn(fields[1]))
        if entry_type == EntryType.TRIM and len(fields) == 2 and _ints(*fields):
            return TrimEntry(LogId(fields[0]), Lsn(fields[1]))
        if (entry_type == EntryType.SEAL and len(fields) == 3 and _ints(*fields[:2])
                and isinstance(fields[2], str)):
            return SealEntry(LogId(fields[0]), Epoch(fields[1]), NodeId(fields[2]))
        if entry_type == EntryType.CHECKPOINT:
            return _decode_checkpoint(fields)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return None


def _decode_checkpoint(fields: Any) -> CheckpointEntry | None:
    if not isinstance(fields, list) or len(fields) not in (8, 9):
        return None
    log_id, last_lsn, last_node, release_lsn, sealed_epoch, sealed_by, trim_lsn, tails = (
        fields[:8])
    settled = fields[8] if len(fields) == 9 else []
    if not (_ints(log_id, last_lsn, release_lsn, sealed_epoch, trim_lsn)
            and isinstance(last_node, str) and isinstance(sealed_by, str)
            and isinstance(tails, list) and isinstance(settled, list)):
        return None
    if not all(isinstance(t, list) and len(t) == 3 and _ints(*t) for t in tails):
        return None
    if not all(isinstance(m, list) and len(m) == 2 and _ints(*m) for m in settled):
        return None
    return CheckpointEntry(
        LogId(log_id), Lsn(last_lsn), NodeId(last_node) if last_node else None,
        Lsn(release_lsn), Epoch(sealed_epoch), NodeId(sealed_by) if sealed_by else None,
        Lsn(trim_lsn), tuple((t[0], t[1], t[2]) for t in tails),
        tuple((m[0], m[1]) for m in settled))


def _producer_tags(value: Any) -> tuple[ProducerTag, ...] | None:
    if not value and isinstance(value, list | tuple):
        return ()
    if not isinstance(value, list | tuple):
        return None
    tags = tuple(tuple(tag) for tag in value if isinstance(tag, list | tuple))
    if len(tags) != len(value) or not all(producer_tag_valid(tag) for tag in tags):
        return None
    return tags  # each checked by producer_tag_valid


@dataclass(frozen=True, slots=True)
class StoredCopies:
    """The decoded records of one STORE entry and how they were written."""

    log_id: LogId
    first_lsn: Lsn
    flags: int
    wave: int
    records: list[WireRecord]
    producers: tuple[ProducerTag, ...] = ()

    compression: int = 0
    """A compressed batch not expanded yet (``decode_store_records(expand=False)``):
    ``records`` is empty, ``blob`` holds its ``count`` records."""
    count: int = 0
    blob: bytes = b""
    timestamp_ms: int = 0
    key: str | None = None

    def expanded(self) -> StoredCopies | None:
        """The same copies with a compressed batch split into its records (None if the blob
        does not expand to ``count`` payloads: corruption)."""
        if not self.compression:
            return self
        payloads = expand_stored(self.blob, self.compression, self.count)
        if isinstance(payloads, Status):
            return None
        return StoredCopies(self.log_id, self.first_lsn, self.flags, self.wave,
                            _records(self.first_lsn, self.timestamp_ms, self.key, payloads),
                            self.producers)

    def producer_of(self, lsn: int) -> ProducerTag | None:
        """The tag of the append the record at ``lsn`` came from, if it had one."""
        for tag in self.producers:
            if tag[2] <= lsn <= tag[3]:
                return tag
        return None


_STORE_FIELD_NAMES = wire_field_names(Store)
_STORE_FIELD_DEFAULTS = tuple(
    f.default for f in dataclasses.fields(Store) if f.metadata.get("wire", True))
_STORE_FIELDS_COUNT_MIN = len(_STORE_FIELD_DEFAULTS) - next(
    (i for i, default in enumerate(reversed(_STORE_FIELD_DEFAULTS))
     if default is dataclasses.MISSING), len(_STORE_FIELD_DEFAULTS))
"""The fields before the trailing ones that have defaults: a body may leave out any of those
(an entry written before a field was added, or a sender that leaves trailing defaults out)."""
(_LOG_ID, _LSN, _WAVE, _NODE, _TIMESTAMP, _LNG, _KEY, _PAYLOADS, _FLAGS, _PRODUCERS,
 _COMPRESSION, _RECORDS) = (
    _STORE_FIELD_NAMES.index(name) for name in (
        "log_id", "lsn", "wave", "sequencer_node", "timestamp_ms", "last_known_good", "key",
        "payloads", "flags", "producers", "compression", "records"))


def _store_fields(body: bytes | memoryview) -> tuple[Any, ...] | None:
    """The field tuple of a STORE_FIELDS body (positions as in ``Store``), the defaults of
    fields added after it was written filled in, its top-level types checked; None if it is
    malformed. Positional on purpose: no ``Store`` is built on the read path."""
    try:
        fields = msgpack.unpackb(body, raw=False, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if type(fields) is not tuple:
        return None
    count = len(fields)
    if count != len(_STORE_FIELD_NAMES):
        if not _STORE_FIELDS_COUNT_MIN <= count < len(_STORE_FIELD_NAMES):
            return None
        fields = fields + _STORE_FIELD_DEFAULTS[count:]
        if dataclasses.MISSING in fields:
            return None
    payloads, key, compression = fields[_PAYLOADS], fields[_KEY], fields[_COMPRESSION]
    if not (_ints(fields[_LOG_ID], fields[_LSN], fields[_WAVE], fields[_TIMESTAMP],
                  fields[_LNG], fields[_FLAGS], compression, fields[_RECORDS])
            and type(payloads) is tuple and payloads and type(fields[_NODE]) is str
            and (key is None or type(key) is str)
            and all(type(payload) is bytes for payload in payloads)):
        return None
    if compression and (compression not in COMPRESSION_CODECS or len(payloads) != 1
                        or fields[_RECORDS] < 1):
        return None
    result: tuple[Any, ...] = fields
    return result


def decode_store_records(entry_type: EntryType, body: bytes | memoryview, *,
                         expand: bool = True) -> StoredCopies | None:
    """The records of a CRC-checked STORE or STORE_FIELDS body; None if malformed. A
    compressed batch is expanded unless ``expand`` is False (then see
    ``StoredCopies.compression``)."""
    if entry_type == EntryType.STORE_FIELDS:
        packed = _store_fields(body)
        if packed is None:
            return None
        tags = _producer_tags(packed[_PRODUCERS])
        if tags is None:
            return None
        first_lsn, timestamp_ms, key = packed[_LSN], packed[_TIMESTAMP], packed[_KEY]
        compression = packed[_COMPRESSION]
        if compression:
            block = StoredCopies(LogId(packed[_LOG_ID]), Lsn(first_lsn), packed[_FLAGS],
                                 packed[_WAVE], [], tags, compression, packed[_RECORDS],
                                 packed[_PAYLOADS][0], timestamp_ms, key)
            return block.expanded() if expand else block
        return StoredCopies(LogId(packed[_LOG_ID]), Lsn(first_lsn), packed[_FLAGS],
                            packed[_WAVE], _records(first_lsn, timestamp_ms, key,
                                                    packed[_PAYLOADS]), tags)
    if entry_type != EntryType.STORE:
        return None
    try:
        fields: Any = msgpack.unpackb(body, raw=False)
        flags = fields[10] if len(fields) >= 11 else 0
        producers = _producer_tags(fields[11]) if len(fields) >= 12 else ()
        compression = fields[12] if len(fields) == 13 else 0
        log_id, first_lsn, count, _node, timestamp_ms, _lng, wave, _cs, key, payloads = (
            fields[:10])
    except (ValueError, TypeError, IndexError, msgpack.UnpackException):
        return None
    if (not _ints(log_id, first_lsn, count, timestamp_ms, wave, flags, compression)
            or producers is None or type(payloads) is not list):
        return None
    if compression:
        if (compression not in COMPRESSION_CODECS or len(payloads) != 1 or count < 1
                or type(payloads[0]) is not bytes):
            return None
        block = StoredCopies(LogId(log_id), Lsn(first_lsn), flags, wave, [], producers,
                             compression, count, payloads[0], timestamp_ms, key)
        return block.expanded() if expand else block
    if len(payloads) != count:
        return None
    return StoredCopies(LogId(log_id), Lsn(first_lsn), flags, wave,
                        _records(first_lsn, timestamp_ms, key, payloads), producers)


def _records(first_lsn: int, timestamp_ms: int, key: str | None,
             payloads: list[bytes] | tuple[bytes, ...]) -> list[WireRecord]:
    return [(first_lsn + i, timestamp_ms, key, payload) for i, payload in enumerate(payloads)]


def scan_segment(data: bytes) -> SegmentScan:
    """Every good entry from the start of a segment up to the first bad one, or up to a zero
    tail (see the module docstring)."""
    entries: list[ScannedEntry] = []
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if data[offset] == 0 and zeros_from(data, offset):
            return SegmentScan(entries, offset, None, False, len(data) - offset)
        checked = check_entry(view, offset)
        meta = None
        if checked is not None:
            entry_type, body_bytes = checked
            body_start = offset + HEADER_BYTES
            meta = decode_meta(entry_type, view[body_start : body_start + body_bytes])
        if checked is None or meta is None:
            good_after = find_entry_after(data, offset + 1) is not None
            return SegmentScan(entries, offset, offset, good_after)
        length = HEADER_BYTES + checked[1]
        entries.append(ScannedEntry(offset, length, meta))
        offset += length
    return SegmentScan(entries, offset, None, False)


def zeros_from(data: bytes, offset: int) -> bool:
    """Every byte from ``offset`` to the end is zero (``bytes.count`` of one byte: no copy)."""
    return data.count(0, offset) == len(data) - offset


def find_entry_after(data: bytes, start: int) -> int | None:
    """Offset of the first well-formed entry at or after ``start``, if any."""
    position = data.find(_MAGIC_BYTES, start)
    while position != -1:
        if check_entry(data, position) is not None:
            return position
        position = data.find(_MAGIC_BYTES, position + 1)
    return None


def _codec(value: object) -> bool:
    return type(value) is int and value in COMPRESSION_CODECS


def _ints(*values: object) -> bool:
    return all(type(v) is int and v >= 0 for v in values)
