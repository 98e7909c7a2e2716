"""TLS contexts of a node and of clients, built with Python's ``ssl`` from PEM files, and
reloadable: ``NodeTls.reload()`` re-reads the files (SIGHUP), and every connection accepted or
opened afterwards uses the new contexts while open ones keep theirs (docs/SECURITY.md).

The data port asks for the current context at every accept (``shared.net.tls_listener``). The
HTTP API's listener is aiohttp's, created once with one context, so it gets a *front* context
that never changes (``http_listener``): its SNI callback, which OpenSSL runs at every
handshake, switches the connection to the current context.

Three contexts per node:

* the data port's server context: the node's certificate, and the cluster CA to verify the
  certificate a peer may show (optional: binary clients show none; a peer without a node
  certificate is a client, or must prove itself with the cluster secret);
* the HTTP API's server context: the node's certificate, no client certificates;
* the node-to-node client context: the node's certificate (mutual TLS), the cluster CA to verify
  the peer, and no host name check: a node is recognised by its certificate being a *node
  certificate* (subject OU ``seqlog-node``, ``is_node_cert``) signed by the cluster CA, not by a
  DNS name (pods of a StatefulSet share one certificate in Kubernetes).

Clients (``seqlog``, the CLI) verify nodes with ``client_context(ca_file)``: the CA and the
host name, as any HTTPS client does.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shared.config import TlsConfig

log = logging.getLogger(__name__)

NODE_CERT_OU = "seqlog-node"
"""The subject organizational unit that marks a certificate, signed by the cluster CA, as a
cluster node's: only its holder may send node-only messages over mutual TLS."""


class TlsError(Exception):
    """A certificate, key or CA file could not be loaded; the message names the file."""


def _load_chain(context: ssl.SSLContext, config: TlsConfig) -> None:
    try:
        context.load_cert_chain(config.cert_file, config.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load certificate {config.cert_file} with key "
                       f"{config.key_file}: {exc}") from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load CA file {ca_file}: {exc}") from None


def _server_context(config: TlsConfig, *, verify_peers: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config)
    if verify_peers:
        _load_ca(context, config.ca_file)
        # Optional: binary clients show no certificate; a presented one must verify.
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def node_client_context(config: TlsConfig) -> ssl.SSLContext:
    """The context a node connects to its peers with (mutual TLS, see the module doc)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    _load_ca(context, config.ca_file)
    _load_chain(context, config)
    return context


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """What a client verifies nodes with: ``ca_file`` (else the system's CAs) and host names."""
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def is_node_cert(peercert: object) -> bool:
    """Whether ``peercert`` (``SSLObject.getpeercert()``: present only once verified against the
    CA) is a node certificate: its subject has the OU ``NODE_CERT_OU``."""
    if not isinstance(peercert, Mapping) or not peercert:
        return False
    subject = peercert.get("subject", ())
    try:
        return any(name == "organizationalUnitName" and value == NODE_CERT_OU
                   for rdn in subject for name, value in rdn)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class _Contexts:
    data_server: ssl.SSLContext
    http_server: ssl.SSLContext
    node_client: ssl.SSLContext


def _front(context: ssl.SSLContext, current: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """``context`` made the fixed context of a listener (see the module doc)."""

    def switch(sslobj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
               _: ssl.SSLContext) -> None:
        latest = current()
        if sslobj.context is not latest:
            sslobj.context = latest

    context.sni_callback = switch
    return context


def _build(config: TlsConfig) -> _Contexts:
    return _Contexts(data_server=_server_context(config, verify_peers=True),
                     http_server=_server_context(config, verify_peers=False),
                     node_client=node_client_context(config))


class NodeTls:
    """A node's current TLS contexts (see the module doc). Built at start-up, where a bad file
    is fatal (``TlsError``); ``reload()`` swaps in new ones, or keeps the old ones and says
    why."""

    def __init__(self, config: TlsConfig) -> None:
        assert config.enabled
        self.config = config
        self._current = _build(config)
        self.reloads_count = 0
        self.reload_failures_count = 0
        self.http_listener = _front(_build(config).http_server, lambda: self.http_server)
        """The HTTP API's fixed context (aiohttp's ``TCPSite(ssl_context=...)``)."""

    @property
    def data_server(self) -> ssl.SSLContext:
        return self._current.data_server

    @property
    def http_server(self) -> ssl.SSLContext:
        return self._current.http_server

    @property
    def node_client(self) -> ssl.SSLContext:
        return self._current.node_client

    def reload(self) -> bool:
        """Re-read the files; True if the new contexts are in use."""
        try:
            contexts = _build(self.config)
        except TlsError as exc:
            self.reload_failures_count += 1
            log.error("TLS reload failed, keeping the current certificates: %s", exc)
            return False
        self._current = contexts
        self.reloads_count += 1
        log.info("TLS certificates reloaded from %s", self.config.cert_file)
        return True
