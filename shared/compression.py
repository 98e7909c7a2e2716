"""Compressed record batches: one format for writers, the wire, storage and readers.

A compressed batch is the msgpack array of its records' payloads (``[bin, bin, ...]``),
compressed whole by one codec. Writers (``seqlog``'s buffered writer, HTTP append-batch
callers) build it with ``compress_batch``, which keeps the compressed form only when it is
smaller than the plain payloads; everything between the writer and the reader carries it as one
opaque blob plus its record count, and readers expand it with ``decompress_batch``.

Expanding is bounded before any memory is spent: the blob's frame header must announce at most
``bytes_max`` bytes (both codecs write the content size into the frame), and the result must be
exactly ``records`` payloads. A blob that lies about either is ``BADMSG``, never a crash or a
huge allocation (a decompression bomb).
"""

from __future__ import annotations

import threading
from enum import IntEnum

import lz4.frame
import msgpack
import zstandard

from shared.limits import BATCH_RECORDS_MAX, COMPRESSED_BATCH_PLAIN_BYTES_MAX
from shared.status import Status


class Codec(IntEnum):
    """Permanent wire ids of the codecs; 0 means "not compressed"."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2


CODEC_NAMES: dict[str, Codec] = {"lz4": Codec.LZ4, "zstd": Codec.ZSTD}
"""The names users and the HTTP API give the codecs."""

ZSTD_LEVEL = 1
"""On JSON log lines level 1 measured faster than level 3 (2.5 vs 3.3 us per 1 KiB record)
with about the same ratio (4.9 vs 4.7), and a much better one than LZ4's (2.9)."""


