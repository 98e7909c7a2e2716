"""Reads of records out of the segment files: pread, CRC check, split batches into records.

Runs in the record store's read threads. A corrupt entry is never served: the records before
it are returned, or, if it comes first, the read fails with CHECKSUM_MISMATCH so that the
reader turns to another copy.

A compressed batch entry (``segment_format``) goes to a READ as one block, its blob as stored,
when the read takes all of it: the index still resolves every one of its LSNs to it (no later
copy or trim point covers part of it) and it lies within the read's range and limits (a block
counts its records against ``records_max`` and the plain size its frame header announces
against ``bytes_max``; one that does not fit after other records ends the read before it, so
that the next read takes it whole). Otherwise, and for digests, it is expanded here and sliced
like any batch: at most one entry's worth of expansion per entry read, bounded by
``COMPRESSED_BATCH_PLAIN_BYTES_MAX``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shared.compression import plain_bytes
from shared.status import Status
from shared.types import LogId, Lsn
from shared.wire.read import Block, Marker, WireRecord
from shared.wire.store import ProducerTag, RecordFlags
from storage_node.record_index import Location
from storage_node.segment_files import SegmentReader
from storage_node.segment_format import (
    HEADER_BYTES,
    StoredCopies,
    check_entry,
    decode_store_records,
)

log = logging.getLogger(__name__)


Copy = tuple[int, int, str | None, bytes, int, int, ProducerTag | None]
"""(lsn, timestamp_ms, key, payload, flags, wave_or_seal_epoch, producer tag): one stored
copy."""


@dataclass(frozen=True, slots=True)
class CopiesResult:
    status: Status
    """OK; CHECKSUM_MISMATCH when the first entry to return is corrupt; INTERNAL on an I/O
    error; SHUTDOWN/NOTREADY when the store is not open."""
    copies: tuple[Copy, ...]
    next_lsn: Lsn
    """Everything the store holds in the range below this LSN was returned."""
    blocks: tuple[Block, ...] = ()
    """Compressed batches returned whole (``read_locations(blocks_ok=True)`` only): sequencer
    copies, never at an LSN of ``copies``."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What a READ returns: records, plus markers for copies written by recovery (holes and
    bridges are only markers)."""

    status: Status
    records: tuple[WireRecord, ...]
    next_lsn: Lsn
    markers: tuple[Marker, ...] = ()
    blocks: tuple[Block, ...] = ()

    @staticmethod
    def of(result: CopiesResult) -> ReadResult:
        records: list[WireRecord] = []
        markers: list[Marker] = []
        for lsn, timestamp_ms, key, payload, flags, wave, _producer in result.copies:
            if flags:
                if markers and markers[-1][1] == lsn - 1 and markers[-1][2:] == (flags, wave):
                    markers[-1] = (markers[-1][0], lsn, flags, wave)
                else:
                    markers.append((lsn, lsn, flags, wave))
            if not flags & RecordFlags.HOLE:
                records.append((lsn, timestamp_ms, key, payload))
        return ReadResult(result.status, tuple(records), result.next_lsn, tuple(markers),
                          result.blocks)


def read_locations(reader: SegmentReader, log_id: LogId, locations: list[Location],
                   from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                   bytes_max: int, blocks_ok: bool = False) -> tuple[CopiesResult, Location | None]:
    """Copies of ``log_id`` in ``[from_lsn, until_lsn]`` from the entries at ``locations``
    (in LSN order), at most ``records_max`` and, past the first, at most ``bytes_max`` payload
    bytes. Also returns the location of the corrupt entry met, if one was. With ``blocks_ok``
    compressed batches the read takes whole come as blocks (see the module docstring).
    Blocking: runs in a read thread."""
    records: list[Copy] = []
    blocks: list[Block] = []
    taken = 0
    """Records and block records returned so far."""
    payload_bytes = 0
    for location in locations:
        try:
            data = reader.pread(location.segment_id, location.offset, location.length,
                                location.version)
        except OSError as error:
            log.error("read of segment %d failed: %s", location.segment_id, error)
            return _partial(records, Status.INTERNAL, from_lsn, blocks), None
        decoded = _decode_entry(data, log_id, location)
        if decoded is not None and decoded.compression:
            if blocks_ok and _whole_block(decoded, location, from_lsn, until_lsn):
                # Counted by the payload bytes the reader will hold once it expands it.
                size = plain_bytes(decoded.blob, decoded.compression)
                if taken and (taken + decoded.count > records_max
                              or payload_bytes + size > bytes_max):
                    # It does not fit after what is taken: the next read takes it whole.
                    return _done(records, blocks, Lsn(location.first_lsn)), None
                if decoded.count <= records_max:
                    blocks.append((decoded.first_lsn, decoded.timestamp_ms, decoded.key,
                                   decoded.compression, decoded.count, decoded.blob))
                    taken += decoded.count
                    payload_bytes += size
                    continue
            decoded = decoded.expanded()
        if decoded is None:
            log.error("log %d: corrupt entry for LSNs %d..%d in segment %d at %d", log_id,
                      location.first_lsn, location.last_lsn, location.segment_id,
                      location.offset)
            return _partial(records, Status.CHECKSUM_MISMATCH, from_lsn, blocks), location
        flags, wave = decoded.flags, decoded.wave
        tagged = decoded.producer_of if decoded.producers else None
        first, last = max(from_lsn, location.first_lsn), min(until_lsn, location.last_lsn)
        for lsn, timestamp_ms, key, payload in decoded.records:
            if lsn < first:
                continue
            if lsn > last:
                break
            if taken >= records_max or (
                    taken and payload_bytes + len(payload) > bytes_max):
                return _done(records, blocks, Lsn(lsn)), None
            records.append((lsn, timestamp_ms, key, payload, flags, wave,
                            tagged(lsn) if tagged is not None else None))
            taken += 1
            payload_bytes += len(payload)
    if taken >= records_max:
        return _done(records, blocks, None), None
    return _done(records, blocks, Lsn(until_lsn + 1)), None


def _done(records: list[Copy], blocks: list[Block], next_lsn: Lsn | None) -> CopiesResult:
    """``next_lsn`` None: just after the last record or block returned."""
    if next_lsn is None:
        ends = [records[-1][0]] if records else []
        if blocks:
            ends.append(blocks[-1][0] + blocks[-1][4] - 1)
        next_lsn = Lsn(max(ends) + 1)
    return CopiesResult(Status.OK, tuple(records), next_lsn, tuple(blocks))


def _partial(records: list[Copy], status: Status, from_lsn: Lsn,
             blocks: list[Block] | None = None) -> CopiesResult:
    """Records before a failed entry are still good; without any, report the failure."""
    if records or blocks:
        return _done(records, blocks or [], None)
    return CopiesResult(status, (), from_lsn)


def _whole_block(decoded: StoredCopies, location: Location, from_lsn: Lsn,
                 until_lsn: Lsn) -> bool:
    """The read takes every record of this compressed batch, and the index still resolves
    all of them to it (no newer copy or trim point covers part of it)."""
    last = decoded.first_lsn + decoded.count - 1
    return (decoded.flags == 0 and location.first_lsn == decoded.first_lsn
            and location.last_lsn == last and from_lsn <= decoded.first_lsn
            and last <= until_lsn)


def _decode_entry(data: bytes, log_id: LogId, location: Location) -> StoredCopies | None:
    checked = check_entry(data, 0)
    if checked is None or len(data) != location.length:
        return None
    decoded = decode_store_records(checked[0], memoryview(data)[HEADER_BYTES:], expand=False)
    if decoded is None:
        return None
    count = decoded.count if decoded.compression else len(decoded.records)
    # The index and the bytes must agree; a mismatch is corruption, never data to serve.
    if decoded.log_id != log_id or decoded.first_lsn != location.stored_first_lsn or (
            decoded.first_lsn + count - 1 < location.last_lsn):
        return None
    return decoded
