"""Client authentication, permissions, quotas and limits on real node processes
(docs/SECURITY.md, issue 18 done-when 1 and 2): every HTTP route (from the node's own
openapi.json, on both HTTP paths) and every client-protocol message without valid
credentials is refused (401 / UNAUTHENTICATED) and writes nothing; a read-only principal
gets 403 on append and trim; a principal limited to logs 1-100 gets 403 on log 101; a
revoked token fails after a reload, on new and on open connections; an exhausted append
quota is 429 with Retry-After and nothing written; a slowloris client and a connection
flood do not stop a node from serving others; fuzzing the binary protocol with auth on
leaves every node healthy."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from auth_support import (
    HEAD_TIMEOUT_MS,
    HTTP_CONNECTIONS_MAX,
    RELOAD_INTERVAL_MS,
    SecureCluster,
    expired_token,
    start_secure_cluster,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqlog import Client, LogError
from seqlog.results import Record
from services import local_cluster as lc
from shared.security.tokens import mint, new_key
from shared.status import Status
from shared.types import LogId, Lsn
from shared.wire.append import Append
from shared.wire.codec import Message, decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.hello import PROTOCOL_VERSION, Hello, HelloReply
from shared.wire.read import GetLogState, Read
from shared.wire.trim import FindTime
from tests.unit.net.hostile_frames import append_works, check_case, hostile

pytestmark = pytest.mark.integration

UNTOUCHED_LOG = 5
"""Only requests without valid credentials are sent for this log: it must stay empty."""
ANSWER_TIMEOUT_S = 10.0
OPEN_PATHS = ("/healthz", "/readyz")
CONSOLE_SHELL = ("/ui", "/ui/", "/ui/static/console.js")
"""The console's page and script load without a token (they hold no data); its API does not."""
ATTACKER_IP = "127.0.0.2"
"""The slowloris and flood clients' address (loopback has all of 127/8): the node sees them
as one host, apart from the clients it must keep serving."""


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    cluster = start_secure_cluster(tmp_path_factory.mktemp("seqlog-secure"))
    try:
        yield cluster
    finally:
        lc.down(cluster.cluster.dir)


def _bad_credentials(secure: SecureCluster) -> dict[str, dict[str, str]]:
    other_key = new_key().encode()
    return {
        "none": {},
        "garbage": {"Authorization": "Bearer not-a-token"},
        "basic": {"Authorization": "Basic YWRtaW46YWRtaW4="},
        "other key": {"Authorization": f"Bearer {mint(other_key, 'admin', ttl_s=60)}"},
        "expired": {"Authorization": f"Bearer {expired_token(secure.key, 'admin')}"},
    }


_BODIES: dict[str, dict[str, Any]] = {
    "/v1/logs/{log_id}/append": {"payload": base64.b64encode(b"x").decode()},
    "/v1/logs/{log_id}/append-batch": {"payloads": [base64.b64encode(b"x").decode()]},
    "/v1/logs/{log_id}/trim": {"lsn": 1},
}
_QUERIES: dict[str, str] = {"/v1/logs/{log_id}/find-time": "?timestamp_ms=0",
                            "/v1/logs/{log_id}/records": "?from=1&wait_ms=0"}
_CONSOLE = ["/ui", "/ui/", "/ui/static/console.js", "/ui/api/stats", "/ui/api/logs",
            "/ui/api/cluster-stats"]


async def _routes(secure: SecureCluster) -> list[tuple[str, str, str]]:
    """(method, path template, URL) of every operation of the node's openapi.json, plus the
    console's routes."""
    async with aiohttp.ClientSession() as session, session.get(
            f"{secure.url}/openapi.json", headers=secure.admin_headers()) as answer:
        assert answer.status == 200
        doc = await answer.json()
    routes = [(method.upper(), path, path.replace("{log_id}", str(UNTOUCHED_LOG))
               + _QUERIES.get(path, ""))
              for path, operations in doc["paths"].items() for method in operations]
    assert len(routes) >= 13, routes
    return routes + [("GET", path, path) for path in _CONSOLE]


