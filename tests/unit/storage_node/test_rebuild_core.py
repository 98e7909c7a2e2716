"""Rebuilding's pure donor core: walk order, filtering, chunking, rate limit, checkpoints,
resuming; the token bucket; cutting a stored STORE to the part a donor still holds."""

from __future__ import annotations

from shared.cluster_state import DonorProgress
from shared.compression import Codec, compress_batch
from shared.status import Status
from shared.types import Esn, LogId, Lsn, NodeId
from shared.wire.store import Store, payloads_checksum
from storage_node.core.rebuild import (
    DonorCore,
    Finished,
    Piece,
    ReadChunk,
    SaveCheckpoint,
    SendChunk,
    Sleep,
    TokenBucket,
    narrowed,
    wanted,
)
from storage_node.core.rebuild_accept import outside as _missing


def _piece(lsn: int, copyset: tuple[str, ...] = ("st1", "st2"), size: int = 10) -> Piece:
    return Piece(lsn, lsn, copyset, b"x" * size, size)


def _core(logs: list[tuple[int, int]], progress: DonorProgress | None = None, *,
          rate: int = 0, by_copyset: bool = False) -> DonorCore:
    # Without the plan (its own tests: test_rebuild_plan.py): the walk alone.
    return DonorCore(shard="st2", logs=logs, progress=progress or DonorProgress(),
                     bucket=TokenBucket(rate, 100, 0), by_copyset=by_copyset,
                     checkpoint_interval_ms=1_000, now_ms=0, tails=False)


def test_walks_every_log_in_order_and_finishes() -> None:
    core = _core([(2, 5), (1, 3)])
    read = core.next(0)
    assert read == ReadChunk(1, 1, 3)
    core.on_read([_piece(1), _piece(2)], 4, 0)
    send = core.next(0)
    assert isinstance(send, SendChunk) and send.log_id == 1 and send.records == 2
    core.on_sent(Status.OK, 0)
    assert core.next(0) == ReadChunk(2, 1, 5)
    core.on_read([], 6, 0)
    saved = core.next(0)
    assert isinstance(saved, SaveCheckpoint) and saved.progress.records == 2
    core.on_checkpointed(True, 0)
    done = core.next(0)
    assert isinstance(done, Finished) and done.progress.done


def test_a_failed_send_is_retried_with_backoff() -> None:
    core = _core([(1, 3)])
    core.next(0)
    core.on_read([_piece(1)], 4, 0)
    assert isinstance(core.next(0), SendChunk)
    core.on_sent(Status.CONNFAILED, 0)
    assert core.next(10) == Sleep(200)
    again = core.next(200)
    assert isinstance(again, SendChunk)
    core.on_sent(Status.OK, 200)
    assert core.progress.next_lsn == 4


def test_resumes_from_a_checkpoint() -> None:
    core = _core([(1, 9), (2, 9), (3, 9)], DonorProgress(log_id=2, next_lsn=5))
    assert core.next(0) == ReadChunk(2, 5, 9)


def test_by_copyset_sends_only_copies_that_name_the_shard() -> None:
    assert wanted(("st1", "st3"), "st2", by_copyset=False)
    assert not wanted(("st1", "st3"), "st2", by_copyset=True)
    assert wanted(("st1", "st2"), "st2", by_copyset=True)
    assert wanted((), "st2", by_copyset=True)  # written by recovery: no copyset
    core = _core([(1, 3)], by_copyset=True)
    core.next(0)
    core.on_read([_piece(1, ("st1", "st3")), _piece(2)], 4, 0)
    send = core.next(0)
    assert isinstance(send, SendChunk) and send.records == 1


