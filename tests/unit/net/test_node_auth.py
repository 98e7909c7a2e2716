"""Node authentication on the transport (shared.net.node_auth) over real loopback TCP: mutual TLS
with node certificates, the cluster-secret challenge without TLS, refusals counted by reason,
client connections that cannot send node-only messages, and certificates reloaded for new
connections."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.certs import CertFiles, make_ca, make_cert, make_secret
from shared.config import TlsConfig, TransportConfig
from shared.net import PeerPool, Server, start_server
from shared.net.connection import TlsReads
from shared.net.node_auth import NodeSecurity, SecretError, load_secrets
from shared.status import Status
from shared.tls import NodeTls, client_context, is_node_cert
from shared.types import Epoch, LogId, NodeId
from shared.wire.codec import decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.hello import Auth, Hello, HelloReply
from shared.wire.read import GetLogState
from shared.wire.recovery import Seal
from shared.wire.store import Stored
from tests.unit.net.transport_helpers import FINGERPRINT, SERVER_ID, Handler, store, wait_until

CONFIG = TransportConfig(connect_timeout_ms=2_000, reconnect_backoff_ms_max=50)
CLIENT = NodeId("n2")


def _tls(ca: CertFiles, cert: CertFiles) -> NodeTls:
    return NodeTls(TlsConfig(cert_file=str(cert.cert_file), key_file=str(cert.key_file),
                             ca_file=str(ca.cert_file)))


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, CertFiles]:
    ca = make_ca(tmp_path / "ca")
    other_ca = make_ca(tmp_path / "other-ca", "Some other CA")
    return {
        "ca": ca,
        "node": make_cert(ca, tmp_path / "ca", "node"),
        "node2": make_cert(ca, tmp_path / "ca", "node2"),
        "not_node": make_cert(ca, tmp_path / "ca", "user", node=False),
        "other_ca": other_ca,
        "intruder": make_cert(other_ca, tmp_path / "other-ca", "node"),
    }


async def _serve(security: NodeSecurity, handler: Handler) -> Server:
    return await start_server("127.0.0.1", 0, node_id=SERVER_ID, cluster_fingerprint=FINGERPRINT,
                              handler=handler, config=CONFIG, security=security)


def _pool(server: Server, security: NodeSecurity | None) -> PeerPool:
    return PeerPool(node_id=CLIENT, cluster_fingerprint=FINGERPRINT, config=CONFIG,
                    addresses={SERVER_ID: ("127.0.0.1", server.port)}.get, security=security)


@pytest.fixture
async def cleanup() -> AsyncIterator[list[Server | PeerPool]]:
    things: list[Server | PeerPool] = []
    yield things
    for thing in things:
        await thing.close()


async def _store_result(server: Server, security: NodeSecurity | None,
                        cleanup: list[Server | PeerPool]) -> object:
    pool = _pool(server, security)
    cleanup.append(pool)
    return await pool.call(SERVER_ID, store(1), timeout_ms=3_000)


async def test_mutual_tls_node_certificates_store(
        pki: dict[str, CertFiles], cleanup: list[Server | PeerPool]) -> None:
    handler = Handler()
    server = await _serve(NodeSecurity(tls=_tls(pki["ca"], pki["node"])), handler)
    cleanup.append(server)
    result = await _store_result(server, NodeSecurity(tls=_tls(pki["ca"], pki["node2"])),
                                 cleanup)
    assert isinstance(result, Stored) and result.status is Status.OK
    assert handler.store_lsns() == [1]
    assert not server.security.failures.counts


async def test_tls_connections_decrypt_into_the_shared_buffer(
        pki: dict[str, CertFiles], cleanup: list[Server | PeerPool],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # uvloop hands a TLS connection's bytes to get_buffer/buffer_updated only if its protocol
    # is not an asyncio.Protocol subclass; otherwise it allocates 256 KiB per TLS record.
    filled: list[int] = []
    original = TlsReads.buffer_updated

    def counting(self: TlsReads, nbytes: int) -> None:
        filled.append(nbytes)
        original(self, nbytes)

    monkeypatch.setattr(TlsReads, "buffer_updated", counting)
    handler = Handler()
    server = await _serve(NodeSecurity(tls=_tls(pki["ca"], pki["node"])), handler)
    cleanup.append(server)
    result = await _store_result(server, NodeSecurity(tls=_tls(pki["ca"], pki["node2"])),
                                 cleanup)
    assert isinstance(result, Stored) and result.status is Status.OK
    assert len(filled) >= 2  # the server's read of the STORE, the client's of the answer


async def test_wrong_ca_fails_the_handshake_and_is_counted(
        pki: dict[str, CertFiles], cleanup: list[Server | PeerPool]) -> None:
    handler = Handler()
    server = await _serve(NodeSecurity(tls=_tls(pki["ca"], pki["node"])), handler)
    cleanup.append(server)
    result = await _store_result(server, NodeSecurity(tls=_tls(pki["other_ca"], pki["intruder"])),
                                 cleanup)
    assert result is Status.CONNFAILED
    await wait_until(lambda: server.security.failures.counts["tls_handshake"] >= 1)
    assert handler.received == []


async def test_certificate_without_node_ou_cannot_store(
        pki: dict[str, CertFiles], cleanup: list[Server | PeerPool]) -> None:
    handler = Handler()
    server = await _serve(NodeSecurity(tls=_tls(pki["ca"], pki["node"])), handler)
    cleanup.append(server)
    result = await _store_result(server, NodeSecurity(tls=_tls(pki["ca"], pki["not_node"])),
                                 cleanup)
    assert result is Status.PROTONOSUPPORT
    assert server.security.failures.counts["not_node_cert"] == 1
    assert handler.received == []


async def test_node_refuses_a_server_without_node_certificate(
        pki: dict[str, CertFiles], cleanup: list[Server | PeerPool]) -> None:
    """Mutual: a node does not send copies to a peer that is not a node either."""
    handler = Handler()
    server = await _serve(NodeSecurity(tls=_tls(pki["ca"], pki["not_node"])), handler)
    cleanup.append(server)
    security = NodeSecurity(tls=_tls(pki["ca"], pki["node"]))
    result = await _store_result(server, security, cleanup)
    assert result is Status.PROTONOSUPPORT
    assert security.failures.counts["not_node_cert"] == 1
    assert handler.store_lsns() == []


async def test_cluster_secret_challenge(tmp_path: Path,
                                        cleanup: list[Server | PeerPool]) -> None:
    secret = make_secret(tmp_path / "secret")
    handler = Handler()
    server = await _serve(NodeSecurity(secret_file=str(secret)), handler)
    cleanup.append(server)
    result = await _store_result(server, NodeSecurity(secret_file=str(secret)), cleanup)
    assert isinstance(result, Stored) and result.status is Status.OK
    assert handler.store_lsns() == [1]


async def test_wrong_or_missing_secret_cannot_store_or_seal(
        tmp_path: Path, cleanup: list[Server | PeerPool]) -> None:
    handler = Handler()
    server = await _serve(NodeSecurity(secret_file=str(make_secret(tmp_path / "secret"))),
                          handler)
    cleanup.append(server)
    wrong = NodeSecurity(secret_file=str(make_secret(tmp_path / "wrong")))
    # The server's proof fails first: the impostor's pool refuses to talk to it.
    assert await _store_result(server, wrong, cleanup) is Status.PROTONOSUPPORT
    assert wrong.failures.counts["bad_server_proof"] == 1
    # Without a secret at all: refused at HELLO.
    assert await _store_result(server, None, cleanup) is Status.PROTONOSUPPORT
    assert server.security.failures.counts["no_proof"] == 1
    assert handler.received == []


async def test_bad_proof_is_refused_and_counted(tmp_path: Path,
                                                cleanup: list[Server | PeerPool]) -> None:
    """A peer that answers the challenge with a wrong proof (it skipped checking the server's)
    is closed before the SEAL it pipelined reaches the handler."""
    handler = Handler()
    server = await _serve(NodeSecurity(secret_file=str(make_secret(tmp_path / "secret"))),
                          handler)
    cleanup.append(server)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode(Hello(node_id=CLIENT, protocol_version=1,
                              cluster_fingerprint=FINGERPRINT, auth_nonce=b"n" * 32)))
    writer.write(encode(Auth(proof=b"p" * 32)))
    writer.write(encode(Seal(log_id=LogId(1), seal_epoch=Epoch(9), sealed_by=CLIENT,
                             from_epoch=Epoch(1)), 7))
    await writer.drain()
    replies = await _frames_until_closed(reader)
    writer.close()
    # The challenge, if it got out before the reset: nothing else.
    assert all(isinstance(r, HelloReply) and r.status is Status.OK for r in replies)
    assert server.security.failures.counts["bad_proof"] == 1
    assert handler.received == []


async def _frames_until_closed(reader: asyncio.StreamReader) -> list[object]:
    decoder = FrameDecoder()
    messages: list[object] = []
    async with asyncio.timeout(5):
        while data := await _read_or_reset(reader):
            for body in decoder.feed(data):
                decoded = decode(body)
                assert not isinstance(decoded, Status)
                messages.append(decoded[1])
    return messages


async def _read_or_reset(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read(65536)
    except ConnectionResetError:
        return b""


async def test_client_connection_cannot_send_node_messages(
        tmp_path: Path, cleanup: list[Server | PeerPool]) -> None:
    handler = Handler()
    server = await _serve(NodeSecurity(secret_file=str(make_secret(tmp_path / "secret"))),
                          handler)
    cleanup.append(server)
    pool = PeerPool(node_id=NodeId("client.abc"), cluster_fingerprint=FINGERPRINT,
                    config=CONFIG, addresses={SERVER_ID: ("127.0.0.1", server.port)}.get)
    cleanup.append(pool)
    answer = await pool.call(SERVER_ID, GetLogState(log_id=LogId(1)), timeout_ms=3_000)
    assert answer is Status.TIMEDOUT  # the handler got it (and does not answer it)
    assert await pool.call(SERVER_ID, store(1), timeout_ms=3_000) in (
        Status.PEER_CLOSED, Status.CONNFAILED)
    assert server.security.failures.counts["client_sent_node_message"] == 1
    assert [type(m) for _, m in handler.received] == [GetLogState]


async def test_reload_serves_the_new_certificate(
        pki: dict[str, CertFiles], tmp_path: Path, cleanup: list[Server | PeerPool]) -> None:
    live = CertFiles(tmp_path / "live.pem", tmp_path / "live-key.pem")
    shutil.copy(pki["node"].cert_file, live.cert_file)
    shutil.copy(pki["node"].key_file, live.key_file)
    tls = _tls(pki["ca"], live)
    server = await _serve(NodeSecurity(tls=tls), Handler())
    cleanup.append(server)

    async def served_cn() -> str:
        context = client_context(str(pki["ca"].cert_file))
        context.check_hostname = False
        _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=context)
        cert = writer.get_extra_info("peercert")
        writer.close()
        return str(dict(rdn[0] for rdn in cert["subject"])["commonName"])

    assert await served_cn() == "node"
    shutil.copy(pki["node2"].cert_file, live.cert_file)
    shutil.copy(pki["node2"].key_file, live.key_file)
    assert tls.reload()
    assert await served_cn() == "node2"
    # A broken file keeps the current certificate.
    live.key_file.write_text("garbage")
    assert not tls.reload()
    assert await served_cn() == "node2"


def test_is_node_cert() -> None:
    assert is_node_cert({"subject": ((("organizationalUnitName", "seqlog-node"),),)})
    assert not is_node_cert({"subject": ((("commonName", "seqlog-node"),),)})
    assert not is_node_cert(None)
    assert not is_node_cert({"subject": "junk"})


def test_secret_file_rules(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_bytes(b"short\n")
    with pytest.raises(SecretError):
        load_secrets(str(path))
    path.write_bytes(b"a" * 20 + b"\n\n" + b"b" * 20 + b"\n")
    assert load_secrets(str(path)) == (b"a" * 20, b"b" * 20)
    with pytest.raises(SecretError):
        load_secrets(str(tmp_path / "missing"))

