"""Blocking file I/O on the per-segment index files (``segment_index`` is the format).

Writes go to ``N.idx.tmp``, are fsynced, renamed over ``N.idx`` and the directory fsynced,
so an index file is either the old one or the new one whole. Every load checks the footer,
the directory's CRC and the segment it describes; a file that fails is ignored (its segment
is scanned instead) and replaced by the next write. Called from the record store's index
thread, its reclaim thread, and at open.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable

from shared.types import LogId
from storage_node.record_index import Location
from storage_node.segment_files import fsync_dir
from storage_node.segment_index import (
    CHUNK_BYTES,
    FOOTER_BYTES,
    Columns,
    IndexDirectory,
    chunk_crcs,
    decode_block,
    decode_directory,
    encode_index_file,
    footer_position,
    index_name,
)

log = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"


def index_path(segments_dir: str, segment_id: int) -> str:
    return os.path.join(segments_dir, index_name(segment_id))


def load_directory(segments_dir: str, segment_id: int) -> tuple[IndexDirectory, int] | None:
    """The directory of ``N.idx`` and a read-only descriptor of it; None when there is none
    or it fails its checks."""
    path = index_path(segments_dir, segment_id)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < FOOTER_BYTES:
            raise ValueError("short")
        footer = os.pread(fd, FOOTER_BYTES, size - FOOTER_BYTES)
        position = footer_position(footer, size)
        if position is None:
            raise ValueError("bad footer")
        directory_bytes = os.pread(fd, position[1], position[0])
        directory = decode_directory(footer, directory_bytes, size)
        if directory is None or directory.segment_id != segment_id:
            raise ValueError("bad directory")
    except (OSError, ValueError) as error:
        os.close(fd)
        log.warning("index file %s is unusable (%s): its segment is scanned instead", path,
                    error)
        return None
    return directory, fd


def read_pieces(fd: int, directory: IndexDirectory) -> dict[int, Columns] | None:
    """Every piece of the file, per log; None if a block is damaged."""
    runs: dict[int, Columns] = {}
    for log_id, blocks in directory.runs.items():
        pieces = Columns()
        for ref in blocks:
            block = decode_block(os.pread(fd, ref.count * 48, ref.file_offset), ref)
            if block is None:
                return None
            for mine, theirs in zip(pieces.columns(), block.columns(), strict=True):
                mine.extend(theirs)
        runs[log_id] = pieces
    return runs


def columns_of(snapshot: dict[LogId, list[Location]]) -> dict[int, Columns]:
    runs: dict[int, Columns] = {}
    for log_id, locations in snapshot.items():
        if not locations:
            continue
        pieces = runs[log_id] = Columns()
        append = pieces.append
        for loc in locations:
            append(loc.first_lsn, loc.last_lsn, loc.entry_first_lsn or loc.first_lsn,
                   loc.offset, loc.length, loc.timestamp_ms)
    return runs


def segment_chunk_crcs(segment_path: str, covered: int, known: list[int]) -> list[int]:
    """CRCs of the segment's chunks up to ``covered``; ``known``: those of its first complete
    chunks, computed before (a segment only grows while it is written)."""
    complete = min(len(known), covered // CHUNK_BYTES)
    start = complete * CHUNK_BYTES
    with open(segment_path, "rb") as file:
        file.seek(start)
        data = file.read(covered - start)
    if len(data) != covered - start:
        raise OSError(f"{segment_path} is shorter than {covered} bytes")
    return known[:complete] + chunk_crcs(data)


def write_index(segments_dir: str, segment_id: int, covered: int, final: bool,
                crcs: list[int], logs: Iterable[int], runs: dict[int, Columns],
                state: bytes) -> tuple[IndexDirectory, int]:
    """Write ``N.idx`` durably (atomic replace); returns its directory (with its runs only
    when ``final``: ``encode_index_file``) and a read-only descriptor of the new file."""
    data, directory = encode_index_file(segment_id, covered, final, crcs, sorted(logs), runs,
                                        state)
    path = index_path(segments_dir, segment_id)
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    read_fd = os.open(tmp, os.O_RDONLY)
    try:
        os.rename(tmp, path)
        fsync_dir(segments_dir)
    except BaseException:
        os.close(read_fd)
        raise
    return directory, read_fd


def remove_index(segments_dir: str, segment_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(index_path(segments_dir, segment_id))