async def _ask(session: aiohttp.ClientSession, base: str, method: str, path: str, url: str,
               headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    async with session.request(method, base + url, json=_BODIES.get(path),
                               headers=headers, allow_redirects=False) as answer:
        return answer.status, dict(answer.headers), await answer.read()


async def _untouched(secure: SecureCluster) -> None:
    """Log ``UNTOUCHED_LOG`` holds no record and was never trimmed."""
    async with Client(secure.url, token=secure.tokens["admin"]) as client:
        try:
            result = await client.read(LogId(UNTOUCHED_LOG), Lsn(1), wait_ms=0)
            assert result.records == [], result
            tail = await client.tail(LogId(UNTOUCHED_LOG))
            assert tail.trim_lsn == 0 and tail.release_lsn == 0, tail
        except LogError as exc:
            # Never appended to: the log was not even provisioned.
            assert exc.status is Status.NOTFOUND, exc


async def test_every_http_route_without_valid_credentials_is_401_and_writes_nothing(
        secure: SecureCluster) -> None:
    routes = await _routes(secure)
    checked = 0
    for label, headers in _bad_credentials(secure).items():
        # Lean path: a fresh connection per request. aiohttp's path: one connection that a
        # probe (not a hot route) handed over to it first.
        lean = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        handed = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        try:
            status, _, _ = await _ask(handed, secure.url, "GET", "/healthz", "/healthz", {})
            assert status == 200
            for session in (lean, handed):
                for method, path, url in routes:
                    status, answer_headers, body = await _ask(session, secure.url, method,
                                                              path, url, headers)
                    if path in OPEN_PATHS or path in CONSOLE_SHELL:
                        assert status in (200, 302), (label, path, status, body)
                        continue
                    assert status == 401, (label, method, path, status, body)
                    assert b"UNAUTHENTICATED" in body, (label, path, body)
                    assert answer_headers.get("WWW-Authenticate") == "Bearer", (label, path)
                    checked += 1
        finally:
            await lean.close()
            await handed.close()
    assert checked >= 5 * 2 * 14
    await _untouched(secure)


def _client_messages() -> list[Message]:
    log = LogId(UNTOUCHED_LOG)
    return [Append(log_id=log, payloads=(b"x",), key=None, hops=0),
            Read(log_id=log, from_lsn=Lsn(1), until_lsn=Lsn(2**40), release_lsn=Lsn(2**40),
                 records_max=10, bytes_max=1000),
            GetLogState(log_id=log), FindTime(log_id=log, timestamp_ms=0)]


def _data_address(secure: SecureCluster, node_index: int = 0) -> tuple[str, int, str]:
    async def view() -> tuple[str, list[str]]:
        async with Client(secure.url, protocol="http", token=secure.tokens["admin"]) as c:
            info = await c.cluster()
        return info.cluster_fingerprint, [n.data for n in info.nodes]

    fingerprint, addresses = asyncio.run(view()) if not _in_loop() else ("", [])
    host, _, port = addresses[node_index].rpartition(":")
    return host, int(port), fingerprint


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _exchange(host: str, port: int, data: bytes) -> list[Message | Status]:
    """Send ``data`` and read every frame until the node closes the connection."""
    sock = socket.create_connection((host, port), timeout=ANSWER_TIMEOUT_S)
    decoder = FrameDecoder()
    frames: list[bytes] = []
    try:
        sock.sendall(data)
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError("the node kept the connection open") from None
            if not chunk:
                break
            frames.extend(decoder.feed(chunk))
    finally:
        sock.close()
    out: list[Message | Status] = []
    for frame in frames:
        decoded = decode(frame)
        out.append(decoded if isinstance(decoded, Status) else decoded[1])
    return out


def test_every_client_protocol_message_without_valid_credentials_is_refused(
        secure: SecureCluster) -> None:
    for node_index in range(4):  # the sequencer and every storage node
        host, port, fingerprint = _data_address(secure, node_index)
        for label, headers in _bad_credentials(secure).items():
            token = headers.get("Authorization", "").removeprefix("Bearer ")
            for message in _client_messages():
                hello = Hello(node_id="client.intruder",  # type: ignore[arg-type]
                              protocol_version=PROTOCOL_VERSION,
                              cluster_fingerprint=fingerprint, token=token)
                answers = _exchange(host, port, encode(hello) + encode(message, 3))
                assert len(answers) == 1, (label, message, answers)
                reply = answers[0]
                assert isinstance(reply, HelloReply), (label, reply)
                assert reply.status is Status.UNAUTHENTICATED, (label, reply)
    asyncio.run(_untouched(secure))


async def _http(secure: SecureCluster, method: str, path: str, token: str,
                body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session, session.request(
            method, secure.url + path, json=body,
            headers={"Authorization": f"Bearer {token}"}) as answer:
        return answer.status, dict(answer.headers), await answer.read()


def _append_body(payload: bytes = b"x") -> dict[str, str]:
    return {"payload": base64.b64encode(payload).decode()}


async def test_the_console_api_passes_the_callers_token_to_its_peers(
        secure: SecureCluster) -> None:
    """The console's cluster-wide views ask every node with the caller's own token."""
    status, _, body = await _http(secure, "GET", "/ui/api/cluster-stats",
                                  secure.tokens["reader"])
    assert status == 200, body
    doc = json.loads(body)
    assert doc["unreachable"] == [] and doc["nodes"] == 4, doc


async def test_a_read_only_principal_gets_403_on_append_and_trim(
        secure: SecureCluster) -> None:
    reader = secure.tokens["reader"]
    status, _, _ = await _http(secure, "POST", "/v1/logs/7/append", secure.tokens["admin"],
                               _append_body(b"seed"))
    assert status == 200
    status, _, body = await _http(secure, "POST", "/v1/logs/7/append", reader, _append_body())
    assert (status, b"ACCESS" in body) == (403, True), body
    status, _, body = await _http(secure, "POST", "/v1/logs/7/trim", reader, {"lsn": 1})
    assert (status, b"ACCESS" in body) == (403, True), body
    status, _, body = await _http(secure, "GET", "/v1/logs/7/records?from=1", reader)
    assert status == 200, body
    async with Client(secure.url, token=reader) as client:
        with pytest.raises(LogError) as refused:
            await client.append(LogId(7), b"x")
        assert refused.value.status is Status.ACCESS
        assert client.protocol == "binary"
        records = (await client.read(LogId(7), Lsn(1), wait_ms=0)).records
        assert [r.payload for r in records] == [b"seed"]


async def test_the_direct_reader_reads_storage_nodes_with_its_token(
        secure: SecureCluster) -> None:
    """``Client.reader`` says HELLO to the storage nodes themselves, with the client's
    token."""
    async with Client(secure.url, token=secure.tokens["admin"]) as admin:
        await admin.append_batch(LogId(8), [b"d1", b"d2"])
    async with Client(secure.url, token=secure.tokens["reader"]) as client:
        async with asyncio.timeout(ANSWER_TIMEOUT_S), await client.reader(
                LogId(8), Lsn(1)) as reader:
            payloads = [e.payload async for e in reader if isinstance(e, Record)]
        assert payloads == [b"d1", b"d2"]


async def test_a_principal_limited_to_logs_1_to_100_gets_403_on_log_101(
        secure: SecureCluster) -> None:
    ranged = secure.tokens["ranged"]
    status, _, body = await _http(secure, "POST", "/v1/logs/100/append", ranged, _append_body())
    assert status == 200, body
    status, _, body = await _http(secure, "POST", "/v1/logs/101/append", ranged, _append_body())
    assert (status, b"ACCESS" in body) == (403, True), body
    status, _, body = await _http(secure, "GET", "/v1/logs/101/tail", ranged)
    assert status == 403, body
    async with Client(secure.url, token=ranged) as client:
        assert (await client.append(LogId(100), b"binary")).lsn > 0
        with pytest.raises(LogError) as refused:
            await client.append(LogId(101), b"x")
        assert refused.value.status is Status.ACCESS
    async with Client(secure.url, token=secure.tokens["admin"]) as admin:
        with pytest.raises(LogError) as never_written:
            await admin.read(LogId(101), Lsn(1), wait_ms=0)
        assert never_written.value.status is Status.NOTFOUND
    # A token scoped below its principal's grants is held to its scope.
    scoped = secure.token("ranged", scope=["append:1-10"])
    status, _, _ = await _http(secure, "POST", "/v1/logs/11/append", scoped, _append_body())
    assert status == 403


async def test_a_revoked_token_fails_after_a_reload(secure: SecureCluster) -> None:
    token = secure.token("ranged", token_id="to-revoke")
    status, _, _ = await _http(secure, "POST", "/v1/logs/50/append", token, _append_body())
    assert status == 200
    try:
        async with Client(secure.url, token=token) as client:
            await client.append(LogId(50), b"before")  # its binary connection stays open
            secure.write_permissions(revoked=["to-revoke"])
            deadline = time.monotonic() + 10 * RELOAD_INTERVAL_MS / 1000 + 5
            while True:
                status, _, body = await _http(secure, "POST", "/v1/logs/50/append", token,
                                              _append_body())
                if status == 401:
                    assert b"revoked" in body
                    break
                assert status == 200 and time.monotonic() < deadline, (status, body)
                await asyncio.sleep(0.05)
            with pytest.raises(LogError) as refused:
                await client.append(LogId(50), b"after")
            assert refused.value.status is Status.UNAUTHENTICATED
        async with Client(secure.url, token=token) as fresh:
            with pytest.raises(LogError) as refused:
                await fresh.append(LogId(50), b"after")
            assert refused.value.status is Status.UNAUTHENTICATED
        # Another token of the same principal still works.
        status, _, _ = await _http(secure, "POST", "/v1/logs/50/append",
                                   secure.tokens["ranged"], _append_body())
        assert status == 200
    finally:
        secure.write_permissions()


async def test_an_exhausted_append_quota_is_429_with_retry_after_and_nothing_written(
        secure: SecureCluster) -> None:
    metered = secure.tokens["metered"]
    log = "/v1/logs/300"
    batch = {"payloads": [base64.b64encode(b"a").decode(), base64.b64encode(b"b").decode()]}
    # 2 records/s, a bucket of 2: a full batch, then nothing until it refills.
    status, _, body = await _http(secure, "POST", f"{log}/append-batch", metered, batch)
    assert status == 200, body
    status, headers, body = await _http(secure, "POST", f"{log}/append", metered,
                                        _append_body(b"c"))
    assert status == 429 and b"RATE_LIMITED" in body, (status, body)
    assert int(headers["Retry-After"]) >= 1
    async with Client(secure.url, token=metered, retries_max=0) as client:
        with pytest.raises(LogError) as refused:
            await client.append_batch(LogId(300), [b"d", b"e", b"f"])
        assert refused.value.status is Status.RATE_LIMITED
        records = (await client.read(LogId(300), Lsn(1), wait_ms=0)).records
        assert [r.payload for r in records] == [b"a", b"b"]


async def _slowloris(port: int, stop: asyncio.Event, closed: list[int],
                     handed: bool = False) -> None:
    """Opens a connection, sends a partial request head a byte at a time, forever; counts
    the connections the node closed. ``handed``: first a probe (not a hot route), so that
    the lean edge hands the connection to aiohttp, which has no head deadline of its own."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=(ATTACKER_IP, 0))
        except OSError:
            await asyncio.sleep(0.05)
            continue
        try:
            if handed:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                async with asyncio.timeout(ANSWER_TIMEOUT_S):
                    await reader.readuntil(b"\r\n\r\n")
            writer.write(b"POST /v1/logs/7/append HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                writer.write(b"X")
                await writer.drain()
                try:
                    async with asyncio.timeout(0.2):
                        if not await reader.read(65536):
                            break
                except TimeoutError:
                    continue
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            closed.append(1)
            writer.close()


async def _flood(port: int, stop: asyncio.Event, held: int) -> None:
    """Keeps ``held`` silent connections open to ``port``, replacing those the node closes."""
    open_: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    while not stop.is_set():
        for reader, writer in open_:
            if reader.at_eof() or reader.exception() is not None:
                writer.close()
        open_ = [(r, w) for r, w in open_ if not w.is_closing()]
        while len(open_) < held and not stop.is_set():
            try:
                open_.append(await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=(ATTACKER_IP, 0)))
            except OSError:
                break
        await asyncio.sleep(0.05)
    for _, writer in open_:
        writer.close()


async def test_slowloris_and_a_connection_flood_do_not_stop_a_node_serving_others(
        secure: SecureCluster) -> None:
    http_port = int(secure.url.rpartition(":")[2])
    async with Client(secure.url, protocol="http", token=secure.tokens["admin"]) as c:
        info = await c.cluster()
    data_port = int(next(n.data for n in info.nodes if "sequencer" in n.roles
                         ).rpartition(":")[2])
    stop = asyncio.Event()
    closed: list[int] = []
    attackers = [asyncio.create_task(_slowloris(http_port, stop, closed)) for _ in range(40)]
    handed_closed: list[int] = []
    attackers += [asyncio.create_task(_slowloris(http_port, stop, handed_closed, handed=True))
                  for _ in range(HTTP_CONNECTIONS_MAX)]
    attackers += [asyncio.create_task(_flood(http_port, stop, 2 * HTTP_CONNECTIONS_MAX)),
                  asyncio.create_task(_flood(data_port, stop, 2 * HTTP_CONNECTIONS_MAX))]
    latencies: list[float] = []
    try:
        await asyncio.sleep(1.0)  # the attack is on
        admin = secure.tokens["admin"]
        ended = time.monotonic() + 4 * HEAD_TIMEOUT_MS / 1000
        while time.monotonic() < ended:
            started = time.monotonic()
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                # New connections each time, to both ports, while the attack holds them full:
                # the node makes room (or answers 503, which the client retries).
                async with Client(secure.url, token=admin) as binary:
                    await binary.append(LogId(400), b"b")
                    assert binary.protocol == "binary"
                async with Client(secure.url, token=admin, protocol="http") as http:
                    await http.append(LogId(400), b"h")
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*attackers, return_exceptions=True)
    assert len(latencies) >= 5 and max(latencies) < 5.0, latencies
    # The head deadline cut the slowloris connections; those handed to aiohttp were evicted
    # for the flood's connections (and the clients').
    assert len(closed) >= 40, len(closed)
    assert len(handed_closed) >= HTTP_CONNECTIONS_MAX, len(handed_closed)
    for node in secure.cluster.state.nodes:
        async with aiohttp.ClientSession() as session, session.get(
                f"http://{node.http}/readyz") as answer:
            assert answer.status == 200


def _hello_fuzz_cases() -> st.SearchStrategy[str]:
    return st.text(max_size=200) | st.binary(max_size=100).map(
        lambda b: base64.urlsafe_b64encode(b).decode())


def _binary_fuzz(secure: SecureCluster, examples: int) -> None:
    host, port, fingerprint = _data_address(secure, 0)
    admin = secure.tokens["admin"]
    append_works(port, fingerprint, admin)

    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(hostile())
    def with_credentials(case: tuple[str, bytes]) -> None:
        check_case(port, fingerprint, case, admin)

    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(_hello_fuzz_cases())
    def forged_tokens(token: str) -> None:
        hello = Hello(node_id="client.fuzz",  # type: ignore[arg-type]
                      protocol_version=PROTOCOL_VERSION, cluster_fingerprint=fingerprint,
                      token=token)
        answers = _exchange(host, port, encode(hello) + encode(_client_messages()[0], 1))
        assert len(answers) == 1 and isinstance(answers[0], HelloReply), answers
        assert answers[0].status is Status.UNAUTHENTICATED

    with_credentials()
    forged_tokens()
    append_works(port, fingerprint, admin)


def test_fuzzing_the_binary_protocol_with_auth_on_leaves_the_node_healthy(
        secure: SecureCluster) -> None:
    _binary_fuzz(secure, 60)
    asyncio.run(_untouched(secure))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fuzzing_the_binary_protocol_with_auth_on_large(secure: SecureCluster) -> None:
    _binary_fuzz(secure, 1500)
    asyncio.run(_untouched(secure))


def test_schemathesis_with_auth_on(secure: SecureCluster, tmp_path: Path) -> None:
    from test_schemathesis import SMALL_EXAMPLES, SMALL_SEED, check_run
    check_run(secure.cluster, SMALL_EXAMPLES, timeout_s=300, workdir=tmp_path, seed=SMALL_SEED,
              token=secure.tokens["admin"])


@pytest.mark.slow
@pytest.mark.timeout(3900)
def test_schemathesis_with_auth_on_large(secure: SecureCluster, tmp_path: Path) -> None:
    from test_schemathesis import LARGE_EXAMPLES, check_run
    check_run(secure.cluster, LARGE_EXAMPLES, timeout_s=3600, workdir=tmp_path,
              token=secure.tokens["admin"])
