"""Blocking file work of a reclaim pass: delete dead segments, rewrite mixed ones compacted.

Runs in the record store's reclaim thread, never on the event loop and never in the writer
thread (the writer only appends to the newest segment; reclaim only touches closed ones). The
record store has already written and fsynced a checkpoint of every log with entries in these
segments, so nothing but the entries copied here is needed from them.

Compaction of segment ``N``: pin the current file open (reads that located entries in it keep
reading it), copy the live entries, each CRC-checked, in their order to ``N.seg.compact``,
fsync it, rename it over ``N.seg`` (atomic), fsync the directory, then hand the new file to the
reader as the segment's next version. A crash before the rename leaves the old file (the
leftover copy is removed at open); after it, the new one, which holds every live entry in the
same order, so a restart rebuilds the same index. Deletion: pin, unlink, fsync the directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from shared import failpoints
from storage_node.segment_files import (
    COMPACT_SUFFIX,
    SegmentReader,
    fsync_dir,
    segment_name,
)
from storage_node.segment_format import check_entry

log = logging.getLogger(__name__)

FAILPOINT_AFTER_CHECKPOINT = "storage.reclaim_after_checkpoint"
FAILPOINT_BEFORE_RENAME = "storage.compact_before_rename"
COPY_CHUNK_BYTES = 1024 * 1024
"""Compaction writes its copy in chunks of about this size (one write call each)."""


@dataclass(frozen=True, slots=True)
class Compacted:
    segment_id: int
    old_version: int
    new_version: int
    moves: dict[int, int]
    """Old offset -> new offset of every entry copied."""
    old_bytes: int
    new_bytes: int


@dataclass(frozen=True, slots=True)
class Deleted:
    segment_id: int
    version: int
    file_bytes: int


@dataclass(frozen=True, slots=True)
class ReclaimDone:
    deleted: list[Deleted]
    compacted: list[Compacted]
    failed: list[int]
    """Segments left as they were (an I/O error, or a corrupt live entry)."""


def run_reclaim(segments_dir: str, reader: SegmentReader, delete: list[int],
                compact: list[tuple[int, list[tuple[int, int]]]]) -> ReclaimDone:
    """Delete the ``delete`` segments and compact each ``(segment_id, [(offset, length), ...
    live entries by offset])``."""
    failpoints.hit(FAILPOINT_AFTER_CHECKPOINT)
    deleted: list[Deleted] = []
    failed: list[int] = []
    for segment_id in delete:
        path = os.path.join(segments_dir, segment_name(segment_id))
        try:
            version = reader.pin(segment_id)
            size = os.stat(path).st_size
            os.unlink(path)
        except OSError as error:
            log.error("reclaim: cannot delete segment %d: %s", segment_id, error)
            failed.append(segment_id)
            continue
        reader.deleted(segment_id)
        deleted.append(Deleted(segment_id, version, size))
    if deleted:
        # Not needed for safety (a segment that comes back only holds trimmed records and is
        # deleted again), but the space and the index a restart rebuilds should match.
        try:
            fsync_dir(segments_dir)
        except OSError as error:
            log.error("reclaim: fsync of %s failed: %s", segments_dir, error)
    compacted: list[Compacted] = []
    for segment_id, entries in compact:
        try:
            done = _compact(segments_dir, reader, segment_id, entries)
        except OSError as error:
            log.error("reclaim: cannot compact segment %d: %s", segment_id, error)
            done = None
        if done is None:
            failed.append(segment_id)
        else:
            compacted.append(done)
    return ReclaimDone(deleted, compacted, failed)


def _compact(segments_dir: str, reader: SegmentReader, segment_id: int,
             entries: list[tuple[int, int]]) -> Compacted | None:
    path = os.path.join(segments_dir, segment_name(segment_id))
    tmp = path + COMPACT_SUFFIX
    old_version = reader.pin(segment_id)
    old_bytes = os.stat(path).st_size
    moves: dict[int, int] = {}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk: list[bytes] = []
        chunk_bytes = position = 0
        for offset, length in entries:
            data = reader.pread(segment_id, offset, length, old_version)
            checked = check_entry(data, 0)
            if checked is None or len(data) != length:
                # Copying a corrupt entry would hide it behind a fresh file; leave the
                # segment as it is (reads of it already fail over to other copies).
                log.error("reclaim: segment %d has a bad live entry at %d; not compacted",
                          segment_id, offset)
                os.close(fd)
                fd = -1
                os.unlink(tmp)
                return None
            moves[offset] = position
            position += length
            chunk.append(data)
            chunk_bytes += length
            if chunk_bytes >= COPY_CHUNK_BYTES:
                _write_all(fd, b"".join(chunk))
                chunk, chunk_bytes = [], 0
        if chunk:
            _write_all(fd, b"".join(chunk))
        os.fsync(fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    new_fd = os.open(tmp, os.O_RDONLY)
    try:
        failpoints.hit(FAILPOINT_BEFORE_RENAME)
        os.rename(tmp, path)
    except BaseException:
        os.close(new_fd)
        _unlink_quietly(tmp)
        raise
    new_version = reader.replaced(segment_id, new_fd)
    try:
        fsync_dir(segments_dir)
    except OSError as error:
        # The rename happened: the new file is the segment now, whatever a crash would keep
        # (either file holds every live entry).
        log.error("reclaim: fsync of %s after compacting segment %d failed: %s",
                  segments_dir, segment_id, error)
    return Compacted(segment_id, old_version, new_version, moves, old_bytes, position)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
