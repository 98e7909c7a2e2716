"""Where the client sends each request: the log's sequencer when known, else any live node.

Pure bookkeeping, no I/O: the client feeds it the cluster view (GET /v1/cluster), the
``X-Seqlog-Sequencer`` header of answers, redirects and connection failures, and asks it for
the URLs to try, best first. A log's sequencer is the node an answer last named, else the one
that weighted rendezvous hashing (``shared.routing``, the nodes' own rule) picks over the
ALIVE sequencer nodes of the cluster view. Routes are a bounded map; the oldest route is
dropped when it is full.
"""

from __future__ import annotations

from collections.abc import Iterator

from seqlog.results import ClusterInfo
from shared.routing import routable_sequencers, sequencer_for
from shared.types import LogId, NodeId


def normalize_url(url: str, scheme: str = "http") -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port`` (``scheme``: https for
    a cluster with TLS)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"{scheme}://{url}"
    return url


class Router:
    def __init__(self, seed_urls: list[str], *, routes_max: int, scheme: str = "http") -> None:
        assert seed_urls, "at least one URL is required"
        assert routes_max >= 1
        self.scheme = scheme
        """How node addresses (``host:port`` in the cluster view) become URLs."""
        self._urls: list[str] = list(dict.fromkeys(normalize_url(u, scheme) for u in seed_urls))
        """Every URL that can serve appends and reads, healthiest first."""
        self._node_urls: dict[NodeId, str] = {}
        self._node_data: dict[NodeId, str] = {}
        """Each sequencer node's data port (``host:port``) for the binary protocol."""
        self._routes: dict[LogId, NodeId] = {}
        self._routes_max = routes_max
        self._routable: list[tuple[NodeId, float]] = []
        """ALIVE sequencer nodes with their weights, as the hash sees them."""
        self.cluster_stale = False
        """Set when the cluster view may be out of date: an answer named a node it does not
        know, a redirect, a connection failure or a timeout."""

    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    def learn_cluster(self, info: ClusterInfo) -> None:
        """Adopt the cluster's sequencer-role nodes; dead ones go last but are kept as a last
        resort, since a node's view of its peers may lag."""
        live: list[str] = []
        dead: list[str] = []
        node_urls: dict[NodeId, str] = {}
        node_data: dict[NodeId, str] = {}
        weights: list[tuple[NodeId, float]] = []
        states: dict[NodeId, str] = {}
        for node in info.nodes:
            if "sequencer" not in node.roles:
                continue
            url = normalize_url(node.http, self.scheme)
            node_urls[node.node_id] = url
            if node.data:
                node_data[node.node_id] = node.data
            weights.append((node.node_id, node.sequencer_weight))
            states[node.node_id] = node.state
            (dead if node.state == "DEAD" else live).append(url)
        if not node_urls:
            return
        self._node_urls = node_urls
        self._node_data = node_data
        self._routable = routable_sequencers(weights, states)
        # Seed URLs stay as a fallback: they may be a load balancer rather than a node.
        self._urls = list(dict.fromkeys([*live, *self._urls, *dead]))
        self.cluster_stale = False

    def learn_route(self, log_id: LogId, node_id: str) -> None:
        node = NodeId(node_id)
        if self._routes.get(log_id) == node:
            return
        if node not in self._node_urls:
            self.cluster_stale = True
        self._routes.pop(log_id, None)
        if len(self._routes) >= self._routes_max:
            del self._routes[next(iter(self._routes))]
        self._routes[log_id] = node

    def learn_node_url(self, node_id: str, url: str) -> None:
        """A redirect named ``node_id`` at ``url``."""
        self._node_urls.setdefault(NodeId(node_id), normalize_url(url, self.scheme))

    def learn_node_data(self, node_id: str, data: str) -> None:
        """A binary redirect named ``node_id`` with its data port at ``data``."""
        self._node_data.setdefault(NodeId(node_id), data)

    def data_address(self, node_id: NodeId) -> str | None:
        return self._node_data.get(node_id)

    def data_candidates(self, log_id: LogId) -> Iterator[tuple[NodeId, str]]:
        """Binary protocol: the log's owner, then every other node with a data address, in the
        order of ``urls`` (healthiest first)."""
        first = self.owner(log_id)
        first_data = self._node_data.get(first) if first is not None else None
        if first is not None and first_data is not None:
            yield first, first_data
        by_url = {url: node for node, url in self._node_urls.items()}
        for url in list(self._urls):
            node = by_url.get(url)
            if node is None or node == first:
                continue
            data = self._node_data.get(node)
            if data is not None:
                yield node, data

    def demote_node(self, node_id: NodeId) -> None:
        url = self._node_urls.get(node_id)
        if url is not None:
            self.demote(url)

    def owner(self, log_id: LogId) -> NodeId | None:
        """The log's sequencer node as far as the client knows, or None."""
        node = self._routes.get(log_id)
        if node is not None and node in self._node_urls:
            return node
        return sequencer_for(log_id, self._routable)

    def owner_url(self, log_id: LogId | None) -> str | None:
        if log_id is None:
            return None
        owner = self.owner(log_id)
        return self._node_urls.get(owner) if owner is not None else None

    def forget_route(self, log_id: LogId) -> None:
        self._routes.pop(log_id, None)

    def demote(self, url: str) -> None:
        """``url`` failed: try it last from now on and stop routing logs to it."""
        if url in self._urls:
            self._urls.remove(url)
            self._urls.append(url)
        dead_nodes = {node for node, u in self._node_urls.items() if u == url}
        if dead_nodes:
            self._routes = {log: n for log, n in self._routes.items() if n not in dead_nodes}
            self._routable = [(n, w) for n, w in self._routable if n not in dead_nodes]

    def primary(self, log_id: LogId | None) -> str:
        return self.owner_url(log_id) or self._urls[0]

    def candidates(self, log_id: LogId | None) -> Iterator[str]:
        """The primary URL, then every other known URL once."""
        first = self.primary(log_id)
        yield first
        for url in list(self._urls):
            if url != first:
                yield url
