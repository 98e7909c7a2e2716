"""Compressed batches: round trips, "keep only if smaller", and hostile blobs."""

from __future__ import annotations

import json
import os

import lz4.frame
import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.compression import Codec, compress_batch, decompress_batch
from shared.status import Status

LINES = [json.dumps({"level": "info", "service": "api", "msg": f"request {i} served",
                     "latency_ms": i % 17}).encode() for i in range(200)]


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
def test_round_trip_of_log_lines(codec: Codec) -> None:
    blob = compress_batch(LINES, codec)
    assert blob is not None and len(blob) < sum(map(len, LINES)) / 3
    assert decompress_batch(blob, codec, len(LINES), bytes_max=1 << 20) == tuple(LINES)


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
def test_incompressible_batch_is_not_compressed(codec: Codec) -> None:
    assert compress_batch([os.urandom(1024) for _ in range(64)], codec) is None
    assert compress_batch([], codec) is None
    assert compress_batch(LINES, Codec.NONE) is None


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
def test_wrong_record_count_or_size_is_badmsg(codec: Codec) -> None:
    blob = compress_batch(LINES, codec)
    assert blob is not None
    assert decompress_batch(blob, codec, len(LINES) - 1, bytes_max=1 << 20) is Status.BADMSG
    assert decompress_batch(blob, codec, len(LINES) + 1, bytes_max=1 << 20) is Status.BADMSG
    assert decompress_batch(blob, codec, len(LINES), bytes_max=1000) is Status.BADMSG
    assert decompress_batch(blob, 7, len(LINES), bytes_max=1 << 20) is Status.BADMSG
    assert decompress_batch(blob, codec, 0, bytes_max=1 << 20) is Status.BADMSG


def test_bomb_is_refused_before_decompressing() -> None:
    bomb = zstandard.ZstdCompressor().compress(msgpack.packb([b"\0" * (64 << 20)]))
    assert len(bomb) < 1 << 20
    assert decompress_batch(bomb, Codec.ZSTD, 1, bytes_max=1 << 20) is Status.BADMSG
    bomb = lz4.frame.compress(msgpack.packb([b"\0" * (64 << 20)]), store_size=True)
    assert decompress_batch(bomb, Codec.LZ4, 1, bytes_max=1 << 20) is Status.BADMSG


def test_frames_without_a_content_size_are_refused() -> None:
    plain = msgpack.packb([b"x" * 100])
    assert decompress_batch(lz4.frame.compress(plain, store_size=False), Codec.LZ4, 1,
                            bytes_max=1 << 20) is Status.BADMSG
    not_a_list = zstandard.ZstdCompressor().compress(msgpack.packb({"a": 1}))
    assert decompress_batch(not_a_list, Codec.ZSTD, 1, bytes_max=1 << 20) is Status.BADMSG
    ints = zstandard.ZstdCompressor().compress(msgpack.packb([1]))
    assert decompress_batch(ints, Codec.ZSTD, 1, bytes_max=1 << 20) is Status.BADMSG


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=512), codec=st.sampled_from([1, 2]),
       records=st.integers(min_value=0, max_value=50))
def test_fuzz_random_blobs_never_raise(blob: bytes, codec: int, records: int) -> None:
    out = decompress_batch(blob, codec, records, bytes_max=4096)
    assert out is Status.BADMSG or (type(out) is tuple and len(out) == records)


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=40),
       codec=st.sampled_from([Codec.LZ4, Codec.ZSTD]), cut=st.integers(min_value=0))
def test_fuzz_truncated_blobs(payloads: list[bytes], codec: Codec, cut: int) -> None:
    blob = compress_batch(payloads * 4, codec)
    if blob is None:
        return
    assert decompress_batch(blob, codec, len(payloads) * 4, bytes_max=1 << 20) == tuple(
        payloads * 4)
    damaged = blob[: cut % len(blob)]
    out = decompress_batch(damaged, codec, len(payloads) * 4, bytes_max=1 << 20)
    assert out is Status.BADMSG


def _spy_compressed_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of every input the codecs are asked to compress."""
    import shared.compression as compression

    sizes: list[int] = []
    real = compression._compress

    def spy(plain: bytes, codec: Codec) -> bytes:
        sizes.append(len(plain))
        return real(plain, codec)

    monkeypatch.setattr(compression, "_compress", spy)
    return sizes


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
def test_big_incompressible_batch_costs_only_a_sample(codec: Codec,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.compression import PROBE_SAMPLE_BYTES

    sizes = _spy_compressed_bytes(monkeypatch)
    batch = [os.urandom(1024) for _ in range(256)]
    assert compress_batch(batch, codec) is None
    assert sizes and max(sizes) <= PROBE_SAMPLE_BYTES


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
def test_sample_spans_the_batch(codec: Codec, monkeypatch: pytest.MonkeyPatch) -> None:
    """An incompressible head does not stop a mostly compressible batch from compressing."""
    sizes = _spy_compressed_bytes(monkeypatch)
    lines = [(json.dumps({"level": "info", "msg": f"request {i} served", "pad": "x" * 900})
              ).encode() for i in range(240)]
    batch = [os.urandom(1024) for _ in range(16)] + lines
    blob = compress_batch(batch, codec)
    assert blob is not None and len(blob) < sum(map(len, batch)) / 2
    assert decompress_batch(blob, codec, len(batch), bytes_max=1 << 20) == tuple(batch)
    assert max(sizes) > sum(map(len, batch))  # the whole batch was compressed


def test_payloads_checksum_is_the_crc_of_the_concatenation() -> None:
    """Joined or chained, the value stored in old segments and sent by old peers holds."""
    import zlib

    from shared.wire.store import payloads_checksum

    for count in range(8):
        payloads = tuple(os.urandom(n * 37 % 300) for n in range(count))
        chained = 0
        for payload in payloads:
            chained = zlib.crc32(payload, chained)
        assert payloads_checksum(payloads) == chained


def test_threads_compress_at_once_with_their_own_zstd_contexts() -> None:
    """zstandard's contexts must not be used by two threads at once: each thread gets its
    own, and batches compressed at once in several threads stay exact."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from shared import compression

    batches = [[(json.dumps({"msg": f"line {t} {i}", "pad": "y" * (i % 300)})).encode()
                for i in range(400)] for t in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        blobs = list(pool.map(lambda b: [compress_batch(b, Codec.ZSTD) for _ in range(20)],
                              batches))
        contexts = set(pool.map(lambda _: id(compression._zstd.compressor), range(8)))
    for batch, results in zip(batches, blobs, strict=True):
        for blob in results:
            assert blob is not None
            assert decompress_batch(blob, Codec.ZSTD, len(batch), bytes_max=1 << 20) == (
                tuple(batch))
    assert id(compression._zstd.compressor) not in contexts
    assert threading.current_thread() is threading.main_thread()
