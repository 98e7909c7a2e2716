"""The file epoch store's journal format: pure encoding and decoding, no I/O.

A journal is a file header followed by frames. Every frame is one group commit (one write and
one fsync in ``epoch_store.backends.journal_file``) and carries the new value of every object
changed by that commit::

    header  = b"SEQLOGEJ" u32 format
    frame   = u32 payload_bytes, u32 crc32(payload), payload
    payload = record*
    record  = u16 record_bytes u8 kind u64 log_id body
    body    = (kind 1, metadata) u32 version u32 next_epoch u8 replication_factor
                  u8 nodeset_size (u8 id_bytes id)* u8 writer_bytes (0: none) writer
                  [u32 nodeset_since u8 earlier_count
                   (u32 first_epoch u8 replication_factor u8 nodeset_size (u8 id_bytes id)*)*]
            | (kind 2, lce) u32 version u32 epoch u64 tail_lsn

The bracketed part is there only once a log's nodeset changed (see
``shared.epoch_metadata``); a record without it has one nodeset from epoch 1 on, as every
record written before nodesets could change.

Records hold whole values (never deltas), so the last record of an object is its value, and a
compacted journal is simply one record per object. Records are kept in memory as these bytes,
both of a log's in one bytes object (a million logs take about 200 MB), and are decoded and
validated when read; ``scan`` only splits frames into records, which keeps loading a large
journal fast (1.4 s of CPU for a million logs).

Bytes are untrusted (a crash can tear the last frame; an operator can hand-edit the file):
nothing here raises on bad input. A frame that is cut short or fails its CRC ends the readable
journal. When everything from it to the end of the file fits in one commit
(``COMMIT_BYTES_MAX``), it is the torn tail of a commit that never finished (its writer died
before fsync returned, so nobody was told it succeeded) and is ignored; anything longer, or a
CRC-valid frame that does not split into records, is corruption, which the store refuses to
write over. A record that splits but does not decode to a valid value makes its log's object
unreadable (``INTERNAL``) and leaves the other logs alone.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from shared.epoch_metadata import NODESET_HISTORY_MAX, EpochNodeset, LastCleanEpoch, LogMetadata
from shared.limits import NODESET_SIZE_MAX
from shared.types import (
    EPOCH_MAX,
    EPOCH_MIN,
    LOG_ID_MAX,
    Epoch,
    LogId,
    Lsn,
    NodeId,
    epoch_valid,
    log_id_valid,
    lsn_to_epoch,
    lsn_valid,
    node_id_valid,
)

MAGIC = b"SEQLOGEJ"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sI")
FRAME_HEADER = struct.Struct("<II")
COMMIT_BYTES_MAX = 4 * 1024 * 1024
"""Most payload bytes of one frame, hence of one commit; a torn tail is never longer than one
frame."""

KIND_METADATA = 1
KIND_LCE = 2
RECORD_HEAD = struct.Struct("<HBQ")
_META_BODY = struct.Struct("<IIBB")
_LCE_BODY = struct.Struct("<IIQ")
_RANGES_HEAD = struct.Struct("<IB")
_RANGE_HEAD = struct.Struct("<IBB")

Record = LogMetadata | LastCleanEpoch
Objects = dict[LogId, bytes]
"""Each log's current records, encoded: its metadata record (if any) followed by its last clean
epoch record (if any), in one bytes object (one object and one dict entry per log)."""


def header() -> bytes:
    return HEADER.pack(MAGIC, FORMAT_VERSION)


def check_header(raw: bytes) -> str | None:
    """Why ``raw`` (the first ``HEADER.size`` bytes) is not a journal header, or None."""
    if len(raw) < HEADER.size:
        return "file shorter than its header"
    magic, version = HEADER.unpack_from(raw)
    if magic != MAGIC:
        return "not an epoch store journal"
    if version != FORMAT_VERSION:
        return f"unknown journal format {version}"
    return None


def encode_record(value: Record) -> bytes:
    if isinstance(value, LogMetadata):
        parts = [b"", _META_BODY.pack(value.version, value.next_epoch,
                                      value.replication_factor, len(value.nodeset))]
        for node in value.nodeset:
            raw = node.encode()
            parts.append(bytes((len(raw),)) + raw)
        writer = b"" if value.last_writer is None else value.last_writer.encode()
        parts.append(bytes((len(writer),)) + writer)
        if value.nodeset_since != EPOCH_MIN or value.earlier:
            parts.append(_RANGES_HEAD.pack(value.nodeset_since, len(value.earlier)))
            for earlier in value.earlier:
                parts.append(_RANGE_HEAD.pack(earlier.first_epoch, earlier.replication_factor,
                                              len(earlier.nodeset)))
                parts.extend(bytes((len(n.encode()),)) + n.encode() for n in earlier.nodeset)
        body = b"".join(parts)
        return RECORD_HEAD.pack(RECORD_HEAD.size + len(body), KIND_METADATA, value.log_id) + body
    body = _LCE_BODY.pack(value.version, value.epoch, value.tail_lsn)
    return RECORD_HEAD.pack(RECORD_HEAD.size + len(body), KIND_LCE, value.log_id) + body


def encode_frame(payload: bytes) -> bytes:
    assert 0 < len(payload) <= COMMIT_BYTES_MAX, len(payload)
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def encode_frames(records: list[bytes]) -> list[bytes]:
    """``records`` (each from ``encode_record``) packed into as few frames as fit."""
    frames: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for record in records:
        if chunk and size + len(record) > COMMIT_BYTES_MAX:
            frames.append(encode_frame(b"".join(chunk)))
            chunk, size = [], 0
        chunk.append(record)
        size += len(record)
    if chunk:
        frames.append(encode_frame(b"".join(chunk)))
    return frames


def split_records(payload: bytes, objects: Objects) -> str | None:
    """Store each record of one frame's payload in ``objects`` (later ones win); None, or why
    the payload does not split into records (then nothing was stored)."""
    found: list[tuple[int, bytes]] = []
    pos, end = 0, len(payload)
    unpack = RECORD_HEAD.unpack_from
    while pos < end:
        if end - pos < RECORD_HEAD.size:
            return f"record head cut short at payload offset {pos}"
        size, kind, log_id = unpack(payload, pos)
        if size < RECORD_HEAD.size or pos + size > end:
            return f"bad record size {size} at payload offset {pos}"
        if kind != KIND_METADATA and kind != KIND_LCE:
            return f"unknown record kind {kind} at payload offset {pos}"
        if not 0 < log_id <= LOG_ID_MAX:
            return f"bad log id {log_id} at payload offset {pos}"
        found.append((log_id, payload[pos:pos + size]))
        pos += size
    for log_id, raw in found:
        objects[LogId(log_id)] = merged(objects.get(LogId(log_id)), raw)
    return None


def merged(current: bytes | None, raw: bytes) -> bytes:
    """A log's records ``current`` with the record ``raw`` replacing the one of its kind."""
    if current is None:
        return raw
    metadata, lce = split_log(current)
    if raw[2] == KIND_METADATA:
        return raw if lce is None else raw + lce
    return raw if metadata is None else metadata + raw


