"""What a restart derives from the segment files, kept up to date while the store runs.

``DurableState`` folds every entry in write order: STOREs into the record index and each log's
newest LSN and epoch tails; RELEASE, SEAL and TRIM entries into the log's pointers; CHECKPOINT
entries into all of those at once. At open it is fed by the recovery scan, afterwards by the
writer's completed batches with the same ``on_entry``, so it always equals what a restart
would rebuild from the files. That is what makes a checkpoint safe to write: it carries the
state of a log exactly as a restart would see it, so the segments whose entries it summarises
can be dropped.

Folding rules (why a checkpoint may replace the entries before it): pointers only grow, and on
a tie an entry keeps the earlier value (the first SEAL of an epoch names who sealed it) while a
checkpoint overrides it. A checkpoint's values are the fold of every entry written before it,
so whichever of those entries a reclaim dropped, folding the rest and then the checkpoint gives
the same state as folding them all.

Besides, it tracks which logs have entries in each segment (the logs a reclaim of that
segment must checkpoint first). Lives on the event loop after open.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgpack

from shared.types import (
    EPOCH_INVALID,
    LSN_INVALID,
    Epoch,
    LogId,
    Lsn,
    NodeId,
    lsn_to_epoch,
    lsn_to_esn,
)
from shared.wire.store import RecordFlags, Store
from storage_node.core.store_machine import LogStorageState
from storage_node.producer_index import ProducerIndex
from storage_node.record_index import Location, RecordIndex
from storage_node.segment_format import (
    CheckpointEntry,
    ReleaseEntry,
    ScannedEntry,
    SealEntry,
    StoreMeta,
    TrimEntry,
)


class DurableState:
    """Per-log state and the index, folded from the entries found at open and written since
    (plain dicts: there is one call per entry ever written)."""

    def __init__(self, index: RecordIndex, producers: ProducerIndex | None = None) -> None:
        self._index = index
        self.producers = producers if producers is not None else ProducerIndex(10_000)
        self._last: dict[LogId, tuple[Lsn, NodeId | None]] = {}
        self._releases: dict[LogId, Lsn] = {}
        self._seals: dict[LogId, tuple[Epoch, NodeId | None]] = {}
        self._tails: dict[LogId, dict[Epoch, tuple[int, int]]] = {}
        self._trims: dict[LogId, Lsn] = {}
        self._settled: dict[LogId, dict[Epoch, int]] = {}
        """Per log, the epochs a CLEAN or drained release settled (only in checkpoints)."""
        self._bridges: dict[LogId, dict[Epoch, Lsn]] = {}
        """Per log and epoch, the highest LSN where a bridge was written: a READ that starts
        past it in its epoch carries it, so that no reader is served a stray copy behind it
        (``shared.read_merge``). Not in checkpoints: a bridge is a live entry a reclaim keeps,
        so a restart's scan finds it again."""
        self.segment_logs: dict[int, set[LogId]] = {}
        self._live = False
        """False while the recovery scan runs: trimmed records are dropped from the index at
        its end (a later entry may store LSNs below a trim point again)."""

    def on_entry(self, segment_id: int, scanned: ScannedEntry) -> None:
        entry = scanned.entry
        log_id = entry.log_id
        logs = self.segment_logs.get(segment_id)
        if logs is None:
            logs = self.segment_logs[segment_id] = set()
        logs.add(log_id)
        if isinstance(entry, StoreMeta):
            self._on_store(segment_id, scanned.offset, scanned.length, log_id, entry.first_lsn,
                           entry.last_lsn, entry.sequencer_node, entry.last_known_good,
                           index_time(entry.flags, entry.timestamp_ms))
            if entry.flags & _BRIDGE:
                self._note_bridge(log_id, entry.last_lsn)
            if entry.producers:
                self.producers.add(log_id, entry.producers, entry.timestamp_ms)
        elif isinstance(entry, ReleaseEntry):
            if entry.release_lsn > self._releases.get(log_id, 0):
                self._releases[log_id] = entry.release_lsn
        elif isinstance(entry, TrimEntry):
            self._raise_trim(log_id, entry.trim_lsn)
        elif isinstance(entry, SealEntry):
            if log_id not in self._seals or entry.epoch > self._seals[log_id][0]:
                self._seals[log_id] = (entry.epoch, entry.sealed_by)
        else:
            self._on_checkpoint(entry)

    def on_stores(self, segment_id: int, written: list[tuple[int, int, Store]]) -> None:
        """STORE entries written by one batch, as ``(offset, length, store)``: ``on_store`` for
        each, with the per-batch lookups done once (the writer's hot path)."""
        logs = self.segment_logs.get(segment_id)
        if logs is None:
            logs = self.segment_logs[segment_id] = set()
        insert = self._index.insert
        last_by_log = self._last
        tails_by_log = self._tails
        trims = self._trims if self._live else None
        for offset, length, store in written:
            log_id = store.log_id
            logs.add(log_id)
            first_lsn = store.lsn
            last_lsn = store.last_lsn
            insert(log_id, Location(segment_id, offset, length, first_lsn, last_lsn, Lsn(0),
                                    -1 if store.flags & _HOLE else store.timestamp_ms))
            if store.flags & _BRIDGE:
                self._note_bridge(log_id, last_lsn)
            last = last_by_log.get(log_id)
            if last is None or last_lsn > last[0]:
                last_by_log[log_id] = (last_lsn, store.sequencer_node)
            tails = tails_by_log.get(log_id)
            if tails is None:
                tails = tails_by_log[log_id] = {}
            epoch = Epoch(first_lsn >> 32)
            last_esn = last_lsn & 0xFFFFFFFF
            lng = store.last_known_good
            tail = tails.get(epoch)
            if tail is None:
                tails[epoch] = (lng, last_esn)
            elif lng > tail[0] or last_esn > tail[1]:
                tails[epoch] = (max(tail[0], lng), max(tail[1], last_esn))
            if trims and first_lsn <= trims.get(log_id, 0):
                self._index.drop_through(log_id, trims[log_id])
            if store.producers:
                self.producers.add(log_id, store.producers, store.timestamp_ms)

    def on_release(self, segment_id: int, log_id: LogId, release_lsn: Lsn) -> None:
        """A RELEASE entry was written."""
        logs = self.segment_logs.get(segment_id)
        if logs is None:
            logs = self.segment_logs[segment_id] = set()
        logs.add(log_id)
        if release_lsn > self._releases.get(log_id, 0):
            self._releases[log_id] = release_lsn

    def _note_bridge(self, log_id: LogId, lsn: Lsn) -> None:
        bridges = self._bridges.setdefault(log_id, {})
        epoch = Epoch(lsn >> 32)
        if lsn > bridges.get(epoch, 0):
            bridges[epoch] = lsn

    def bridge_below(self, log_id: LogId, lsn: Lsn) -> Lsn | None:
        """The highest LSN below ``lsn`` in its epoch where a bridge was written, if any (the
        copy there may have been replaced since: the caller reads it to know)."""
        bridges = self._bridges.get(log_id)
        if not bridges:
            return None
        bridge = bridges.get(Epoch(lsn >> 32))
        return bridge if bridge is not None and bridge < lsn else None

    def _on_store(self, segment_id: int, offset: int, length: int, log_id: LogId,
                  first_lsn: Lsn, last_lsn: Lsn, node: NodeId, last_known_good: int,
                  timestamp_ms: int) -> None:
        self._index.insert(log_id, Location(segment_id, offset, length, first_lsn, last_lsn,
                                            Lsn(0), timestamp_ms))
        last = self._last.get(log_id)
        if last is None or last_lsn > last[0]:
            self._last[log_id] = (last_lsn, node)
        tails = self._tails.get(log_id)
        if tails is None:
            tails = self._tails[log_id] = {}
        epoch = lsn_to_epoch(first_lsn)
        last_esn = lsn_to_esn(last_lsn)
        tail = tails.get(epoch)
        if tail is None:
            tails[epoch] = (last_known_good, last_esn)
        elif last_known_good > tail[0] or last_esn > tail[1]:
            tails[epoch] = (max(tail[0], last_known_good), max(tail[1], last_esn))
        if self._live and self._trims and first_lsn <= self._trims.get(log_id, 0):
            self._index.drop_through(log_id, self._trims[log_id])

    def _on_checkpoint(self, entry: CheckpointEntry) -> None:
        log_id = entry.log_id
        if entry.last_lsn and entry.last_lsn >= self._last.get(log_id, (LSN_INVALID, None))[0]:
            self._last[log_id] = (entry.last_lsn, entry.last_sequencer)
        if entry.release_lsn > self._releases.get(log_id, 0):
            self._releases[log_id] = entry.release_lsn
        if entry.sealed_epoch and entry.sealed_epoch >= self._seals.get(
                log_id, (EPOCH_INVALID, None))[0]:
            self._seals[log_id] = (entry.sealed_epoch, entry.sealed_by)
        if entry.tails:
            tails = self._tails.setdefault(log_id, {})
            for epoch, lng, last_esn in entry.tails:
                old_lng, old_last = tails.get(Epoch(epoch), (0, 0))
                tails[Epoch(epoch)] = (max(old_lng, lng), max(old_last, last_esn))
        if entry.settled:
            settled = self._settled.setdefault(log_id, {})
            for epoch, esn in entry.settled:
                if esn > settled.get(Epoch(epoch), 0):
                    settled[Epoch(epoch)] = esn
        self._raise_trim(log_id, entry.trim_lsn)

    def _raise_trim(self, log_id: LogId, trim_lsn: Lsn) -> None:
        if trim_lsn > self._trims.get(log_id, 0):
            self._trims[log_id] = trim_lsn
            if self._live:
                self._index.drop_through(log_id, trim_lsn)

    def finish_recovery(self) -> None:
        """The scan is over: drop what is trimmed from the index and follow the writes."""
        for log_id, trim_lsn in self._trims.items():
            self._index.drop_through(log_id, trim_lsn)
        self._live = True

    def checkpoint(self, log_id: LogId) -> CheckpointEntry:
        last_lsn, last_node = self._last.get(log_id, (LSN_INVALID, None))
        sealed_epoch, sealed_by = self._seals.get(log_id, (EPOCH_INVALID, None))
        tails = tuple((epoch, lng, last) for epoch, (lng, last)
                      in sorted(self._tails.get(log_id, {}).items()))
        settled = tuple(sorted(self._settled.get(log_id, {}).items()))
        return CheckpointEntry(log_id, last_lsn, last_node, self._releases.get(log_id, LSN_INVALID),
                               sealed_epoch, sealed_by, self._trims.get(log_id, LSN_INVALID),
                               tails, settled)

    @property
    def logs_count(self) -> int:
        """About how many logs a ``snapshot`` holds (those with a STORE or a release pointer;
        seal, trim and settled marks alone are few)."""
        return max(len(self._last), len(self._releases))

    def trim_lsn(self, log_id: LogId) -> Lsn:
        return self._trims.get(log_id, LSN_INVALID)

    def release_lsn(self, log_id: LogId) -> Lsn:
        return self._releases.get(log_id, LSN_INVALID)

    def states(self) -> dict[LogId, LogStorageState]:
        """The soft seal is not written by itself: the newest STORE proves its sequencer's
        epoch exists, which rebuilds the soft seal it caused."""
        result: dict[LogId, LogStorageState] = {}
        for log_id in (self._last.keys() | self._releases.keys() | self._seals.keys()
                       | self._trims.keys() | self._settled.keys()):
            last_lsn, newest_sequencer = self._last.get(log_id, (LSN_INVALID, None))
            sealed_epoch, sealed_by = self._seals.get(log_id, (EPOCH_INVALID, None))
            soft_epoch = Epoch(max(lsn_to_epoch(last_lsn) - 1, EPOCH_INVALID))
            result[log_id] = LogStorageState(
                sealed_epoch=sealed_epoch, sealed_by=sealed_by,
                soft_sealed_epoch=soft_epoch,
                soft_sealed_by=newest_sequencer if soft_epoch > EPOCH_INVALID else None,
                release_lsn=self._releases.get(log_id, LSN_INVALID), last_lsn=last_lsn,
                epoch_tails=dict(self._tails.get(log_id, {})),
                trim_lsn=self._trims.get(log_id, LSN_INVALID),
                settled=dict(self._settled.get(log_id, {})))
        return result

    # ---- the restart checkpoint in index files (``segment_index``) ----

    def snapshot(self) -> bytes:
        """Everything this fold holds but the index, packed: an index file carries it, so a
        restart folds only the entries written after that file."""
        producers = self.producers
        packed: bytes = msgpack.packb([
            SNAPSHOT_VERSION, self._last, self._releases, self._seals, self._tails, self._trims,
            self._bridges, producers._logs, producers.forgotten_count, self._settled],
            use_bin_type=True)
        return packed

    def restore(self, data: bytes) -> bool:
        """Start from a ``snapshot`` (before folding anything); False, nothing changed, if it
        is malformed."""
        parsed = parse_snapshot(data)
        if parsed is None:
            return False
        (self._last, self._releases, self._seals, self._tails, self._trims, self._bridges,
         self.producers._logs, self.producers.forgotten_count, self._settled) = parsed
        return True

    def on_index_only(self, segment_id: int, scanned: ScannedEntry) -> None:
        """An entry of a segment that a restart scans only for its index (its state is in
        the checkpoint it restored already)."""
        entry = scanned.entry
        logs = self.segment_logs.get(segment_id)
        if logs is None:
            logs = self.segment_logs[segment_id] = set()
        logs.add(entry.log_id)
        if isinstance(entry, StoreMeta):
            self._index.insert(entry.log_id, Location(
                segment_id, scanned.offset, scanned.length, entry.first_lsn, entry.last_lsn,
                Lsn(0), index_time(entry.flags, entry.timestamp_ms)))


