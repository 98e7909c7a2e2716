"""The file epoch store's journal format: pure encoding and decoding, no I/O.

A journal is a file header followed by frames. Every frame is one group commit (one write and
one fsync in ``epoch_store.backends.journal_file``) and carries the new value of every object
changed by that commit::

    header  = b"SEQLOGEJ" u32 format
    frame   = u32 payload_bytes, u32 crc32(payload), payload
    payload = record*
    record  = u8 kind=1 (metadata) u64 log_id u32 version u32 next_epoch u8 replication_factor
              u8 nodeset_size (u8 id_bytes id)* u8 writer_bytes (0: none) writer
            | u8 kind=2 (lce) u64 log_id u32 version u32 epoch u64 tail_lsn

Records hold whole values (never deltas), so the last record of an object is its value, and a
compacted journal is simply one record per object.

Bytes are untrusted (a crash can tear the last frame; an operator can hand-edit the file):
``scan`` never raises. A frame that is cut short or fails its CRC ends the readable journal.
When everything from it to the end of the file fits in one commit (``COMMIT_BYTES_MAX``), it is
the torn tail of a commit that never finished (its writer died before fsync returned, so nobody
was told it succeeded) and is ignored; anything longer, or a CRC-valid frame holding invalid
records, is corruption, which the store refuses to write over.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.limits import NODESET_SIZE_MAX
from shared.types import (
    EPOCH_MAX,
    EPOCH_MIN,
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
_META_HEAD = struct.Struct("<BQIIBB")
_LCE = struct.Struct("<BQIIQ")
_VERSION_MAX = 2**32 - 1

Record = LogMetadata | LastCleanEpoch


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
        ids = [n.encode() for n in value.nodeset]
        writer = b"" if value.last_writer is None else value.last_writer.encode()
        parts = [_META_HEAD.pack(KIND_METADATA, value.log_id, value.version, value.next_epoch,
                                 value.replication_factor, len(ids))]
        for node in ids:
            parts.append(bytes((len(node),)))
            parts.append(node)
        parts.append(bytes((len(writer),)))
        parts.append(writer)
        return b"".join(parts)
    return _LCE.pack(KIND_LCE, value.log_id, value.version, value.epoch, value.tail_lsn)


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


class _Bad(Exception):
    """A record that does not decode to a valid value (internal to ``decode_records``)."""


class Interned:
    """Nodesets and writers decoded so far, by their encoded bytes: each distinct one is
    validated once and stored once (a million logs on one nodeset share one tuple)."""

    def __init__(self) -> None:
        self.nodesets: dict[bytes, tuple[NodeId, ...]] = {}
        self.writers: dict[bytes, NodeId] = {}


def _node_ids(raw: bytes) -> list[str]:
    """The node ids of ``raw`` (u8 size, ASCII id, repeated), validated."""
    ids, pos = [], 0
    while pos < len(raw):
        end = pos + 1 + raw[pos]
        if end > len(raw):
            raise _Bad("node id past the end of the frame")
        try:
            text = raw[pos + 1:end].decode("ascii")
        except UnicodeDecodeError:
            raise _Bad("node id is not ASCII") from None
        if not node_id_valid(text):
            raise _Bad(f"bad node id {text!r}")
        ids.append(text)
        pos = end
    return ids


def _skip_ids(payload: bytes, pos: int, count: int) -> int:
    for _ in range(count):
        if pos >= len(payload):
            raise _Bad("node id cut short")
        pos += 1 + payload[pos]
    if pos > len(payload):
        raise _Bad("node id past the end of the frame")
    return pos


def _metadata(payload: bytes, pos: int, interned: Interned) -> tuple[LogMetadata, int]:
    if pos + _META_HEAD.size > len(payload):
        raise _Bad("metadata record cut short")
    _, log_id, version, next_epoch, factor, count = _META_HEAD.unpack_from(payload, pos)
    pos += _META_HEAD.size
    if not 0 < count <= NODESET_SIZE_MAX:
        raise _Bad(f"bad nodeset size {count}")
    end = _skip_ids(payload, pos, count)
    raw = payload[pos:end]
    nodeset = interned.nodesets.get(raw)
    if nodeset is None:
        ids = _node_ids(raw)
        if len(set(ids)) != len(ids):
            raise _Bad("duplicate node in nodeset")
        nodeset = interned.nodesets[raw] = tuple(NodeId(n) for n in ids)
    pos = _skip_ids(payload, end, 1)
    writer: NodeId | None = None
    if pos - end > 1:
        raw = payload[end:pos]
        writer = interned.writers.get(raw)
        if writer is None:
            writer = interned.writers[raw] = NodeId(_node_ids(raw)[0])
    if not log_id_valid(log_id) or version < 1:
        raise _Bad(f"bad log id {log_id} or version {version}")
    if not EPOCH_MIN <= next_epoch <= EPOCH_MAX or not 1 <= factor <= count:
        raise _Bad(f"bad next_epoch {next_epoch} or replication factor {factor}")
    return LogMetadata(log_id=LogId(log_id), next_epoch=Epoch(next_epoch), nodeset=nodeset,
                       replication_factor=factor, last_writer=writer, version=version), pos


def _lce(payload: bytes, pos: int) -> tuple[LastCleanEpoch, int]:
    if pos + _LCE.size > len(payload):
        raise _Bad("lce record cut short")
    _, log_id, version, epoch, tail_lsn = _LCE.unpack_from(payload, pos)
    if not log_id_valid(log_id) or version < 1 or not epoch_valid(epoch):
        raise _Bad(f"bad log id {log_id}, version {version} or epoch {epoch}")
    if not lsn_valid(tail_lsn) or lsn_to_epoch(Lsn(tail_lsn)) > epoch:
        raise _Bad(f"bad tail lsn {tail_lsn}")
    return LastCleanEpoch(log_id=LogId(log_id), epoch=Epoch(epoch), tail_lsn=Lsn(tail_lsn),
                          version=version), pos + _LCE.size


def decode_records(
    payload: bytes, interned: Interned | None = None
) -> list[Record] | str:
    """The records of one frame's payload, or why it holds an invalid one."""
    interned = interned or Interned()
    out: list[Record] = []
    pos = 0
    try:
        while pos < len(payload):
            kind = payload[pos]
            if kind == KIND_METADATA:
                meta, pos = _metadata(payload, pos, interned)
                out.append(meta)
            elif kind == KIND_LCE:
                lce, pos = _lce(payload, pos)
                out.append(lce)
            else:
                return f"unknown record kind {kind} at payload offset {pos}"
    except _Bad as exc:
        return f"{exc} (payload offset {pos})"
    return out


