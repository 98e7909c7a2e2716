"""The append rules (shared.append_validation): a single payload gets the same answers as
any batch, whatever path the check takes."""

from __future__ import annotations

import pytest

from shared.append_validation import check_payloads
from shared.config import ApiConfig
from shared.status import Status

API = ApiConfig(payload_bytes_max=1024, request_bytes_max=4096, batch_records_max=3)


@pytest.mark.parametrize("payload", [b"", b"x", b"y" * 1024])
def test_a_single_payload_within_the_limits_passes(payload: bytes) -> None:
    assert check_payloads((payload,), API) is None


def test_a_single_payload_over_payload_bytes_max_is_toobig() -> None:
    invalid = check_payloads((b"z" * 1025,), API)
    assert invalid is not None and invalid.status is Status.TOOBIG
    assert "payload has 1025 bytes" in invalid.message


@pytest.mark.parametrize("payload", ["text", bytearray(b"x"), 7, None])
def test_a_single_payload_that_is_not_bytes_is_badmsg(payload: object) -> None:
    invalid = check_payloads((payload,), API)
    assert invalid is not None and invalid.status is Status.BADMSG
    assert invalid.message == "payload must be bytes"


def test_batches_keep_their_checks() -> None:
    assert check_payloads((b"a", b"b"), API) is None
    empty = check_payloads((), API)
    assert empty is not None and empty.status is Status.INVALID_PARAM
    many = check_payloads((b"a",) * 4, API)
    assert many is not None and many.status is Status.TOOBIG
    total = check_payloads((b"a" * 1024,) * 3 + (), ApiConfig(
        payload_bytes_max=1024, request_bytes_max=2048, batch_records_max=3))
    assert total is not None and total.status is Status.TOOBIG
    assert "request_bytes_max=2048" in total.message
    bad = check_payloads((b"a", "b"), API)
    assert bad is not None and bad.message == "payloads[1] must be bytes"
