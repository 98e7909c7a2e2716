"""The lean HTTP edge of a real node process: pipelined appends answered in order with
consecutive LSNs, a pipeline that moves to aiohttp mid-way, and malformed or random bytes that
get 4xx answers and leave the node serving."""

from __future__ import annotations

import asyncio
import os

import httptools
import msgpack
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqlog_cluster_support import RunningCluster

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0


def _append(log_id: int, payload: bytes, extra: bytes = b"") -> bytes:
    body = msgpack.packb({"payload": payload}, use_bin_type=True)
    return (b"POST /v1/logs/%d/append HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack"
            b"\r\nAccept: application/msgpack\r\n%sContent-Length: %d\r\n\r\n"
            % (log_id, extra, len(body)) + body)


class _Answers:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.bodies: list[bytes] = []
        self.parser = httptools.HttpResponseParser(self)
        self._body = b""

    def on_message_begin(self) -> None:
        self._body = b""

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        code = self.parser.get_status_code()
        if code != 100:
            self.codes.append(code)
            self.bodies.append(self._body)


async def _exchange(http: str, data: bytes, *, eof: bool = False) -> _Answers:
    """Write ``data`` at once (then end the stream if ``eof``); read answers until the node
    closes the connection."""
    host, port = http.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    answers = _Answers()
    try:
        writer.write(data)
        if eof:
            writer.write_eof()
        async with asyncio.timeout(DEADLINE_S):
            while chunk := await reader.read(65536):
                answers.parser.feed_data(chunk)
    finally:
        writer.close()
    return answers


def _closing_get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


async def _owner_http(cluster: RunningCluster, log_id: int) -> str:
    """The HTTP address of the log's sequencer (appends there are not forwarded)."""
    answers = await _exchange(cluster.state.nodes[0].http, _append(
        log_id, b"probe", b"X-Seqlog-No-Forward: 1\r\nConnection: close\r\n"))
    if answers.codes == [200]:
        return cluster.state.nodes[0].http
    assert answers.codes == [307], answers.codes
    return str(msgpack.unpackb(answers.bodies[0])["sequencer_http"])


async def test_pipelined_appends_on_a_node_get_consecutive_lsns_in_order(
    local_cluster: RunningCluster,
) -> None:
    log_id = int.from_bytes(os.urandom(4), "big") + 5_000_000_000
    owner = await _owner_http(local_cluster, log_id)
    data = b"".join(_append(log_id, b"p%d" % i) for i in range(50))
    answers = await _exchange(owner, data + _append(log_id, b"cluster next") + _closing_get(
        "/v1/cluster"))
    assert answers.codes == [200] * 52
    lsns = [msgpack.unpackb(body)["lsn"] for body in answers.bodies[:51]]
    # Dispatched in request order on one connection: the sequencer numbers them so.
    assert lsns == list(range(lsns[0], lsns[0] + 51))
    assert {n["node_id"] for n in orjson.loads(answers.bodies[51])["nodes"]} == {
        n.node_id for n in local_cluster.state.nodes}


@settings(max_examples=30, deadline=None)
@given(junk=st.binary(max_size=200) | st.sampled_from([
    b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/logs/1/append HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
    b"POST /v1/logs/1/append HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffff\r\n",
    b"GET /v1/logs/1/records?from=x HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  # a TLS hello
]))
async def test_malformed_requests_get_4xx_and_the_node_keeps_serving(
    local_cluster: RunningCluster, junk: bytes,
) -> None:
    # The end of the stream stops the node waiting for a body the junk announced (it would
    # otherwise refuse it after body_read_timeout_ms); it may then close without an answer.
    http = local_cluster.state.nodes[0].http
    answers = await _exchange(http, junk + _closing_get("/healthz"), eof=True)
    assert all(code < 500 for code in answers.codes), (junk, answers.codes)
    after = await _exchange(http, _closing_get("/readyz"))
    assert after.codes == [200]