def test_rate_limit() -> None:
    bucket = TokenBucket(1000, 100, 0)
    assert bucket.delay_ms(0, 100) == 0
    assert bucket.delay_ms(0, 500) > 0  # empty: wait
    assert bucket.delay_ms(50, 500) == 0  # refilled 50 bytes: goes, into debt
    wait = bucket.delay_ms(50, 10)
    assert 400 <= wait <= 500
    core = _core([(1, 3)], rate=1000)
    core.next(0)
    core.on_read([_piece(1, size=300)], 4, 0)
    assert isinstance(core.next(0), SendChunk)
    core.on_sent(Status.OK, 0)


def _store(lsn: int, payloads: tuple[bytes, ...], compression: int = 0) -> Store:
    blob = payloads
    records = 0
    if compression:
        packed = compress_batch(payloads, Codec(compression))
        assert packed is not None
        blob, records = (packed,), len(payloads)
    return Store(log_id=LogId(1), lsn=Lsn(lsn), wave=3, sequencer_node=NodeId("seq1"),
                 copyset=(NodeId("st1"), NodeId("st2")), timestamp_ms=7, last_known_good=Esn(0),
                 release_lsn=Lsn(0), timeout_ms=0, key=None, payloads=blob,
                 checksum=payloads_checksum(blob), producers=(("p", 1, lsn, lsn + 3),),
                 compression=compression, records=records)


def test_narrowed_keeps_identity() -> None:
    payloads = (b"a", b"b", b"c", b"d")
    for compression in (0, int(Codec.LZ4)):
        store = _store(10, payloads * 64 if compression else payloads, compression)
        part = narrowed(store, 11, 12)
        assert isinstance(part, Store)
        assert part.payloads == (b"b", b"c") and part.lsn == 11 and part.last_lsn == 12
        assert (part.wave, part.copyset, part.timestamp_ms, part.flags) == (
            3, store.copyset, 7, 0)
        assert part.validate() is Status.OK
    whole = _store(10, payloads)
    assert narrowed(whole, 10, 13) is whole


def test_missing_ranges() -> None:
    held = [(Lsn(3), Lsn(4)), (Lsn(8), Lsn(20))]
    assert _missing(held, 1, 10) == [(1, 2), (5, 7)]
    assert _missing([], 1, 10) == [(1, 10)]
    assert _missing(held, 3, 4) == []
    assert _missing(held, 21, 22) == [(21, 22)]


def test_damaged_ranges_are_not_held() -> None:
    from storage_node.rebuild_runtime import _without
    held = [(Lsn(1), Lsn(10)), (Lsn(20), Lsn(30))]
    assert _without(held, ((3, 4), (25, 40))) == [(1, 2), (5, 10), (20, 24)]
    assert _without(held, ()) == held


def test_rebuild_store_entries_are_checked_like_stores() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from shared.wire.codec import encode_fields
    from shared.wire.rebuild import RebuildStore
    from storage_node.rebuild_runtime import _decoded

    good = _store((1 << 32) + 10, (b"a", b"b"))

    def message(entries: tuple[bytes, ...], log_id: int = 1) -> RebuildStore:
        return RebuildStore(shard="st2", generation=2, log_id=log_id, release_lsn=0,
                            trim_lsn=0, sealed_epoch=0, sealed_by="", entries=entries)

    decoded = _decoded(message((bytes(encode_fields(good)),)))
    assert decoded is not None and decoded[0].payloads == good.payloads
    assert decoded[0].copyset == good.copyset and decoded[0].wave == good.wave
    assert _decoded(message((bytes(encode_fields(good)),), log_id=2)) is None  # other log
    bad = dataclasses_replace(good, checksum=good.checksum ^ 1)
    assert _decoded(message((bytes(encode_fields(bad)),))) is None

    @given(st.lists(st.binary(max_size=200), max_size=4))
    @settings(max_examples=300)
    def fuzz(entries: list[bytes]) -> None:
        _decoded(message(tuple(entries)))

    fuzz()


def dataclasses_replace(store: Store, **changes: object) -> Store:
    import dataclasses
    return dataclasses.replace(store, **changes)  # type: ignore[arg-type]
