"""The I/O of a producer lookup (``sequencer.core.producers``): ask the log's storage nodes
which of the producer's appends they hold copies of, then read each candidate back.

Called by the sequencer driver once every earlier epoch of the log is recovered, so each record
that survived has R copies and any f-majority of the nodeset holds one of them: a lookup that
heard from an f-majority has seen every append of the producer the log kept. A copy may still be
a stray (recovery plugged its LSN on the nodes it reached; a node that missed that keeps the
copy until its CLEAN arrives), so a candidate counts only if its LSNs read back as records
through the same read round readers use. An LSN names one record, and the candidate's copies
carried this producer's tag, so a record there is the producer's append.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sequencer.core.producers import lookup_candidates
from shared.epoch_metadata import LogMetadata
from shared.net.nodeset_call import STORAGE_CALL_TIMEOUT_MS, ask_nodeset
from shared.net.read_driver import RoundTransport, run_round
from shared.read_round import NodesetSpan, ReadRound, metadata_spans, span_of
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, lsn_to_epoch
from shared.wire.producer import GetProducer, ProducerEntry, ProducerState

log = logging.getLogger(__name__)

READ_SPECULATIVE_DELAY_MS = 20
VERIFY_BYTES_MAX = 16 * 1024 * 1024
"""Payload bytes one verification read round may carry (a long batch takes several)."""


async def lookup_producer(
    *, transport: RoundTransport, metadata: LogMetadata, producer_id: str, epoch: Epoch,
    release_lsn: Callable[[], Lsn],
    wait_release_above: Callable[[Lsn], Awaitable[None]],
    spans: list[NodesetSpan] | None = None,
) -> list[ProducerEntry] | None:
    """The producer's verified appends to the log, or None if the cluster could not tell
    (too few storage nodes answered, or a candidate could not be read). ``spans``: where
    each epoch range is read (default: as the metadata records them)."""
    log_id = metadata.log_id
    spans = spans if spans is not None else metadata_spans(metadata)
    everywhere = tuple(dict.fromkeys(n for span in spans for n in span.nodeset))
    answers = await ask_nodeset(
        transport, everywhere, metadata.replication_factor,
        GetProducer(log_id=log_id, producer_id=producer_id),
        lambda r: type(r) is ProducerState and r.status is Status.OK,
        timeout_ms=STORAGE_CALL_TIMEOUT_MS)
    if answers is None:
        log.warning("log %d: producer lookup reached fewer than an f-majority of the nodeset",
                    log_id)
        return None
    verified: list[ProducerEntry] = []
    candidates = lookup_candidates([a.entries for a in answers if type(a) is ProducerState])
    checks = {entry: asyncio.ensure_future(_records_exist(
        transport, metadata, spans, Lsn(entry[1]), Lsn(entry[2]), epoch, release_lsn,
        wait_release_above))
        for ranges in candidates.values() for entry in ranges}
    try:
        for ranges in candidates.values():
            # Several ranges of one pair are attempts of one append: at most one of them is
            # a record (a retry is written again only once the earlier ones read back as
            # gaps). Take the one that reads back as a record, whatever the others say; the
            # pair is unknown only if none does and one of them cannot be told now.
            found: ProducerEntry | None = None
            unknown = False
            for entry in ranges:
                exists = await checks[entry]
                if exists:
                    found = entry
                    break
                unknown = unknown or exists is None
            if found is not None:
                verified.append(found)
            elif unknown:
                return None
    finally:
        for check in checks.values():
            check.cancel()
        await asyncio.gather(*checks.values(), return_exceptions=True)
    return verified


async def _records_exist(
    transport: RoundTransport, metadata: LogMetadata, spans: list[NodesetSpan],
    first_lsn: Lsn, last_lsn: Lsn, epoch: Epoch, release_lsn: Callable[[], Lsn],
    wait_release_above: Callable[[Lsn], Awaitable[None]],
) -> bool | None:
    """True if every LSN of ``first_lsn..last_lsn`` reads as a record, False if one is a gap
    (plugged, past the epoch's end, or trimmed: then no record of it is readable any more and
    a retry may be written again), None if that cannot be told now. ``epoch`` is the
    sequencer's: every earlier one is recovered, so it is released through its last record."""
    if lsn_to_epoch(last_lsn) < epoch and release_lsn() < last_lsn:
        return False  # past the end recovery gave its epoch: a stray copy
    if release_lsn() < last_lsn:
        await wait_release_above(Lsn(last_lsn - 1))
        if release_lsn() < last_lsn:
            return None
    log_id: LogId = metadata.log_id
    loop = asyncio.get_running_loop()
    from_lsn = first_lsn
    while from_lsn <= last_lsn:
        read_round = ReadRound(
            log_id=log_id, span=span_of(spans, from_lsn), from_lsn=from_lsn,
            release_lsn=release_lsn(), records_max=last_lsn - from_lsn + 1,
            bytes_max=VERIFY_BYTES_MAX, wait_ms=0,
            speculative_delay_ms=READ_SPECULATIVE_DELAY_MS,
            started_ms=int(loop.time() * 1000))
        result = await run_round(transport, read_round, STORAGE_CALL_TIMEOUT_MS)
        merged = result.merged
        if merged is None:
            return None
        for gap in merged.gaps:
            if gap.lo <= last_lsn and gap.hi >= from_lsn:
                return None if gap.kind == "DATALOSS" else False
        if merged.next_lsn <= from_lsn:
            return None
        from_lsn = merged.next_lsn
    return True