def split_log(value: bytes) -> tuple[bytes | None, bytes | None]:
    """A log's metadata and last clean epoch records out of its ``Objects`` value (built by
    ``merged`` from records ``split_records`` checked, so it always splits)."""
    if value[2] == KIND_METADATA:
        size = value[0] | value[1] << 8
        return value[:size], value[size:] or None
    return None, value


class Interned:
    """Nodesets and writers decoded so far, by their encoded bytes: each distinct one is
    validated once and stored once (a million logs on one nodeset share one tuple)."""

    def __init__(self) -> None:
        self.nodesets: dict[bytes, tuple[NodeId, ...]] = {}
        self.writers: dict[bytes, NodeId] = {}


class _Bad(Exception):
    """A record that does not decode to a valid value (internal to the decoders)."""


def _node_ids(raw: bytes) -> list[str]:
    """The node ids of ``raw`` (u8 size, ASCII id, repeated), validated."""
    ids, pos = [], 0
    while pos < len(raw):
        end = pos + 1 + raw[pos]
        if end > len(raw):
            raise _Bad("node id past the end of the record")
        try:
            text = raw[pos + 1:end].decode("ascii")
        except UnicodeDecodeError:
            raise _Bad("node id is not ASCII") from None
        if not node_id_valid(text):
            raise _Bad(f"bad node id {text!r}")
        ids.append(text)
        pos = end
    return ids


