"""A node's TLS and node authentication from its ``tls`` settings (docs/SECURITY.md): builds the
``NodeSecurity`` the transport uses, and exposes its refusals and reloads to Prometheus.

A node that is told to use certificates or a cluster secret and cannot read them does not start
(``SecurityConfigError``): it must never fall back to an open port.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.config import TlsConfig
from shared.net.node_auth import FAILURE_REASONS, NodeSecurity, SecretError
from shared.tls import NodeTls, TlsError


class SecurityConfigError(Exception):
    """The ``tls`` settings name files that cannot be used."""


def node_security(config: TlsConfig) -> NodeSecurity:
    try:
        tls = NodeTls(config) if config.enabled else None
        return NodeSecurity(tls=tls, secret_file=config.cluster_secret_file)
    except (TlsError, SecretError) as exc:
        raise SecurityConfigError(str(exc)) from None


class NodeSecurityCollector(Collector):
    """``seqlog_node_auth_failures_total{reason}`` and the TLS reload counts, at scrape time."""

    def __init__(self, security: NodeSecurity) -> None:
        self.security = security

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        failures = CounterMetricFamily(
            "seqlog_node_auth_failures", "peers refused on the data port: TLS handshakes that "
            "failed, nodes that did not prove they belong to the cluster, clients that sent "
            "node-only messages (and, from our side, peers that did not prove they are nodes)",
            labels=["reason"])
        counts = self.security.failures.counts
        for reason in FAILURE_REASONS:
            failures.add_metric([reason], counts[reason])
        yield failures
        yield GaugeMetricFamily("seqlog_node_auth_required", "1 when node-only messages need a "
                                "proven peer (TLS or a cluster secret configured)",
                                value=int(self.security.required))
        tls = self.security.tls
        if tls is not None:
            yield CounterMetricFamily("seqlog_tls_reloads", "certificate reloads (SIGHUP)",
                                      value=tls.reloads_count)
            yield CounterMetricFamily("seqlog_tls_reload_failures", "certificate reloads "
                                      "refused (bad files; the previous ones stay)",
                                      value=tls.reload_failures_count)
