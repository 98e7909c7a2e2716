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
from shared.wire.read import WireRecord
from storage_node.record_index import Location
from storage_node.segment_files import SegmentReader
from storage_node.segment_format import (
    HEADER_BYTES,
    EntryType,
    check_entry,
    decode_store_records,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadResult:
    status: Status
    """OK; CHECKSUM_MISMATCH when the first entry to return is corrupt; INTERNAL on an I/O
    error; SHUTDOWN/NOTREADY when the store is not open."""
    records: tuple[WireRecord, ...]
    next_lsn: Lsn
    """Everything the store holds in the range below this LSN was returned."""


def read_locations(reader: SegmentReader, log_id: LogId, locations: list[Location],
                   from_lsn: Lsn, until_lsn: Lsn, records_max: int,
                   bytes_max: int) -> tuple[ReadResult, bool]:
    """Records of ``log_id`` in ``[from_lsn, until_lsn]`` from the entries at ``locations``
    (in LSN order), at most ``records_max`` and, past the first, at most ``bytes_max`` payload
    bytes. Also says whether a corrupt entry was met. Blocking: runs in a read thread."""
    records: list[WireRecord] = []
    payload_bytes = 0
    for location in locations:
        try:
            data = reader.pread(location.segment_id, location.offset, location.length)
        except OSError as error:
            log.error("read of segment %d failed: %s", location.segment_id, error)
            return _partial(records, Status.INTERNAL, from_lsn), False
        decoded = _decode_entry(data, log_id, location)
        if decoded is None:
            log.error("log %d: corrupt entry for LSNs %d..%d in segment %d at %d", log_id,
                      location.first_lsn, location.last_lsn, location.segment_id,
                      location.offset)
            return _partial(records, Status.CHECKSUM_MISMATCH, from_lsn), True
        for record in decoded:
            lsn = record[0]
            if lsn < from_lsn:
                continue
            if lsn > until_lsn:
                break
            if len(records) >= records_max or (
                    records and payload_bytes + len(record[3]) > bytes_max):
                return ReadResult(Status.OK, tuple(records), Lsn(lsn)), False
            records.append(record)
            payload_bytes += len(record[3])
    if len(records) >= records_max:
        return ReadResult(Status.OK, tuple(records), Lsn(records[-1][0] + 1)), False
    return ReadResult(Status.OK, tuple(records), Lsn(until_lsn + 1)), False


def _partial(records: list[WireRecord], status: Status, from_lsn: Lsn) -> ReadResult:
    """Records before a failed entry are still good; without any, report the failure."""
    if records:
        return ReadResult(Status.OK, tuple(records), Lsn(records[-1][0] + 1))
    return ReadResult(status, (), from_lsn)


def _decode_entry(data: bytes, log_id: LogId, location: Location) -> list[WireRecord] | None:
    checked = check_entry(data, 0)
    if checked is None or checked[0] != EntryType.STORE or len(data) != location.length:
        return None
    decoded = decode_store_records(memoryview(data)[HEADER_BYTES:])
    if decoded is None:
        return None
    entry_log_id, first_lsn, records = decoded
    # The index and the bytes must agree; a mismatch is corruption, never data to serve.
    if entry_log_id != log_id or first_lsn != location.first_lsn or (
            first_lsn + len(records) - 1 != location.last_lsn):
        return None
    return records