class _ZstdContexts(threading.local):
    """One compressor and decompressor per thread: zstandard's contexts are reused across
    calls (no setup per batch) but must not be used by two threads at once, and nothing stops
    a caller from compressing or expanding batches off its event loop."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
        self.decompressor = zstandard.ZstdDecompressor()


_zstd = _ZstdContexts()


def _plain(payloads: tuple[bytes, ...] | list[bytes]) -> bytes:
    packed: bytes = msgpack.packb(payloads, use_bin_type=True)
    return packed


PROBE_SAMPLE_BYTES = 16 * 1024
"""A batch of at least ``PROBE_BATCH_FACTOR`` times this many bytes is first probed with a
sample this big: incompressible data (encrypted, already compressed, random) then costs a
compression of the sample, not of the whole batch and its msgpack copy."""
PROBE_BATCH_FACTOR = 4
PROBE_SAVING_MIN = 0.05
"""The sample must shrink by at least this fraction for the whole batch to be tried."""


def _compress(plain: bytes, codec: Codec) -> bytes:
    if codec is Codec.LZ4:
        blob: bytes = lz4.frame.compress(plain, store_size=True)
        return blob
    return _zstd.compressor.compress(plain)


def _sample(payloads: tuple[bytes, ...] | list[bytes], plain_bytes: int) -> bytes:
    """About ``PROBE_SAMPLE_BYTES`` of payloads taken evenly across the batch (a batch whose
    head differs from its tail is judged by both)."""
    count = len(payloads)
    wanted = max(1, min(count, count * PROBE_SAMPLE_BYTES // plain_bytes))
    step = count / wanted
    return b"".join(payloads[int(i * step)] for i in range(wanted))[:PROBE_SAMPLE_BYTES]


def worth_compressing(payloads: tuple[bytes, ...] | list[bytes], codec: Codec,
                      plain_bytes: int) -> bool:
    """Whether ``compress_whole`` may shrink a batch of ``plain_bytes`` payload bytes: False
    without a codec, and for a big batch whose sample does not compress
    (``PROBE_SAMPLE_BYTES``). Cheap: callers run it inline and hand only batches worth it to
    ``compress_whole`` (which they may run off their event loop)."""
    if codec is Codec.NONE or not payloads:
        return False
    if plain_bytes >= PROBE_BATCH_FACTOR * PROBE_SAMPLE_BYTES:
        sample = _sample(payloads, plain_bytes)
        if len(_compress(sample, codec)) > len(sample) * (1 - PROBE_SAVING_MIN):
            return False
    return True


def compress_whole(payloads: tuple[bytes, ...] | list[bytes], codec: Codec,
                   plain_bytes: int) -> bytes | None:
    """The compressed batch, or None when it is not smaller than its ``plain_bytes`` payload
    bytes. Holds the GIL only to pack the batch (both codecs release it while compressing), so
    a thread can run it beside an event loop."""
    blob = _compress(_plain(payloads), codec)
    return blob if len(blob) < plain_bytes else None


def compress_batch(payloads: tuple[bytes, ...] | list[bytes], codec: Codec) -> bytes | None:
    """The compressed batch, or None when compressing does not make it smaller than its plain
    payloads (then send them uncompressed). A big batch whose sample does not compress is
    sent plain without compressing it whole (``PROBE_SAMPLE_BYTES``)."""
    plain_bytes = sum(map(len, payloads))
    if not worth_compressing(payloads, codec, plain_bytes):
        return None
    return compress_whole(payloads, codec, plain_bytes)


def _content_size(blob: bytes, codec: Codec) -> int | None:
    """The decompressed size the frame header announces, or None if it announces none."""
    try:
        if codec is Codec.LZ4:
            info = lz4.frame.get_frame_info(blob)
            size = int(info.get("content_size", 0))
            return size if size > 0 else None
        size = zstandard.frame_content_size(blob)
        return size if size >= 0 else None
    except (RuntimeError, zstandard.ZstdError, ValueError):
        return None


_ONLY_BYTES = frozenset((bytes,))
"""``_ONLY_BYTES.issuperset(map(type, xs))``: every item is bytes, in one C loop."""


def decompress_batch(blob: bytes, codec: int, records: int, *,
                     bytes_max: int) -> tuple[bytes, ...] | Status:
    """The payloads of a compressed batch of ``records`` records, or ``BADMSG`` when the blob
    is not a valid batch of that many records within ``bytes_max`` plain bytes."""
    if codec not in (Codec.LZ4, Codec.ZSTD) or records < 1:
        return Status.BADMSG
    kind = Codec(codec)
    size = _content_size(blob, kind)
    # The msgpack array adds at most 5 bytes per record and 5 for the array header.
    if size is None or size > bytes_max + 5 * records + 5:
        return Status.BADMSG
    try:
        if kind is Codec.LZ4:
            plain = lz4.frame.decompress(blob)
        else:
            plain = _zstd.decompressor.decompress(blob, max_output_size=size)
        if len(plain) != size:
            return Status.BADMSG
        payloads = msgpack.unpackb(plain, use_list=False, raw=False,
                                   max_array_len=records, max_bin_len=size)
    except (RuntimeError, zstandard.ZstdError, ValueError, msgpack.UnpackException,
            msgpack.ExtraData, TypeError):
        return Status.BADMSG
    if (type(payloads) is not tuple or len(payloads) != records
            or not _ONLY_BYTES.issuperset(map(type, payloads))):
        return Status.BADMSG
    return payloads


def check_batch(blob: bytes, codec: int, records: int, *, records_max: int,
                payload_bytes_max: int, bytes_max: int) -> Status:
    """The check where a compressed batch enters the cluster (an HTTP append-batch, a
    client's APPEND): it is expanded once, so that everything downstream (sequencer, storage
    nodes, readers) can take it as valid. TOOBIG for more than ``records_max`` records or a
    record over ``payload_bytes_max``; BADMSG for anything that is not exactly ``records``
    payloads within ``bytes_max`` plain bytes."""
    if not 1 <= records <= min(records_max, BATCH_RECORDS_MAX):
        return Status.TOOBIG if records > records_max else Status.BADMSG
    payloads = decompress_batch(blob, codec, records,
                                bytes_max=min(bytes_max, COMPRESSED_BATCH_PLAIN_BYTES_MAX))
    if isinstance(payloads, Status):
        return payloads
    if max(map(len, payloads)) > payload_bytes_max:
        return Status.TOOBIG
    return Status.OK


def check_batch_header(blob: bytes, codec: int, records: int, *, records_max: int,
                       bytes_max: int) -> Status:
    """The cheap check of a batch another node already expanded (``check_batch``): a known
    codec, a record count in range, and a frame header announcing a plain size that fits."""
    if codec not in (Codec.LZ4, Codec.ZSTD) or records < 1:
        return Status.BADMSG
    if records > min(records_max, BATCH_RECORDS_MAX):
        return Status.TOOBIG
    size = _content_size(blob, Codec(codec))
    limit = min(bytes_max, COMPRESSED_BATCH_PLAIN_BYTES_MAX)
    # Each payload takes at least one msgpack byte; the array adds at most 5 per record + 5.
    if size is None or not records < size <= limit + 5 * records + 5:
        return Status.BADMSG
    return Status.OK


def expand_stored(blob: bytes, codec: int, records: int) -> tuple[bytes, ...] | Status:
    """The payloads of a batch a storage node holds (it was checked where it entered the
    cluster; a stored blob that fails here is corruption, ``BADMSG``)."""
    return decompress_batch(blob, codec, records, bytes_max=COMPRESSED_BATCH_PLAIN_BYTES_MAX)


def plain_bytes(blob: bytes, codec: int) -> int:
    """About how many payload bytes a batch holds (its frame header's content size, which
    counts the msgpack framing too; the blob's own size if the header says nothing): what
    limits on read bytes count, without expanding it."""
    size = _content_size(blob, Codec(codec)) if codec in (Codec.LZ4, Codec.ZSTD) else None
    return size if size is not None else len(blob)
