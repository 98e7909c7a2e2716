"""Contract seams found by schemathesis on real nodes (issue 19 item 5): a producer pair
reused for an append of another size is 409 STALE with nothing written (it used to be an
assertion failure, answered 500), on both HTTP paths (the lean edge, and aiohttp after a
handover), and the idempotent retry of the same append still answers its original LSNs."""

from __future__ import annotations

import base64
import os

import aiohttp
import pytest
from seqlog_cluster_support import RunningCluster

pytestmark = pytest.mark.integration


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def test_a_producer_pair_reused_for_another_size_is_stale(
        local_cluster: RunningCluster) -> None:
    log_id = int.from_bytes(os.urandom(4), "big") + 5_000_000
    base = local_cluster.sequencer_urls[0]
    producer = {"producer_id": "reuser", "producer_seq": 1}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def post(route: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
            async with session.post(f"{base}/v1/logs/{log_id}/{route}", json=body) as answer:
                return answer.status, await answer.json()

        status, first = await post("append-batch", {"payloads": [_b64(b"a"), _b64(b"b")],
                                                    **producer})
        assert status == 200 and first["count"] == 2, first
        status, again = await post("append-batch", {"payloads": [_b64(b"a"), _b64(b"b")],
                                                    **producer})
        assert (status, again["first_lsn"], again["last_lsn"]) == (
            200, first["first_lsn"], first["last_lsn"])
        for route, body in (("append", {"payload": _b64(b"c")}),
                            ("append-batch", {"payloads": [_b64(b"c")] * 3})):
            status, refused = await post(route, {**body, **producer})
            assert (status, refused["status"]) == (409, "STALE"), refused
        # The aiohttp path (a connection handed over by a non-hot request first).
        async with session.get(f"{base}/v1/cluster") as answer:
            assert answer.status == 200
        status, refused = await post("append", {"payload": _b64(b"c"), **producer})
        assert (status, refused["status"]) == (409, "STALE"), refused
        async with session.get(f"{base}/v1/logs/{log_id}/records") as answer:
            page = await answer.json()
    assert [base64.b64decode(r["payload"]) for r in page["records"]] == [b"a", b"b"]
