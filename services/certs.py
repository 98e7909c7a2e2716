"""Local certificates for ``seqlog local up --secure`` and for tests, made with the
``cryptography`` library: a CA, node certificates (subject OU ``seqlog-node``, see
``shared.tls``) valid for loopback, and a cluster secret file.

Not a PKI: a production cluster gets its certificates from its own CA (cert-manager, Vault, ...)
with the same subject OU (docs/SECURITY.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.net.node_auth import new_secret
from shared.tls import NODE_CERT_OU

VALIDITY_DAYS = 825
"""Long enough for a local cluster; browsers refuse longer server certificates."""
LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class CertFiles:
    cert_file: Path
    key_file: Path


@dataclass(frozen=True, slots=True)
class SecureFiles:
    """What ``make_secure_dir`` wrote."""

    ca_file: Path
    ca_key_file: Path
    node: CertFiles
    cluster_secret_file: Path


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner only (keys, secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(directory: Path, common_name: str = "Seqlog local CA") -> CertFiles:
    """A self-signed CA in ``directory`` (ca.pem, ca-key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(directory / "ca.pem", directory / "ca-key.pem")
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(files.key_file, _key_pem(key))
    return files


def make_cert(ca: CertFiles, directory: Path, name: str, *, node: bool = True,
              dns_names: tuple[str, ...] = LOOPBACK_NAMES,
              ips: tuple[str, ...] = LOOPBACK_IPS, valid_days: int = VALIDITY_DAYS) -> CertFiles:
    """A certificate signed by ``ca`` for ``name`` (``<name>.pem``, ``<name>-key.pem``): a node
    certificate (server and client use, OU ``seqlog-node``) unless ``node`` is False."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key_file.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if node:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, NODE_CERT_OU))
    now = _now()
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (x509.CertificateBuilder().subject_name(x509.Name(attributes))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(directory / f"{name}.pem", directory / f"{name}-key.pem")
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(files.key_file, _key_pem(key))
    return files


def make_secret(path: Path) -> Path:
    _write_private(path, new_secret() + b"\n")
    return path


def make_secure_dir(directory: Path) -> SecureFiles:
    """Everything a local secure cluster needs, under ``directory``: a CA, one node
    certificate shared by the nodes (they all run on loopback) and a cluster secret."""
    ca = make_ca(directory)
    node = make_cert(ca, directory, "node")
    secret = make_secret(directory / "cluster-secret")
    return SecureFiles(ca_file=ca.cert_file, ca_key_file=ca.key_file, node=node,
                       cluster_secret_file=secret)
