"""The lean edge's one-step paths for most appends say exactly what the general ones say:
``plain_payload`` answers as ``parse_append`` wherever it answers at all (the same payload,
no options) and leaves everything else (options, JSON, a payload over the limit, a wrong
type) to it; the pre-encoded append answer is msgpack's own encoding of the answer's map."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from services.http_edge import _LSN_ANSWER, _LSN_KEY, _TIMESTAMP_KEY, _UINT64_MIN
from services.http_parse import AppendRequest, parse_append, plain_payload
from shared.config import ApiConfig
from shared.http_contract import JSON, MSGPACK

API = ApiConfig(payload_bytes_max=64)

_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                    st.binary(max_size=80), st.lists(st.binary(max_size=4), max_size=2))
_docs = st.one_of(
    st.fixed_dictionaries({"payload": _values}),
    st.dictionaries(st.sampled_from(["payload", "key", "producer_id", "producer_seq", "x"]),
                    _values, max_size=4),
)


@given(doc=_docs, media=st.sampled_from([MSGPACK, JSON]))
def test_plain_payload_agrees_with_parse_append(doc: dict[str, Any], media: str) -> None:
    plain = plain_payload(doc, media, API)  # type: ignore[arg-type]
    parsed = parse_append(doc, media, API)  # type: ignore[arg-type]
    if plain is not None:
        assert parsed == AppendRequest(payloads=(plain,), key=None, producer_id=None,
                                       producer_seq=None)


def test_plain_payload_takes_only_a_lone_msgpack_payload_within_the_limit() -> None:
    assert plain_payload({"payload": b"x" * 64}, MSGPACK, API) == b"x" * 64
    assert plain_payload({"payload": b"x" * 65}, MSGPACK, API) is None  # TOOBIG, said there
    assert plain_payload({"payload": "eA=="}, JSON, API) is None  # base64: parse_append's
    assert plain_payload({"payload": b"x", "key": "k"}, MSGPACK, API) is None
    assert plain_payload({"payload": "x"}, MSGPACK, API) is None
    assert plain_payload({"other": b"x"}, MSGPACK, API) is None


@given(lsn=st.integers(_UINT64_MIN, 2**64 - 1), timestamp_ms=st.integers(_UINT64_MIN, 2**64 - 1))
def test_the_pre_encoded_append_answer_is_msgpacks_own(lsn: int, timestamp_ms: int) -> None:
    assert _LSN_ANSWER.pack(_LSN_KEY, lsn, _TIMESTAMP_KEY, timestamp_ms) == msgpack.packb(
        {"lsn": lsn, "timestamp_ms": timestamp_ms}, use_bin_type=True)
