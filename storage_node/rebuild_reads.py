"""A donor's reads for rebuilding: the stored STORE entries behind index locations, as
``Piece``s (``storage_node.core.rebuild``) with their copysets and the packed STORE fields of
exactly the records the index still resolves to them.

Runs in the record store's read threads (``RecordStore.read_entries``). A whole entry goes
as the bytes it is stored as; an entry partly covered by a newer copy or a trim point is cut
(``narrowed``). A corrupt entry is skipped (logged): this donor cannot vouch for it, and the
record's other holders send their copies.
"""

from __future__ import annotations

import logging

import msgpack

from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.codec import decode_store_fields, encode_fields
from shared.wire.rebuild import REBUILD_BYTES_MAX
from shared.wire.store import Store, payloads_checksum
from storage_node.core.rebuild import Piece, narrowed
from storage_node.record_index import Location
from storage_node.segment_files import SegmentReader
from storage_node.segment_format import HEADER_BYTES, EntryType, check_entry

log = logging.getLogger(__name__)


def read_pieces(reader: SegmentReader, log_id: LogId, locations: list[Location],
                bytes_max: int = REBUILD_BYTES_MAX) -> tuple[list[Piece], int | None]:
    """The pieces, and where the read stopped early (the first LSN not read) once it had
    ``bytes_max`` bytes of them (a chunk's worth: at a low rate limit a chunk is small, and
    reading thousands of records to send a few was wasted work) or at a read that failed
    (an I/O error: read again later), else None."""
    pieces: list[Piece] = []
    size = 0
    for at, location in enumerate(locations):
        if size >= bytes_max:
            return pieces, int(locations[at].first_lsn)
        try:
            data = reader.pread(location.segment_id, location.offset, location.length,
                                location.version)
        except OSError as error:
            # Stop here: what follows was not read, so it is not sent, and the donor must
            # not record it as sent (its checkpoint would pass copies it never sent); it
            # reads from here again after a while (``DonorCore.on_read``).
            log.error("rebuild read of segment %d failed: %s", location.segment_id, error)
            return pieces, int(location.first_lsn)
        store = _stored(data, location)
        if store is None or store.log_id != log_id:
            log.error("log %d: corrupt entry for LSNs %d..%d in segment %d skipped by "
                      "rebuilding", log_id, location.first_lsn, location.last_lsn,
                      location.segment_id)
            continue
        if location.first_lsn < store.lsn or location.last_lsn > store.last_lsn:
            continue  # the index and the bytes disagree: corruption, never sent
        whole = location.first_lsn == store.lsn and location.last_lsn == store.last_lsn
        piece = store if whole else narrowed(store, location.first_lsn, location.last_lsn)
        if isinstance(piece, Status):
            continue
        body = bytes(piece.wire_fields) if whole and piece.wire_fields is not None else (
            encode_fields(piece))
        pieces.append(Piece(piece.lsn, piece.last_lsn, tuple(piece.copyset), body,
                            sum(map(len, piece.payloads))))
        size += len(body)
    return pieces, None


def _stored(data: bytes, location: Location) -> Store | None:
    checked = check_entry(data, 0)
    if checked is None or len(data) != location.length:
        return None
    entry_type, _ = checked
    body = memoryview(data)[HEADER_BYTES:]
    if entry_type == EntryType.STORE_FIELDS:
        store = decode_store_fields(body)
        return None if isinstance(store, Status) else store
    if entry_type == EntryType.STORE:
        return _legacy(body)
    return None


def _legacy(body: memoryview) -> Store | None:
    """A STORE entry of the layout before STORE_FIELDS (``segment_format``)."""
    try:
        fields = msgpack.unpackb(body, raw=False)
        log_id, first_lsn, count, node, timestamp_ms, lng, wave, copyset, key, payloads = (
            fields[:10])
        flags = fields[10] if len(fields) >= 11 else 0
        producers = tuple(tuple(tag) for tag in fields[11]) if len(fields) >= 12 else ()
        compression = fields[12] if len(fields) == 13 else 0
        payloads = tuple(payloads)
        store = Store(log_id=LogId(log_id), lsn=Lsn(first_lsn), wave=wave,
                      sequencer_node=NodeId(node), copyset=tuple(copyset),
                      timestamp_ms=timestamp_ms, last_known_good=lng, release_lsn=Lsn(0),
                      timeout_ms=0, key=key, payloads=payloads,
                      checksum=payloads_checksum(payloads), flags=flags,
                      producers=producers,
                      compression=compression, records=count if compression else 0)
    except (ValueError, TypeError, IndexError, msgpack.UnpackException):
        return None
    return store if store.validate() is Status.OK else None
