"""What a damaged segment held, from its index file: the scope of its mini-rebuild.

When the start-up scan or the background scrub finds a bad entry in the middle of a segment,
nothing after it is indexed and the entry boundaries there cannot be trusted, so the node
cannot tell from the segment which copies it lost. Its index file can: written by this node
from its own in-memory index (not from the bytes on disk), its directory and blocks list
every piece the segment held, per log, with its LSNs. That is the scope
(``storage_node.core.rebuild_scope.segment_scope``: per log, its first to its last LSN there)
when the file passes its own checks and covers every byte of the segment: a segment with
bytes past what its index file covers (the newest one, written after its last checkpoint) or
without a usable index file held copies nobody can name, and its scope is the whole shard
(None).

Blocking (reads the index file and the segment's tail): call from a thread, or on the loop
only after a failure, as ``record_store`` does with damage.
"""

from __future__ import annotations

import contextlib
import logging
import os

from storage_node.core.authority import AuthorityStatus
from storage_node.core.rebuild_scope import Scope, merged, segment_scope
from storage_node.index_files import load_directory, read_pieces
from storage_node.segment_files import segment_name

log = logging.getLogger(__name__)

_TAIL_READ_BYTES = 1024 * 1024


def report_damaged(authority: AuthorityStatus, segments_dir: str,
                   segment_ids: frozenset[int]) -> bool:
    """``authority.segments_damaged`` for ``segment_ids``, with the scope of those not known
    damaged already (their index files read only then); whether anything changed."""
    new = segment_ids - authority.damaged_segments
    if not new:
        return False
    scope: Scope = ()
    for segment_id in sorted(new):
        scope = merged(scope, segment_scope_of(segments_dir, segment_id))
    return authority.segments_damaged(segment_ids, scope)


def segment_scope_of(segments_dir: str, segment_id: int) -> Scope:
    """The scope of damaged segment ``segment_id`` (module docstring); None when unknown."""
    loaded = load_directory(segments_dir, segment_id)
    if loaded is None:
        log.error("segment %d is damaged and has no usable index file: what it held is "
                  "unknown, the whole shard is rebuilt", segment_id)
        return None
    directory, fd = loaded
    try:
        if not _nothing_after(os.path.join(segments_dir, segment_name(segment_id)),
                              directory.covered):
            log.error("segment %d is damaged and holds entries its index file does not "
                      "cover: the whole shard is rebuilt", segment_id)
            return None
        pieces = read_pieces(fd, directory)
    except OSError as error:
        log.error("segment %d: cannot read what it held (%s): the whole shard is rebuilt",
                  segment_id, error)
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if pieces is None:
        log.error("segment %d: its index file is damaged too: the whole shard is rebuilt",
                  segment_id)
        return None
    scope = segment_scope({log_id: zip(columns.firsts, columns.lasts, strict=True)
                           for log_id, columns in pieces.items()})
    if scope is not None:
        log.warning("segment %d is damaged: it held %d logs' copies; they are "
                    "mini-rebuilt", segment_id, len(scope))
    return scope


def _nothing_after(path: str, covered: int) -> bool:
    """Every byte of the file from ``covered`` on is zero (or there is none): nothing was
    written after what the index file covers (zeros are space filled ahead of writes)."""
    with open(path, "rb") as file:
        file.seek(covered)
        while chunk := file.read(_TAIL_READ_BYTES):
            if chunk.count(0) != len(chunk):
                return False
    return True
