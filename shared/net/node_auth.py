"""Node authentication on the data port: who may send node-only messages (STORE, SEAL, RELEASE,
CLEAN, gossip, ...).

A peer whose HELLO names a node (not ``client.*``) must prove it belongs to the cluster, by one
of (docs/SECURITY.md):

* mutual TLS: its certificate verified against the cluster CA and marked as a node certificate
  (``shared.tls.is_node_cert``);
* a challenge-response over the cluster secret (``hmac``/``secrets`` from the standard
  library), when TLS is off or the peer has no node certificate::

      HELLO(auth_nonce=Nc)  ->
                            <-  HELLO_REPLY(OK, auth_nonce=Ns, auth_proof=HMAC(k, server|...))
      AUTH(proof=HMAC(k, client|...))  ->  (pipelined: requests may follow at once)

  Both proofs cover both nonces, both node ids and the cluster fingerprint, so neither can be
  replayed on another connection; the client checks the server's proof too, so a node never
  sends copies to an impostor. The server reads nothing but AUTH until the proof checked.

With neither a CA nor a secret configured the node is open, as before (``seqlog local up``).
Every refusal is logged and counted by reason (``AuthFailures``, exported to /metrics).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import Counter
from dataclasses import dataclass, field

from shared.tls import NodeTls

log = logging.getLogger(__name__)

NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
SECRET_BYTES_MIN = 16
SECRETS_MAX = 8
"""Secrets in one file: the current one and a few being rotated in or out."""
SECRET_FILE_BYTES_MAX = 64 * 1024
_DOMAIN = b"seqlog node auth v1"

FAILURE_REASONS = ("tls_handshake", "no_proof", "bad_proof", "bad_server_proof",
                   "not_node_cert", "client_sent_node_message")
"""Labels of ``seqlog_node_auth_failures``."""


class SecretError(Exception):
    """The cluster secret file is missing, unreadable or malformed."""


def load_secrets(path: str) -> tuple[bytes, ...]:
    """The secrets in ``path``: one per non-empty line, surrounding blanks stripped."""
    try:
        with open(path, "rb") as f:
            raw = f.read(SECRET_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise SecretError(f"cannot read cluster secret file {path}: {exc.strerror or exc}"
                          ) from None
    if len(raw) > SECRET_FILE_BYTES_MAX:
        raise SecretError(f"cluster secret file {path} is over {SECRET_FILE_BYTES_MAX} bytes")
    lines = tuple(line.strip() for line in raw.splitlines() if line.strip())
    if not lines or len(lines) > SECRETS_MAX:
        raise SecretError(f"cluster secret file {path} must hold 1 to {SECRETS_MAX} secrets, "
                          "one per line")
    if any(len(line) < SECRET_BYTES_MIN for line in lines):
        raise SecretError(f"cluster secret file {path}: every secret needs at least "
                          f"{SECRET_BYTES_MIN} bytes")
    return lines


def new_secret() -> bytes:
    """A fresh cluster secret, printable so that it fits a line of the file."""
    return secrets.token_urlsafe(32).encode()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Exchange:
    """What both proofs of one connection cover."""

    fingerprint: str
    client_id: str
    server_id: str
    client_nonce: bytes
    server_nonce: bytes


def proof(secret: bytes, exchange: Exchange, *, server_side: bool) -> bytes:
    """HMAC-SHA256 binding one side's role to this exchange (see the module doc)."""
    message = b"\x00".join((
        _DOMAIN, b"server" if server_side else b"client", exchange.fingerprint.encode(),
        exchange.client_id.encode(), exchange.server_id.encode(), exchange.client_nonce,
        exchange.server_nonce))
    return hmac.new(secret, message, hashlib.sha256).digest()


@dataclass(slots=True)
class AuthFailures:
    """Refused authentication attempts by reason (``FAILURE_REASONS``)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, reason: str, peer: object, detail: str) -> None:
        assert reason in FAILURE_REASONS, reason
        self.counts[reason] += 1
        log.warning("node authentication failed (%s) for %s: %s", reason, peer, detail)


class NodeSecurity:
    """A node's means to prove itself and check its peers: TLS contexts and/or the cluster
    secrets. ``NodeSecurity.open()`` has neither (anyone may send anything)."""

    def __init__(self, *, tls: NodeTls | None = None, secret_file: str = "") -> None:
        self.tls = tls
        self.secret_file = secret_file
        self.secrets: tuple[bytes, ...] = load_secrets(secret_file) if secret_file else ()
        self.failures = AuthFailures()

    @classmethod
    def open(cls) -> NodeSecurity:
        return cls()

    @property
    def required(self) -> bool:
        """Whether node-only messages need a proven peer."""
        return self.tls is not None or bool(self.secrets)

    def reload(self) -> None:
        """Re-read the certificates and the secrets (SIGHUP); on a bad file keep the old."""
        if self.tls is not None:
            self.tls.reload()
        if self.secret_file:
            try:
                self.secrets = load_secrets(self.secret_file)
            except SecretError as exc:
                log.error("cluster secret reload failed, keeping the current one: %s", exc)
            else:
                log.info("cluster secrets reloaded from %s", self.secret_file)

    def prove(self, exchange: Exchange, *, server_side: bool) -> bytes:
        """Our proof with the first (current) secret; b"" without one."""
        if not self.secrets:
            return b""
        return proof(self.secrets[0], exchange, server_side=server_side)

    def check(self, got: bytes, exchange: Exchange, *, server_side: bool) -> bool:
        """Whether ``got`` is the proof of the ``server_side`` (or client) end of
        ``exchange``, made with any of our secrets."""
        if len(got) != PROOF_BYTES:
            return False
        ok = False
        for secret in self.secrets:
            # Every secret is tried, so the time taken says nothing about which matched.
            ok |= hmac.compare_digest(proof(secret, exchange, server_side=server_side), got)
        return ok