def _skip_ids(raw: bytes, pos: int, count: int) -> int:
    for _ in range(count):
        if pos >= len(raw):
            raise _Bad("node id cut short")
        pos += 1 + raw[pos]
    if pos > len(raw):
        raise _Bad("node id past the end of the record")
    return pos


def _check_head(raw: bytes, kind: int, log_id: LogId) -> None:
    if len(raw) < RECORD_HEAD.size:
        raise _Bad("record head cut short")
    size, stored_kind, stored_log = RECORD_HEAD.unpack_from(raw)
    if size != len(raw) or stored_kind != kind or stored_log != log_id:
        raise _Bad(f"record of kind {stored_kind}, log {stored_log}, {size} bytes")


def decode_metadata(raw: bytes, log_id: LogId, interned: Interned) -> LogMetadata | str:
    """The metadata of ``log_id`` in the record ``raw``, or why it is not valid."""
    try:
        _check_head(raw, KIND_METADATA, log_id)
        pos = RECORD_HEAD.size
        if len(raw) < pos + _META_BODY.size:
            raise _Bad("metadata record cut short")
        version, next_epoch, factor, count = _META_BODY.unpack_from(raw, pos)
        pos += _META_BODY.size
        if not 0 < count <= NODESET_SIZE_MAX:
            raise _Bad(f"bad nodeset size {count}")
        end = _skip_ids(raw, pos, count)
        ids_raw = raw[pos:end]
        nodeset = interned.nodesets.get(ids_raw)
        if nodeset is None:
            ids = _node_ids(ids_raw)
            if len(set(ids)) != len(ids):
                raise _Bad("duplicate node in nodeset")
            nodeset = interned.nodesets[ids_raw] = tuple(NodeId(n) for n in ids)
        pos = _skip_ids(raw, end, 1)
        since: Epoch = Epoch(EPOCH_MIN)
        earlier: tuple[EpochNodeset, ...] = ()
        if pos != len(raw):
            since, earlier = _decode_ranges(raw, pos, next_epoch, interned)
        writer: NodeId | None = None
        if pos - end > 1:
            writer_raw = raw[end:pos]
            writer = interned.writers.get(writer_raw)
            if writer is None:
                writer = interned.writers[writer_raw] = NodeId(_node_ids(writer_raw)[0])
        if not log_id_valid(log_id) or version < 1:
            raise _Bad(f"bad log id {log_id} or version {version}")
        if not EPOCH_MIN <= next_epoch <= EPOCH_MAX or not 1 <= factor <= count:
            raise _Bad(f"bad next_epoch {next_epoch} or replication factor {factor}")
    except _Bad as exc:
        return str(exc)
    return LogMetadata(log_id=log_id, next_epoch=Epoch(next_epoch), nodeset=nodeset,
                       replication_factor=factor, last_writer=writer, version=version,
                       nodeset_since=since, earlier=earlier)


def _nodeset_at(raw: bytes, pos: int, count: int, interned: Interned
                ) -> tuple[tuple[NodeId, ...], int]:
    if not 0 < count <= NODESET_SIZE_MAX:
        raise _Bad(f"bad nodeset size {count}")
    end = _skip_ids(raw, pos, count)
    ids_raw = raw[pos:end]
    nodeset = interned.nodesets.get(ids_raw)
    if nodeset is None:
        ids = _node_ids(ids_raw)
        if len(set(ids)) != len(ids):
            raise _Bad("duplicate node in nodeset")
        nodeset = interned.nodesets[ids_raw] = tuple(NodeId(n) for n in ids)
    return nodeset, end


