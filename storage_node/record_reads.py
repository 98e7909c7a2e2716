"""Reads of records out of the segment files: pread, CRC check, split batches into records.

Runs in the record store's read threads. A corrupt entry is never served: the records before
it are returned, or, if it comes first, the read fails with CHECKSUM_MISMATCH so that the
reader turns to another copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shared.status import Status
from shared.types import LogId, Lsn
from shared.wire.read import Marker, WireRecord
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


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What a READ returns: records, plus markers for copies written by recovery (holes and
    bridges are only markers)."""

    status: Status
    records: tuple[WireRecord, ...]
    next_lsn: Lsn
    markers: tuple[Marker, ...] = ()

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
        return ReadResult(result.status, tuple(records), result.next_lsn, tuple(markers))


def read_locations(reader: SegmentReader, log_id: LogId, locations: list[Location],
                   from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                   bytes_max: int) -> tuple[CopiesResult, bool]:
    """Copies of ``log_id`` in ``[from_lsn, until_lsn]`` from the entries at ``locations``
    (in LSN order), at most ``records_max`` and, past the first, at most ``bytes_max`` payload
    bytes. Also says whether a corrupt entry was met. Blocking: runs in a read thread."""
    records: list[Copy] = []
    payload_bytes = 0
    for location in locations:
        try:
            data = reader.pread(location.segment_id, location.offset, location.length,
                                location.version)
        except OSError as error:
            log.error("read of segment %d failed: %s", location.segment_id, error)
            return _partial(records, Status.INTERNAL, from_lsn), False
        decoded = _decode_entry(data, log_id, location)
        if decoded is None:
            log.error("log %d: corrupt entry for LSNs %d..%d in segment %d at %d", log_id,
                      location.first_lsn, location.last_lsn, location.segment_id,
                      location.offset)
            return _partial(records, Status.CHECKSUM_MISMATCH, from_lsn), True
        flags, wave = decoded.flags, decoded.wave
        tagged = decoded.producer_of if decoded.producers else None
        first, last = max(from_lsn, location.first_lsn), min(until_lsn, location.last_lsn)
        for lsn, timestamp_ms, key, payload in decoded.records:
            if lsn < first:
                continue
            if lsn > last:
                break
            if len(records) >= records_max or (
                    records and payload_bytes + len(payload) > bytes_max):
                return CopiesResult(Status.OK, tuple(records), Lsn(lsn)), False
            records.append((lsn, timestamp_ms, key, payload, flags, wave,
                            tagged(lsn) if tagged is not None else None))
            payload_bytes += len(payload)
    if len(records) >= records_max:
        return CopiesResult(Status.OK, tuple(records), Lsn(records[-1][0] + 1)), False
    return CopiesResult(Status.OK, tuple(records), Lsn(until_lsn + 1)), False


def _partial(records: list[Copy], status: Status, from_lsn: Lsn) -> CopiesResult:
    """Records before a failed entry are still good; without any, report the failure."""
    if records:
        return CopiesResult(Status.OK, tuple(records), Lsn(records[-1][0] + 1))
    return CopiesResult(status, (), from_lsn)


def _decode_entry(data: bytes, log_id: LogId, location: Location) -> StoredCopies | None:
    checked = check_entry(data, 0)
    if checked is None or len(data) != location.length:
        return None
    decoded = decode_store_records(checked[0], memoryview(data)[HEADER_BYTES:])
    if decoded is None:
        return None
    # The index and the bytes must agree; a mismatch is corruption, never data to serve.
    if decoded.log_id != log_id or decoded.first_lsn != location.stored_first_lsn or (
            decoded.first_lsn + len(decoded.records) - 1 < location.last_lsn):
        return None
    return decoded
