"""The precedence of copies this node already indexes, read from their segments (issue 17).

The index keeps no flags or wave, so where a donor's REBUILD_STORE copy that could outrank a
copy the node holds collides with one (``storage_node.core.rebuild_accept.contested``), the
node being rebuilt reads the held copy's entry to learn its precedence; a donor's copy of
higher precedence then replaces it (``rebuild_accept.outranked``). Reads run in the record
store's read threads (``RecordStore.read_entries``, safe against reclaim), only on such a
collision, over at most one slice's ranges (``rebuild_runtime.REBUILD_SLICE_ENTRIES``).

Each copy read comes with its key (segment, offset, file version): the driver checks that the
index still resolves those LSNs to the same copy before it lets the donor's replace it, so a
copy written while the read ran is never overwritten on the strength of an older one's
precedence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shared.types import LogId, Lsn
from shared.wire.store import copy_precedence
from storage_node.core.rebuild_accept import HeldCopy
from storage_node.record_index import Location
from storage_node.segment_files import SegmentReader
from storage_node.segment_format import HEADER_BYTES, check_entry, decode_store_records

if TYPE_CHECKING:
    from storage_node.record_store import RecordStore

log = logging.getLogger(__name__)

CopyKey = tuple[int, int, int]
"""Which copy: segment id, offset, file version (compaction moves entries: another key)."""


_reads: set[asyncio.Task[list[HeldCopy]]] = set()
"""Reads under way (a task must be referenced until it is done)."""


def key_of(location: Location) -> CopyKey:
    return (location.segment_id, location.offset, location.version)


def read_precedences(reader: SegmentReader, log_id: LogId, locations: list[Location]
                     ) -> list[HeldCopy]:
    """The precedence of the entries at ``locations``. An entry that cannot be read or does
    not check is left out: it keeps blocking the donor's copy, as before (a read of it
    reports the damage, and the damaged range is then written over)."""
    found: list[HeldCopy] = []
    for location in locations:
        try:
            data = reader.pread(location.segment_id, location.offset, location.length,
                                location.version)
        except OSError as error:
            log.error("precedence read of segment %d failed: %s", location.segment_id, error)
            continue
        checked = check_entry(data, 0)
        if checked is None or len(data) != location.length:
            continue
        decoded = decode_store_records(checked[0], memoryview(data)[HEADER_BYTES:],
                                       expand=False)
        if decoded is None or decoded.log_id != log_id:
            continue
        found.append((int(location.first_lsn), int(location.last_lsn),
                      copy_precedence(decoded.flags, decoded.wave), key_of(location)))
    return found


def read_held(store: RecordStore, log_id: LogId, ranges: Sequence[tuple[int, int]],
              done: Callable[[list[HeldCopy]], None]) -> None:
    """Read the precedence of the copies indexed in ``ranges`` off the loop, then
    ``done(copies)`` on it (an empty list if the store is closing or the read failed)."""

    async def read() -> list[HeldCopy]:
        found: list[HeldCopy] = []
        for first, last in ranges:
            copies, _ = await store.read_entries(log_id, Lsn(first), Lsn(last),
                                                 last - first + 1, read_precedences)
            if copies:
                found.extend(copies)
        return found

    task = asyncio.get_running_loop().create_task(read())
    _reads.add(task)

    def finished(task: asyncio.Task[list[HeldCopy]]) -> None:
        _reads.discard(task)
        if task.cancelled():
            done([])
        elif (error := task.exception()) is not None:
            log.error("log %d: reading the precedence of held copies failed: %r", log_id, error)
            done([])
        else:
            done(task.result())

    task.add_done_callback(finished)
