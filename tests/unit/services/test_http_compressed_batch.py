"""The compressed append-batch at the HTTP edge (``parse_compressed_batch``): a good lz4 or zstd
batch passes with its blob and record count; every way a blob can be wrong is refused before
anything is written, and random input never raises."""

from __future__ import annotations

import base64
import json
import os

import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from services.http_parse import AppendRequest, Rejection, parse_append_batch
from shared.compression import Codec, compress_batch
from shared.config import ApiConfig
from shared.http_contract import JSON, MSGPACK
from shared.status import Status

API = ApiConfig(payload_bytes_max=4096, request_bytes_max=1 << 20, batch_records_max=500)
LINES = [json.dumps({"level": "warn", "msg": f"slow query {i}", "ms": i}).encode()
         for i in range(120)]


def _doc(blob: bytes, codec: str, records: int, media: str = MSGPACK) -> dict[str, object]:
    value: object = blob if media == MSGPACK else base64.b64encode(blob).decode()
    return {"compression": codec, "records": records, "compressed_payloads": value,
            "key": "k", "producer_id": "p", "producer_seq": 3}


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
@pytest.mark.parametrize("media", [MSGPACK, JSON])
def test_good_batch_passes_compressed(codec: Codec, media: str) -> None:
    blob = compress_batch(LINES, codec)
    assert blob is not None
    parsed = parse_append_batch(_doc(blob, codec.name.lower(), len(LINES), media), media, API)
    assert parsed == AppendRequest(payloads=(blob,), key="k", producer_id="p", producer_seq=3,
                                   compression=int(codec), records=len(LINES))
    assert isinstance(parsed, AppendRequest) and parsed.records_count == len(LINES)


def _status(doc: dict[str, object]) -> Status:
    parsed = parse_append_batch(doc, MSGPACK, API)
    assert isinstance(parsed, Rejection), parsed
    assert parsed.message
    return parsed.status


def test_bad_batches_are_refused() -> None:
    blob = compress_batch(LINES, Codec.LZ4)
    assert blob is not None
    good = _doc(blob, "lz4", len(LINES))
    assert _status({**good, "records": len(LINES) - 1}) is Status.BADMSG
    assert _status({**good, "records": len(LINES) + 1}) is Status.BADMSG
    assert _status({**good, "compression": "zstd"}) is Status.BADMSG
    assert _status({**good, "compression": "gzip"}) is Status.BADMSG
    assert _status({**good, "compression": 1}) is Status.BADMSG
    assert _status({**good, "compressed_payloads": os.urandom(200)}) is Status.BADMSG
    assert _status({**good, "compressed_payloads": blob[:-4]}) is Status.BADMSG
    assert _status({**good, "compressed_payloads": "text"}) is Status.BADMSG
    assert _status({k: v for k, v in good.items() if k != "compressed_payloads"}) is (
        Status.BADMSG)
    assert _status({**good, "records": "120"}) is Status.BADMSG
    assert _status({**good, "records": 0}) is Status.INVALID_PARAM
    assert _status({**good, "records": 501}) is Status.TOOBIG
    bomb = zstandard.ZstdCompressor().compress(msgpack.packb([b"\0" * (8 << 20)]))
    assert _status(_doc(bomb, "zstd", 1)) is Status.BADMSG
    # A record over payload_bytes_max, and a batch over request_bytes_max once expanded.
    big = compress_batch([b"x" * 5000], Codec.ZSTD)
    assert big is not None
    assert _status(_doc(big, "zstd", 1)) is Status.TOOBIG
    many = compress_batch([b"y" * 4000] * 300, Codec.ZSTD)
    assert many is not None
    assert _status(_doc(many, "zstd", 300)) is Status.BADMSG
    # Bad options are refused as for a plain batch.
    assert _status({**good, "producer_id": ""}) is Status.INVALID_PARAM


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["lz4", "zstd", "none", ""]),
       st.integers(-2, 600))
def test_fuzz_random_blobs_never_raise_and_never_pass(blob: bytes, codec: str,
                                                      records: int) -> None:
    parsed = parse_append_batch(_doc(blob, codec, records), MSGPACK, API)
    assert isinstance(parsed, Rejection)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=64), min_size=1, max_size=40),
       st.sampled_from([Codec.LZ4, Codec.ZSTD]), st.integers(0, 200))
def test_fuzz_cut_or_flipped_blobs(payloads: list[bytes], codec: Codec, at: int) -> None:
    payloads = [p * 8 for p in payloads]  # compressible, so that compress_batch keeps it
    blob = compress_batch(payloads, codec)
    if blob is None:
        return
    for bad in (blob[: at % len(blob)], blob[:at % len(blob)] + bytes([blob[at % len(blob)] ^ 1])
                + blob[at % len(blob) + 1:]):
        parsed = parse_append_batch(_doc(bad, codec.name.lower(), len(payloads)), MSGPACK, API)
        # Either refused, or (a flip the frame does not notice) exactly as many payloads.
        assert isinstance(parsed, Rejection) or parsed.records == len(payloads)


def test_append_message_edge_expands_client_batches_and_header_checks_forwarded_ones() -> None:
    """An APPEND with ``hops == 0`` enters the cluster at this node (a client): the batch is
    expanded once; a peer's forwarded one (``hops > 0``) gets the cheap header check."""
    from shared.append_validation import check_compressed_append

    blob = compress_batch(LINES, Codec.ZSTD)
    assert blob is not None

    def status(hops: int, **fields: object) -> Status:
        values: dict[str, object] = {"log_id": 1, "payloads": (blob,), "compression": 2,
                                     "records": len(LINES)}
        values.update(fields)
        invalid = check_compressed_append(
            values["log_id"], values["payloads"], values["compression"],  # type: ignore[arg-type]
            values["records"], None, None, None, API, entering=hops == 0)  # type: ignore[arg-type]
        return Status.OK if invalid is None else invalid.status

    for hops in (0, 1):
        assert status(hops) is Status.OK
        assert status(hops, compression=7) is Status.BADMSG
        assert status(hops, compression=0) is Status.BADMSG  # records without a codec
        assert status(hops, payloads=(blob, blob)) is Status.BADMSG
        assert status(hops, records=501) is Status.TOOBIG
        assert status(hops, payloads=(os.urandom(64),)) is Status.BADMSG
    # A wrong count only shows when the batch is expanded: at the client's edge.
    assert status(0, records=len(LINES) - 1) is Status.BADMSG
    assert status(1, records=len(LINES) - 1) is Status.OK
    bomb = zstandard.ZstdCompressor().compress(msgpack.packb([b"\0" * (8 << 20)]))
    assert status(1, payloads=(bomb,), records=1) is Status.BADMSG