SNAPSHOT_VERSION = 2
"""2 added the settled marks (a 10th field); version 1 snapshots still read, with none."""
_Parsed = tuple[Any, ...]


def parse_snapshot(data: bytes) -> _Parsed | None:
    """The fields of a ``DurableState.snapshot``, every type checked; None if malformed."""
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError):
        return None
    if type(document) is not list or (document[:1], len(document)) not in (([1], 9),
                                                                           ([2], 10)):
        return None
    _version, last, releases, seals, tails, trims, bridges, producers, forgotten = document[:9]
    settled = document[9] if len(document) == 10 else {}
    if type(settled) is not dict or not all(_uint(k) and _int_map(v)
                                            for k, v in settled.items()):
        return None
    if not (_int_map(releases) and _int_map(trims) and type(forgotten) is int
            and forgotten >= 0):
        return None
    if not (_node_map(last) and _node_map(seals)):
        return None
    if type(tails) is not dict or type(bridges) is not dict or type(producers) is not dict:
        return None
    out_tails: dict[LogId, dict[Epoch, tuple[int, int]]] = {}
    for log_id, epochs in tails.items():
        if not _uint(log_id) or type(epochs) is not dict:
            return None
        out_epochs: dict[Epoch, tuple[int, int]] = {}
        for epoch, pair in epochs.items():
            if not (_uint(epoch) and type(pair) is list and len(pair) == 2
                    and _uint(pair[0]) and _uint(pair[1])):
                return None
            out_epochs[Epoch(epoch)] = (pair[0], pair[1])
        out_tails[LogId(log_id)] = out_epochs
    if not all(_uint(k) and _int_map(v) for k, v in bridges.items()):
        return None
    out_producers: dict[LogId, OrderedDict[str, dict[int, list[tuple[int, int, int]]]]] = {}
    for log_id, by_producer in producers.items():
        if not _uint(log_id) or type(by_producer) is not dict:
            return None
        ordered: OrderedDict[str, dict[int, list[tuple[int, int, int]]]] = OrderedDict()
        for producer_id, seqs in by_producer.items():
            if type(producer_id) is not str or type(seqs) is not dict:
                return None
            out_seqs: dict[int, list[tuple[int, int, int]]] = {}
            for seq, ranges in seqs.items():
                if not _uint(seq) or type(ranges) is not list or not all(
                        type(r) is list and len(r) == 3 and all(type(v) is int for v in r)
                        for r in ranges):
                    return None
                out_seqs[seq] = [(r[0], r[1], r[2]) for r in ranges]
            ordered[producer_id] = out_seqs
        out_producers[LogId(log_id)] = ordered
    return ({LogId(k): (Lsn(v[0]), NodeId(v[1]) if v[1] is not None else None)
             for k, v in last.items()},
            {LogId(k): Lsn(v) for k, v in releases.items()},
            {LogId(k): (Epoch(v[0]), NodeId(v[1]) if v[1] is not None else None)
             for k, v in seals.items()},
            out_tails, {LogId(k): Lsn(v) for k, v in trims.items()},
            {LogId(k): {Epoch(e): Lsn(x) for e, x in v.items()} for k, v in bridges.items()},
            out_producers, forgotten,
            {LogId(k): {Epoch(e): x for e, x in v.items()} for k, v in settled.items()})


def _uint(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _int_map(value: object) -> bool:
    return type(value) is dict and all(_uint(k) and _uint(v) for k, v in value.items())


def _node_map(value: object) -> bool:
    return type(value) is dict and all(
        _uint(k) and type(v) is list and len(v) == 2 and _uint(v[0])
        and (v[1] is None or type(v[1]) is str) for k, v in value.items())


def index_time(flags: int, timestamp_ms: int) -> int:
    """Holes and bridges have no timestamp: find-time and retention skip them."""
    return -1 if flags & _HOLE else timestamp_ms


_HOLE = int(RecordFlags.HOLE)
_BRIDGE = int(RecordFlags.BRIDGE)
"""A plain int: an int & IntFlag goes through enum's Python code (once per STORE here)."""