@dataclass(frozen=True, slots=True)
class Scan:
    """What ``scan`` found in ``data`` (bytes of a journal from some frame boundary on)."""

    records: list[Record]
    valid_bytes: int
    """Bytes of whole, valid frames from the start of ``data``: where the next frame goes."""
    torn_bytes: int
    """Bytes after ``valid_bytes`` that are the torn tail of an unfinished commit."""
    problem: str | None
    """Corruption that stops the journal (not a torn tail), or None."""


def scan(
    data: bytes, interned: Interned | None = None
) -> Scan:
    """The valid frames at the start of ``data`` and how the rest looks. Never raises."""
    records: list[Record] = []
    pos = 0
    end = len(data)
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
            else:
                payload = data[pos + FRAME_HEADER.size:body_end]
                if zlib.crc32(payload) != crc:
                    bad = "frame CRC mismatch"
                else:
                    decoded = decode_records(payload, interned)
                    if isinstance(decoded, str):
                        return Scan(records, pos, 0, f"invalid record at byte {pos}: {decoded}")
                    records.extend(decoded)
                    pos = body_end
                    continue
        rest = end - pos
        if rest <= FRAME_HEADER.size + COMMIT_BYTES_MAX:
            return Scan(records, pos, rest, None)
        return Scan(records, pos, 0, f"{bad} at byte {pos}, {rest} bytes before the end")
    return Scan(records, pos, 0, None)
