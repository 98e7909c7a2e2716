"""TLS and node authentication on real node processes (docs/SECURITY.md; issue 18).

A ``local up --secure`` cluster (CA, node certificate, cluster secret, TLS on every listener):
clients append and read over https and the binary protocol with the CA; a client with the wrong
CA fails the handshake; an impostor with another CA, with a certificate that is not a node
certificate, or without TLS, cannot STORE, SEAL, RELEASE or gossip (each attempt is logged and
counted in /metrics); a client connection that sends a node-only message is closed and counted;
a client cannot read an unreleased copy by forging the release pointer; SIGHUP makes a node
serve its new certificate. A second cluster with only a cluster secret (no TLS) shows the
challenge-response: without the secret, or with a wrong proof, nothing is stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from seqlog_cluster_support import READY_TIMEOUT_MS

from seqlog import Client
from services import local_cluster as lc
from services.certs import CertFiles, make_ca, make_cert, make_secret
from shared.config import TlsConfig, TransportConfig
from shared.net.node_auth import NodeSecurity
from shared.net.pool import PeerPool
from shared.status import Status
from shared.tls import NodeTls, client_context
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.codec import Message, decode, encode
from shared.wire.framing import FrameDecoder
from shared.wire.gossip import Gossip
from shared.wire.hello import Auth, Hello
from shared.wire.read import Read, ReadReply
from shared.wire.recovery import Seal
from shared.wire.release import Release
from shared.wire.store import Store, Stored, payloads_checksum

pytestmark = pytest.mark.integration

IMPOSTOR = NodeId("st1")
"""Impostors claim to be a member: the cluster must not take the name for proof."""
CALL_TIMEOUT_MS = 3_000
POLL_TIMEOUT_S = 10.0
TRANSPORT = TransportConfig(connect_timeout_ms=2_000, reconnect_backoff_ms_max=20)


def _start(root: Path, *, secure: bool = False, tls: TlsConfig | None = None) -> lc.ClusterState:
    spec = lc.LocalClusterSpec(dir=root, storage_nodes=3, sequencers=1, replication=3,
                               base_port=lc.free_base_port(4), fsync="never", secure=secure,
                               tls=tls)
    try:
        return lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
    except lc.LocalClusterError as exc:
        pytest.fail(f"local cluster did not start:\n{exc}", pytrace=False)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lc.ClusterState]:
    root = tmp_path_factory.mktemp("secure-cluster")
    state = _start(root, secure=True)
    try:
        yield state
    finally:
        lc.down(root)


def _root(state: lc.ClusterState) -> Path:
    return Path(state.nodes[0].data_dir).parent


def _storage(state: lc.ClusterState) -> lc.NodeEntry:
    return next(n for n in state.nodes if "storage" in n.roles)


def _data_address(node: lc.NodeEntry) -> tuple[str, int]:
    host, _, port = node.http.rpartition(":")
    return host, int(port) + 1  # local clusters put the data port right after the HTTP port


def _fingerprint(node: lc.NodeEntry, context: ssl.SSLContext | None) -> str:
    scheme = "http" if context is None else "https"
    with urllib.request.urlopen(f"{scheme}://{node.http}/v1/cluster", timeout=5,
                                context=context) as answer:
        return str(json.loads(answer.read())["cluster_fingerprint"])


def _auth_failures(node: lc.NodeEntry, context: ssl.SSLContext | None) -> dict[str, float]:
    scheme = "http" if context is None else "https"
    with urllib.request.urlopen(f"{scheme}://{node.http}/metrics", timeout=5,
                                context=context) as answer:
        text = answer.read().decode()
    prefix = 'seqlog_node_auth_failures_total{reason="'
    return {line[len(prefix):].split('"')[0]: float(line.split()[-1])
            for line in text.splitlines() if line.startswith(prefix)}


def _poll(check: object, what: str) -> None:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {POLL_TIMEOUT_S} s")


def _store(log_id: int, lsn: Lsn, sender: NodeId, copyset: tuple[NodeId, ...]) -> Store:
    payloads = (b"not released",)
    return Store(log_id=LogId(log_id), lsn=lsn, wave=1, sequencer_node=sender, copyset=copyset,
                 timestamp_ms=int(time.time() * 1000), last_known_good=Esn(0),
                 release_lsn=Lsn(0), timeout_ms=5_000, key=None, payloads=payloads,
                 checksum=payloads_checksum(payloads))


def _node_only(node: NodeId) -> list[Message]:
    lsn = compose_lsn(Epoch(40), Esn(1))
    return [_store(3_000_001, lsn, IMPOSTOR, (node,)),
            Seal(log_id=LogId(3_000_001), seal_epoch=Epoch(41), sealed_by=IMPOSTOR,
                 from_epoch=Epoch(1)),
            Release(log_id=LogId(3_000_001), release_lsn=lsn),
            Gossip(sender=IMPOSTOR, instance_id=1, sent_wall_ms=int(time.time() * 1000),
                   node_ids=(IMPOSTOR,), heartbeats=(0,), instance_ids=(1,), failover=(False,))]


async def _attempt(node: lc.NodeEntry, fingerprint: str, security: NodeSecurity,
                   ) -> list[Message | Status]:
    """Send each node-only message as ``IMPOSTOR`` with ``security``: what came back."""
    pool = PeerPool(node_id=IMPOSTOR, cluster_fingerprint=fingerprint, config=TRANSPORT,
                    addresses={node.node_id: _data_address(node)}.get, security=security)
    try:
        return [await pool.call(node.node_id, message, CALL_TIMEOUT_MS)
                for message in _node_only(node.node_id)]
    finally:
        await pool.close()


def _tls(ca: Path, cert: CertFiles) -> NodeTls:
    return NodeTls(TlsConfig(cert_file=str(cert.cert_file), key_file=str(cert.key_file),
                             ca_file=str(ca)))


def _secure_files(state: lc.ClusterState) -> TlsConfig:
    return lc.secure_tls(_root(state))


# -- the secure cluster -----------------------------------------------------------------------


async def test_clients_append_and_read_over_tls_with_the_ca(secure: lc.ClusterState) -> None:
    async with Client(secure.sequencer_urls, ca=secure.ca_file) as client:
        results = [await client.append(701, b"r%d" % i) for i in range(5)]
        assert client.protocol == "binary"  # over TLS to the data port, not HTTP
        read = await client.read(701, results[0].lsn, wait_ms=2_000)
        assert [r.payload for r in read.records] == [b"r%d" % i for i in range(5)]
        async with await client.reader(701, results[0].lsn, until_lsn=results[-1].lsn) as reader:
            direct = [e async for e in reader]  # straight from the storage nodes over TLS
        assert [getattr(e, "payload", None) for e in direct if hasattr(e, "payload")] == [
            b"r%d" % i for i in range(5)]


def test_a_client_with_the_wrong_ca_fails_the_handshake(
        secure: lc.ClusterState, tmp_path: Path) -> None:
    other = make_ca(tmp_path / "other")
    wrong = client_context(str(other.cert_file))
    node = _storage(secure)
    with pytest.raises(urllib.error.URLError) as caught:
        urllib.request.urlopen(f"https://{node.http}/readyz", timeout=5, context=wrong)
    assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)
    host, port = _data_address(node)
    with socket.create_connection((host, port), timeout=5) as sock, pytest.raises(
            ssl.SSLCertVerificationError):
        wrong.wrap_socket(sock, server_hostname=host)
    # Plain text to a TLS port gets nothing either.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{node.http}/readyz", timeout=5)


async def test_impostors_cannot_store_seal_release_or_gossip(
        secure: lc.ClusterState, tmp_path: Path) -> None:
    files = _secure_files(secure)
    context = client_context(secure.ca_file)
    node = _storage(secure)
    fingerprint = _fingerprint(node, context)
    before = _auth_failures(node, context)
    other = make_ca(tmp_path / "other")
    cases = {
        # Its own CA and a "node" certificate from it: the handshake fails.
        "tls_handshake": NodeSecurity(tls=_tls(other.cert_file,
                                               make_cert(other, tmp_path / "other", "node"))),
        # The cluster CA, but a certificate that is not a node certificate, and no secret.
        "not_node_cert": NodeSecurity(tls=_tls(Path(files.ca_file), make_cert(
            CertFiles(Path(files.ca_file), Path(files.ca_file).with_name("ca-key.pem")),
            tmp_path / "user", "user", node=False))),
    }
    for reason, security in cases.items():
        answers = await _attempt(node, fingerprint, security)
        assert all(a in (Status.CONNFAILED, Status.PROTONOSUPPORT) for a in answers), (
            reason, answers)
        _poll(lambda r=reason: _auth_failures(node, context)[r] > before.get(r, 0),
              f"{reason} counted in /metrics")
    # Without TLS at all: the node does not speak plain text.
    answers = await _attempt(node, fingerprint, NodeSecurity.open())
    assert all(a in (Status.CONNFAILED, Status.PROTONOSUPPORT, Status.PEER_CLOSED)
               for a in answers), answers
    log_text = (Path(node.data_dir) / "node.log").read_text()
    assert "node authentication failed (tls_handshake)" in log_text
    assert "node authentication failed (not_node_cert)" in log_text
    # Nothing was stored: a legitimate node's read of the log finds nothing.
    assert await _read_as(node, secure, 3_000_001, compose_lsn(Epoch(40), Esn(1))) == []


async def _read_as(node: lc.NodeEntry, state: lc.ClusterState, log_id: int, release: Lsn,
                   *, client: bool = True) -> list[bytes]:
    """Payloads a READ of ``log_id`` from LSN 1 gets, carrying ``release`` as its pointer."""
    context = client_context(state.ca_file)
    fingerprint = _fingerprint(node, context)
    if client:
        context.check_hostname = False
        pool = PeerPool(node_id=NodeId("client.tls-test"), cluster_fingerprint=fingerprint,
                        config=TRANSPORT, addresses={node.node_id: _data_address(node)}.get,
                        client_ssl=context)
    else:
        pool = PeerPool(node_id=NodeId("seq1"), cluster_fingerprint=fingerprint,
                        config=TRANSPORT, addresses={node.node_id: _data_address(node)}.get,
                        security=NodeSecurity(tls=NodeTls(_secure_files(state))))
    try:
        answer = await pool.call(node.node_id, Read(
            log_id=LogId(log_id), from_lsn=Lsn(1), until_lsn=release, release_lsn=release,
            records_max=100, bytes_max=1 << 20), CALL_TIMEOUT_MS)
    finally:
        await pool.close()
    assert isinstance(answer, ReadReply), answer
    return [p for r in answer.records for p in r[3:4]]


async def test_a_client_cannot_read_past_the_release_pointer_by_forging_one(
        secure: lc.ClusterState) -> None:
    """A copy that no sequencer released stays unreadable whatever pointer a READ carries;
    once the node learns the release it is served (so the test would see it otherwise)."""
    node = _storage(secure)
    context = client_context(secure.ca_file)
    fingerprint = _fingerprint(node, context)
    log_id, lsn = 3_000_002, compose_lsn(Epoch(30), Esn(1))
    pool = PeerPool(node_id=NodeId("seq1"), cluster_fingerprint=fingerprint, config=TRANSPORT,
                    addresses={node.node_id: _data_address(node)}.get,
                    security=NodeSecurity(tls=NodeTls(_secure_files(secure))))
    try:
        stored = await pool.call(node.node_id, _store(log_id, lsn, NodeId("seq1"),
                                                      (node.node_id,)), CALL_TIMEOUT_MS)
        assert isinstance(stored, Stored) and stored.status is Status.OK, stored
        assert await _read_as(node, secure, log_id, lsn) == []  # forged pointer: nothing
        assert pool.send(node.node_id, Release(log_id=LogId(log_id), release_lsn=lsn))
        await asyncio.sleep(0)
        deadline = time.monotonic() + POLL_TIMEOUT_S
        while await _read_as(node, secure, log_id, lsn) != [b"not released"]:
            assert time.monotonic() < deadline, "the released copy was never served"
            await asyncio.sleep(0.05)
    finally:
        await pool.close()


async def test_a_client_connection_cannot_send_node_only_messages(
        secure: lc.ClusterState) -> None:
    node = _storage(secure)
    context = client_context(secure.ca_file)
    before = _auth_failures(node, context).get("client_sent_node_message", 0)
    fingerprint = _fingerprint(node, context)
    host, port = _data_address(node)
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    writer.write(encode(Hello(node_id=NodeId("client.intruder"), protocol_version=2,
                              cluster_fingerprint=fingerprint)))
    writer.write(encode(_store(3_000_003, compose_lsn(Epoch(5), Esn(1)), NodeId("seq1"),
                               (node.node_id,)), 1))
    await writer.drain()
    frames = await _frames_until_closed(reader)
    writer.close()
    # Closed at once (the HELLO_REPLY may be cut off by the reset): no STORED.
    assert not any(isinstance(m, Stored) for m in frames), frames
    _poll(lambda: _auth_failures(node, context)["client_sent_node_message"] > before,
          "client_sent_node_message counted")


async def _frames_until_closed(reader: asyncio.StreamReader) -> list[Message]:
    decoder = FrameDecoder()
    messages: list[Message] = []
    async with asyncio.timeout(POLL_TIMEOUT_S):
        while True:
            try:
                data = await reader.read(65536)
            except (ConnectionResetError, ssl.SSLError):
                data = b""
            if not data:
                return messages
            for body in decoder.feed(data):
                decoded = decode(body)
                assert not isinstance(decoded, Status)
                messages.append(decoded[1])


async def test_sighup_makes_a_node_serve_its_new_certificate(
        secure: lc.ClusterState, tmp_path: Path) -> None:
    files = _secure_files(secure)
    node = _storage(secure)
    ca = CertFiles(Path(files.ca_file), Path(files.ca_file).with_name("ca-key.pem"))
    rotated = make_cert(ca, tmp_path, "node-rotated")
    context = client_context(secure.ca_file)

    async def served_cn(port_of: str) -> str:
        host, port = (node.http.rpartition(":")[0], int(node.http.rpartition(":")[2]))
        if port_of == "data":
            port += 1
        _, writer = await asyncio.open_connection(host, port, ssl=context)
        subject = writer.get_extra_info("peercert")["subject"]
        writer.close()
        return str(dict(rdn[0] for rdn in subject)["commonName"])

    assert await served_cn("http") == "node" and await served_cn("data") == "node"
    shutil.copy(rotated.key_file, files.key_file + ".new")
    shutil.copy(rotated.cert_file, files.cert_file + ".new")
    os.replace(files.key_file + ".new", files.key_file)
    os.replace(files.cert_file + ".new", files.cert_file)
    os.kill(node.pid, signal.SIGHUP)
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while await served_cn("data") != "node-rotated":
        assert time.monotonic() < deadline, "the data port kept the old certificate"
        await asyncio.sleep(0.05)
    assert await served_cn("http") == "node-rotated"
    # The cluster keeps working across the rotation (the other nodes still show "node").
    async with Client(secure.sequencer_urls, ca=secure.ca_file) as client:
        first = await client.append(702, b"after rotation")
        assert [r.payload for r in (await client.read(702, first.lsn, wait_ms=2_000)).records
                ] == [b"after rotation"]


# -- a cluster secret without TLS -------------------------------------------------------------


async def test_cluster_secret_without_tls(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    secret = make_secret(tmp_path / "cluster-secret")
    state = _start(root, tls=TlsConfig(cluster_secret_file=str(secret)))
    try:
        async with Client(state.sequencer_urls) as client:
            first = await client.append(801, b"authenticated nodes")
            assert [r.payload for r in (await client.read(801, first.lsn, wait_ms=2_000)
                                        ).records] == [b"authenticated nodes"]
        node = _storage(state)
        fingerprint = _fingerprint(node, None)
        # No secret: refused at HELLO; a wrong secret: the node's proof does not check out,
        # so the impostor's pool gives up (and sends nothing).
        for security in (NodeSecurity.open(),
                         NodeSecurity(secret_file=str(make_secret(tmp_path / "wrong")))):
            answers = await _attempt(node, fingerprint, security)
            assert all(a is Status.PROTONOSUPPORT for a in answers), answers
        _poll(lambda: _auth_failures(node, None)["no_proof"] >= 1, "no_proof counted")
        # A peer that answers the challenge with a made-up proof, then pipelines a STORE.
        host, port = _data_address(node)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(encode(Hello(node_id=IMPOSTOR, protocol_version=1,
                                  cluster_fingerprint=fingerprint, auth_nonce=b"n" * 32)))
        writer.write(encode(Auth(proof=b"p" * 32)))
        writer.write(encode(_node_only(node.node_id)[0], 5))
        await writer.drain()
        frames = await _frames_until_closed(reader)
        writer.close()
        assert not any(isinstance(f, Stored) for f in frames)
        _poll(lambda: _auth_failures(node, None)["bad_proof"] >= 1, "bad_proof counted")
        assert "node authentication failed (bad_proof)" in (
            Path(node.data_dir) / "node.log").read_text()
    finally:
        lc.down(root)


def test_the_cli_reaches_a_secure_cluster_with_its_ca(secure: lc.ClusterState) -> None:
    """``--dir`` finds the cluster's CA; ``--url https://...`` needs ``--ca`` or SEQLOG_CA."""
    cli = [sys.executable, "-m", "services.cli"]
    env = {k: v for k, v in os.environ.items() if k != "SEQLOG_CA"}
    by_dir = subprocess.run([*cli, "demo", "--dir", str(_root(secure)), "--logs", "1"],
                            capture_output=True, text=True, timeout=120, env=env, check=False)
    assert by_dir.returncode == 0, by_dir.stdout + by_dir.stderr
    url = secure.sequencer_urls[0]
    assert url.startswith("https://")
    with_ca = subprocess.run([*cli, "cluster", "--url", url], capture_output=True, text=True,
                             timeout=60, env={**env, "SEQLOG_CA": secure.ca_file},
                             check=False)
    assert with_ca.returncode == 0, with_ca.stdout + with_ca.stderr
    without = subprocess.run([*cli, "cluster", "--url", url], capture_output=True, text=True,
                             timeout=60, env=env, check=False)
    assert without.returncode != 0  # the system's CAs do not know the local CA