def _decode_ranges(raw: bytes, pos: int, next_epoch: int, interned: Interned
                   ) -> tuple[Epoch, tuple[EpochNodeset, ...]]:
    """``nodeset_since`` and the earlier nodesets stored from ``pos`` to the record's end."""
    if len(raw) < pos + _RANGES_HEAD.size:
        raise _Bad("nodeset ranges cut short")
    since, count = _RANGES_HEAD.unpack_from(raw, pos)
    pos += _RANGES_HEAD.size
    if not EPOCH_MIN <= since <= next_epoch or count > NODESET_HISTORY_MAX:
        raise _Bad(f"bad nodeset_since {since} or earlier count {count}")
    if (count == 0) != (since == EPOCH_MIN):
        raise _Bad(f"nodeset_since {since} with {count} earlier nodesets")
    ranges: list[EpochNodeset] = []
    bound = EPOCH_MIN
    for _ in range(count):
        if len(raw) < pos + _RANGE_HEAD.size:
            raise _Bad("earlier nodeset cut short")
        first, factor, size = _RANGE_HEAD.unpack_from(raw, pos)
        pos += _RANGE_HEAD.size
        if first < bound or first >= since or (not ranges and first != EPOCH_MIN):
            raise _Bad(f"bad earlier first_epoch {first}")
        nodeset, pos = _nodeset_at(raw, pos, size, interned)
        if not 1 <= factor <= size:
            raise _Bad(f"bad earlier replication factor {factor}")
        ranges.append(EpochNodeset(Epoch(first), nodeset, factor))
        bound = first + 1
    if pos != len(raw):
        raise _Bad("bytes after the nodeset ranges")
    return Epoch(since), tuple(ranges)


def decode_lce(raw: bytes, log_id: LogId) -> LastCleanEpoch | str:
    """The last clean epoch of ``log_id`` in the record ``raw``, or why it is not valid."""
    try:
        _check_head(raw, KIND_LCE, log_id)
        if len(raw) != RECORD_HEAD.size + _LCE_BODY.size:
            raise _Bad("lce record of the wrong size")
        version, epoch, tail_lsn = _LCE_BODY.unpack_from(raw, RECORD_HEAD.size)
        if not log_id_valid(log_id) or version < 1 or not epoch_valid(epoch):
            raise _Bad(f"bad log id {log_id}, version {version} or epoch {epoch}")
        if not lsn_valid(tail_lsn) or lsn_to_epoch(Lsn(tail_lsn)) > epoch:
            raise _Bad(f"bad tail lsn {tail_lsn}")
    except _Bad as exc:
        return str(exc)
    return LastCleanEpoch(log_id=log_id, epoch=Epoch(epoch), tail_lsn=Lsn(tail_lsn),
                          version=version)


@dataclass(frozen=True, slots=True)
class Scan:
    """What ``scan`` found in ``data`` (bytes of a journal from some frame boundary on)."""

    valid_bytes: int
    """Bytes of whole, valid frames from the start of ``data``: where the next frame goes."""
    torn_bytes: int
    """Bytes after ``valid_bytes`` that are the torn tail of an unfinished commit."""
    problem: str | None
    """Corruption that stops the journal (not a torn tail), or None."""


def scan(data: bytes, objects: Objects) -> Scan:
    """Store the records of the valid frames at the start of ``data`` in ``objects``, and say
    how the rest looks. Never raises."""
    pos = 0
    end = len(data)
    view = memoryview(data)
    while pos < end:
        bad: str | None = None
        if end - pos < FRAME_HEADER.size:
            bad = "frame header cut short"
        else:
            size, crc = FRAME_HEADER.unpack_from(data, pos)
            body_end = pos + FRAME_HEADER.size + size
            if not 0 < size <= COMMIT_BYTES_MAX:
                bad = f"bad frame size {size}"
            elif body_end > end:
                bad = "frame cut short"
            elif zlib.crc32(view[pos + FRAME_HEADER.size:body_end]) != crc:
                bad = "frame CRC mismatch"
            else:
                problem = split_records(data[pos + FRAME_HEADER.size:body_end], objects)
                if problem is not None:
                    return Scan(pos, 0, f"invalid frame at byte {pos}: {problem}")
                pos = body_end
                continue
        rest = end - pos
        if rest <= FRAME_HEADER.size + COMMIT_BYTES_MAX:
            return Scan(pos, rest, None)
        return Scan(pos, 0, f"{bad} at byte {pos}, {rest} bytes before the end")
    return Scan(pos, 0, None)
