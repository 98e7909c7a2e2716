"""Per-segment index files: the on-disk half of the record index (format and parser, pure).

Next to each segment ``N.seg`` the record store keeps ``N.idx``: every index piece of that
segment (what the in-memory ``LogIndex`` of that one segment held: per log, disjoint
``[first_lsn, last_lsn]`` pieces sorted by first LSN, each pointing at an entry by offset and
length), so that a restart loads a few summary bytes per segment and per log instead of
scanning every entry, and memory holds only summaries plus a bounded cache of blocks.

Layout (little endian)::

    block* | directory (msgpack) | footer: magic:8s directory_offset:u64 directory_bytes:u32
                                          directory_crc32:u32

A block is up to ``BLOCK_PIECES_MAX`` pieces of one log as six int64 columns one after the
other (first_lsn, last_lsn, stored_first_lsn, offset, length, timestamp_ms), so loading one is
six ``array.frombytes`` (no object per piece). The directory is a msgpack map:

* ``segment``: the segment id; ``covered``: data bytes of the segment the file describes
  (an index written while the segment is still open covers only its first ``covered`` bytes:
  a restart scans the rest); ``final``: written after the segment was closed;
* ``chunk_crcs``: CRC32 of every ``CHUNK_BYTES`` of segment data up to ``covered`` (the last
  one partial), so that a restart can tell the file still describes these very bytes;
* ``logs``: every log with any entry (STORE, RELEASE, SEAL, TRIM, CHECKPOINT) in the covered
  bytes: the logs a reclaim of the segment must checkpoint first;
* ``runs``: ``[[log_id, [[file_offset, count, first_lsn, last_lsn, bytes, max_timestamp_ms,
  crc32], ...]], ...]``, one row per block (``last_lsn``: of its last piece, the highest;
  ``bytes``: sum of its pieces' entry lengths);
* ``state``: the record store's per-log state (``durable_state``) after folding every entry up
  to ``covered`` (the restart checkpoint: only entries after it are folded again).

Each block carries its CRC in the directory, the directory its CRC in the footer; an index
file that fails any check is ignored and its segment scanned instead (never trusted halfway).
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any

import msgpack
from isal import isal_zlib

MAGIC = b"SQIDX001"
_FOOTER = struct.Struct("<8sQII")
FOOTER_BYTES = _FOOTER.size
INDEX_SUFFIX = ".idx"
BLOCK_PIECES_MAX = 1024
"""Pieces per block: one block read is 48 KiB at most."""
PIECE_BYTES = 6 * 8
CHUNK_BYTES = 1024 * 1024
DIRECTORY_BYTES_MAX = 256 * 1024 * 1024
_LITTLE = sys.byteorder == "little"
_I64_MAX = 2**63 - 1


def index_name(segment_id: int) -> str:
    return f"{segment_id:09d}{INDEX_SUFFIX}"


class Columns:
    """Pieces as six parallel int64 arrays (a block, or one log's pieces being written)."""

    __slots__ = ("efirsts", "firsts", "lasts", "lengths", "offsets", "times")

    def __init__(self) -> None:
        self.firsts = array("q")
        self.lasts = array("q")
        self.efirsts = array("q")
        self.offsets = array("q")
        self.lengths = array("q")
        self.times = array("q")

    def columns(self) -> tuple[array[int], ...]:
        return (self.firsts, self.lasts, self.efirsts, self.offsets, self.lengths, self.times)

    def __len__(self) -> int:
        return len(self.firsts)

    def append(self, first: int, last: int, efirst: int, offset: int, length: int,
               time_ms: int) -> None:
        self.firsts.append(first)
        self.lasts.append(last)
        self.efirsts.append(efirst)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.times.append(time_ms)

    def nbytes(self) -> int:
        return len(self.firsts) * PIECE_BYTES + 6 * 64


@dataclass(frozen=True, slots=True)
class BlockRef:
    file_offset: int
    count: int
    first_lsn: int
    last_lsn: int
    bytes: int
    max_time_ms: int
    crc: int


@dataclass(frozen=True, slots=True)
class IndexDirectory:
    segment_id: int
    covered: int
    final: bool
    chunk_crcs: tuple[int, ...]
    logs: tuple[int, ...]
    runs: dict[int, tuple[BlockRef, ...]]
    state: bytes
    directory_offset: int


def encode_index(segment_id: int, covered: int, final: bool, chunk_crcs: list[int],
                 logs: list[int], runs: dict[int, Columns], state: bytes) -> bytes:
    """The whole file. ``runs``: per log, its pieces sorted by first LSN."""
    return encode_index_file(segment_id, covered, final, chunk_crcs, logs, runs, state)[0]


def encode_index_file(segment_id: int, covered: int, final: bool, chunk_crcs: list[int],
                      logs: list[int], runs: dict[int, Columns], state: bytes,
                      ) -> tuple[bytes, IndexDirectory]:
    """The whole file and its directory, built from what was encoded (no parse of the bytes
    just made). The directory's ``runs`` are filled only for a ``final`` file: the record
    store keeps a closed segment's directory, never a checkpoint's, and one ``BlockRef`` per
    block of every log the segment holds is work a checkpoint of many logs would pay for
    nothing."""
    parts: list[bytes] = []
    position = 0
    directory_runs: list[list[Any]] = []
    crc32 = isal_zlib.crc32
    for log_id in sorted(runs):
        pieces = runs[log_id]
        count = len(pieces)
        if not count:
            continue
        if count <= BLOCK_PIECES_MAX:
            # One block (nearly every log of a segment): the columns whole, no slices.
            data = b"".join([_column_bytes(column) for column in pieces.columns()])
            times = pieces.times
            directory_runs.append([log_id, [[
                position, count, pieces.firsts[0], pieces.lasts[-1], sum(pieces.lengths),
                max(times), crc32(data)]]])
            parts.append(data)
            position += len(data)
            continue
        blocks: list[list[int]] = []
        for start in range(0, count, BLOCK_PIECES_MAX):
            end = min(start + BLOCK_PIECES_MAX, count)
            data = b"".join(_column_bytes(column[start:end]) for column in pieces.columns())
            times = pieces.times[start:end]
            blocks.append([position, end - start, pieces.firsts[start], pieces.lasts[end - 1],
                           sum(pieces.lengths[start:end]), max(times), crc32(data)])
            parts.append(data)
            position += len(data)
        directory_runs.append([log_id, blocks])
    sorted_logs = sorted(logs)
    directory = msgpack.packb({
        "segment": segment_id, "covered": covered, "final": final,
        "chunk_crcs": chunk_crcs, "logs": sorted_logs, "runs": directory_runs,
        "state": state}, use_bin_type=True)
    parts.append(directory)
    parts.append(_FOOTER.pack(MAGIC, position, len(directory), crc32(directory)))
    parsed: dict[int, tuple[BlockRef, ...]] = {}
    if final:
        parsed = {log_id: tuple(BlockRef(*row) for row in blocks)
                  for log_id, blocks in directory_runs}
    return b"".join(parts), IndexDirectory(segment_id, covered, final, tuple(chunk_crcs),
                                           tuple(sorted_logs), parsed, state, position)


def decode_directory(footer: bytes, directory: bytes, file_bytes: int) -> IndexDirectory | None:
    """The directory, checked against its CRC and against the file's size; None if anything
    is off. ``footer``: the file's last ``FOOTER_BYTES``; ``directory``: the bytes that
    ``footer_position`` says (the caller reads them)."""
    position = footer_position(footer, file_bytes)
    if position is None or len(directory) != position[1]:
        return None
    directory_offset, _size, crc = position
    if isal_zlib.crc32(directory) != crc:
        return None
    try:
        document = msgpack.unpackb(directory, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError):
        return None
    return _directory(document, directory_offset)


def footer_position(footer: bytes, file_bytes: int) -> tuple[int, int, int] | None:
    """``(directory_offset, directory_bytes, directory_crc)`` from a footer, or None."""
    if len(footer) != FOOTER_BYTES:
        return None
    magic, offset, size, crc = _FOOTER.unpack(footer)
    if magic != MAGIC or size > DIRECTORY_BYTES_MAX or offset + size + FOOTER_BYTES != file_bytes:
        return None
    return offset, size, crc


def _directory(document: Any, directory_offset: int) -> IndexDirectory | None:
    if type(document) is not dict:
        return None
    segment_id = document.get("segment")
    covered = document.get("covered")
    final = document.get("final")
    chunk_crcs = document.get("chunk_crcs")
    logs = document.get("logs")
    runs = document.get("runs")
    state = document.get("state")
    if not (type(segment_id) is int and type(covered) is int and _uint(segment_id)
            and _uint(covered) and type(final) is bool and type(chunk_crcs) is list
            and type(logs) is list and type(runs) is list and type(state) is bytes):
        return None
    if len(chunk_crcs) != -(-covered // CHUNK_BYTES) or not all(
            type(c) is int and 0 <= c < 2**32 for c in chunk_crcs):
        return None
    if not all(_uint(log_id) for log_id in logs):
        return None
    parsed: dict[int, tuple[BlockRef, ...]] = {}
    for run in runs:
        if type(run) is not list or len(run) != 2 or not _uint(run[0]) or type(
                run[1]) is not list or not run[1] or run[0] in parsed:
            return None
        blocks: list[BlockRef] = []
        previous_last = -1
        for row in run[1]:
            if type(row) is not list or len(row) != 7 or not all(type(v) is int for v in row):
                return None
            file_offset, count, first, last, size, max_time, crc = row
            if not (file_offset >= 0 and 1 <= count <= BLOCK_PIECES_MAX
                    and file_offset + count * PIECE_BYTES <= directory_offset
                    and previous_last < first <= last <= _I64_MAX and 0 <= size <= _I64_MAX
                    and -1 <= max_time <= _I64_MAX and 0 <= crc < 2**32):
                return None
            previous_last = last
            blocks.append(BlockRef(file_offset, count, first, last, size, max_time, crc))
        parsed[run[0]] = tuple(blocks)
    return IndexDirectory(segment_id, covered, final, tuple(chunk_crcs), tuple(logs), parsed,
                          state, directory_offset)


def decode_block(data: bytes, ref: BlockRef) -> Columns | None:
    """A block's pieces, checked against its CRC and for order; None if damaged."""
    if len(data) != ref.count * PIECE_BYTES or isal_zlib.crc32(data) != ref.crc:
        return None
    block = Columns()
    size = ref.count * 8
    for index, column in enumerate(block.columns()):
        column.frombytes(data[index * size : (index + 1) * size])
        if not _LITTLE:
            column.byteswap()
    firsts, lasts, efirsts = block.firsts, block.lasts, block.efirsts
    if firsts[0] != ref.first_lsn or lasts[-1] != ref.last_lsn:
        return None
    previous = -1
    for first, last, efirst, offset, length in zip(firsts, lasts, efirsts, block.offsets,
                                                   block.lengths, strict=True):
        if not (previous < first <= last and 0 < efirst <= first and offset >= 0
                and length > 0):
            return None
        previous = last
    return block


def chunk_crcs(data: bytes | memoryview, start_chunk: int = 0) -> list[int]:
    """CRC32 of every ``CHUNK_BYTES`` of ``data`` from chunk ``start_chunk`` on."""
    view = memoryview(data)
    return [isal_zlib.crc32(view[offset : offset + CHUNK_BYTES])
            for offset in range(start_chunk * CHUNK_BYTES, len(view), CHUNK_BYTES)]


def _column_bytes(column: array[int]) -> bytes:
    if not _LITTLE:
        column = array("q", column)
        column.byteswap()
    return column.tobytes()


def _uint(value: object) -> bool:
    return type(value) is int and 0 <= value <= _I64_MAX
