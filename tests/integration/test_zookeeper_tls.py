"""TLS to ZooKeeper (``tls.zookeeper``; docs/SECURITY.md): a real local ZooKeeper serving a
secure client port (its Netty connection factory, PEM key store and trust store, client
certificates required) takes the epoch store's activations over TLS with the node's certificate,
and refuses a client without TLS or with a certificate from another CA."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from epoch_store import open_epoch_store
from epoch_store import zk_server as zks
from services.certs import CertFiles, make_ca, make_cert
from shared.config import TlsConfig
from shared.status import Status
from shared.types import LogId, NodeId
from tests.zk_support import READY_TIMEOUT_MS

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_zookeeper(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A standalone ZooKeeper with a TLS port; yields (secure port, the directory of its CA)."""
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    server = make_cert(ca, pki, "zookeeper")
    bundle = pki / "zookeeper-bundle.pem"
    bundle.write_bytes(server.key_file.read_bytes() + server.cert_file.read_bytes())
    plain_port, secure_port = zks.free_ports(2)
    directory = tmp_path / "zk"
    zks.write_config(directory, plain_port, tick_ms=200)
    zks.enable_tls(directory, secure_port, key_and_cert_pem=bundle, ca_pem=ca.cert_file)
    handle = zks.launch(directory, plain_port, tls=True)
    try:
        try:
            zks.wait_serving(handle, timeout_ms=READY_TIMEOUT_MS)
        except zks.ZooKeeperServerError as exc:
            pytest.fail(f"ZooKeeper with TLS did not start:\n{exc}", pytrace=False)
        yield secure_port, pki
    finally:
        zks.stop(handle, kill=True)


def _tls(pki: Path, cert_ca: CertFiles, name: str) -> TlsConfig:
    """The node's ``tls``: ZooKeeper's CA to trust, a client certificate signed by
    ``cert_ca``."""
    cert = make_cert(cert_ca, cert_ca.cert_file.parent, name)
    return TlsConfig(cert_file=str(cert.cert_file), key_file=str(cert.key_file),
                     ca_file=str(pki / "ca.pem"), zookeeper=True)


async def _activate(port: int, tls: TlsConfig | None) -> Status:
    store = open_epoch_store(f"zk://127.0.0.1:{port}/seqlog?op_timeout_ms=3000", zk_tls=tls)
    try:
        status, _, _ = await store.activate(LogId(7), writer=NodeId("seq1"), provision=None)
        return status
    finally:
        await store.close()


async def test_the_epoch_store_talks_tls_to_zookeeper(tls_zookeeper: tuple[int, Path],
                                                      tmp_path: Path) -> None:
    port, pki = tls_zookeeper
    # With the node's certificate: ZooKeeper answers (NOTFOUND: the log was never provisioned).
    cluster_ca = CertFiles(pki / "ca.pem", pki / "ca-key.pem")
    assert await _activate(port, _tls(pki, cluster_ca, "node")) is Status.NOTFOUND
    # Without TLS, or with a certificate of another CA: no answer at all.
    assert await _activate(port, None) is Status.CONNFAILED
    other_ca = make_ca(tmp_path / "other-ca")
    assert await _activate(port, _tls(pki, other_ca, "intruder")) is Status.CONNFAILED
