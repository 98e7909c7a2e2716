"""A donor's reads for rebuilding (``storage_node.rebuild_reads``) when the disk fails them:
the read stops there and says so, and the donor core records nothing past it as sent and
reads it again after a while (fix17: it used to record everything after it as sent)."""

from __future__ import annotations

from typing import Any

from shared.cluster_state import DonorProgress
from shared.types import LogId, Lsn
from storage_node.core.rebuild import DonorCore, ReadChunk, SaveCheckpoint, Sleep, TokenBucket
from storage_node.rebuild_reads import read_pieces
from storage_node.record_index import Location


class _FailingReader:
    """Segment 2 cannot be read (EIO); segment 1 holds bytes that are no entry."""

    def pread(self, segment_id: int, offset: int, length: int, version: int = 0) -> bytes:
        if segment_id == 2:
            raise OSError(5, "Input/output error")
        return b"\0" * length


def _at(segment_id: int, first: int, last: int) -> Location:
    return Location(segment_id, 0, 64, Lsn(first), Lsn(last))


def test_a_failed_read_stops_at_the_copies_it_did_not_read() -> None:
    reader: Any = _FailingReader()
    # A corrupt entry is skipped (its other holders send it); the unreadable one is not.
    pieces, stopped_at = read_pieces(reader, LogId(1), [_at(1, 1, 3), _at(2, 4, 6),
                                                        _at(1, 7, 9)])
    assert pieces == [] and stopped_at == 4
    pieces, stopped_at = read_pieces(reader, LogId(1), [_at(2, 10, 12)])
    assert pieces == [] and stopped_at == 10


def test_the_donor_reads_again_what_a_failed_read_stopped_at() -> None:
    core = DonorCore(shard="st2", logs=[(1, 20)], progress=DonorProgress(),
                     bucket=TokenBucket(0, 100, 0), by_copyset=False,
                     checkpoint_interval_ms=1_000, now_ms=0, tails=False)
    assert core.next(0) == ReadChunk(1, 1, 20)
    core.on_read([], 4, 0)  # LSNs 1..3 read (nothing to send), stopped at 4
    assert core.progress.next_lsn == 4
    saved = core.next(5_000)
    assert isinstance(saved, SaveCheckpoint) and saved.progress.next_lsn == 4
    core.on_checkpointed(True, 5_000)
    assert core.next(5_000) == ReadChunk(1, 4, 20)
    core.on_read([], 4, 5_000)  # failed where it began: nothing recorded, wait
    assert core.progress.next_lsn == 4 and core.reads_failed == 1
    wait = core.next(5_000)
    assert isinstance(wait, Sleep) and wait.until_ms > 5_000
    assert core.next(wait.until_ms) == ReadChunk(1, 4, 20)
    core.on_read([], 21, wait.until_ms)
    assert core.progress.next_lsn == 21
