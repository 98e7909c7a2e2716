"""Membership changes without restarts: a running node re-reads its configuration file on
SIGHUP and applies the nodes it adds (and changed weights) to every role at once.

What a reload may change: new nodes (storage, sequencer or both), and ``sequencer_weight`` /
``storage_capacity`` of existing ones. What it may not: removing a node, moving one (host,
ports, roles), or any cluster-wide setting (the fingerprint); such a file is refused with a
logged reason and the node keeps running on its old configuration.

Applying: the transport learns the new addresses, gossip starts tracking the new members (ALIVE
and never heard of, as at start-up: silent ones go DEAD after the threshold), routing takes the
new sequencer weights (rendezvous hashing moves about 1/n of the logs to a new sequencer node,
which recovers them like any failover), logs provisioned from now on get the new default
nodeset, and existing logs take added storage nodes into their nodesets at a new epoch (the
sequencer runtime's ``update_cluster``; see ``sequencer.core.nodeset_target``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import aiofiles

from shared.config import ClusterConfig, NodeConfig, ProcessConfig, process_from_dict

log = logging.getLogger(__name__)


class MembershipError(ValueError):
    """A configuration change that a reload cannot apply."""


@dataclass(frozen=True, slots=True)
class ClusterChange:
    added: tuple[NodeConfig, ...]
    reweighted: tuple[NodeConfig, ...]


def _placement(node: NodeConfig) -> tuple[str, int, int, tuple[str, ...]]:
    return node.host, node.http_port, node.data_port, node.roles


def cluster_change(old: ClusterConfig, new: ClusterConfig) -> ClusterChange:
    """What ``new`` changes relative to ``old``; MembershipError if a reload cannot do it."""
    if new.fingerprint() != old.fingerprint():
        raise MembershipError("cluster-wide settings differ (cluster name, replication, "
                              "nodeset size or retention): change them on every node and "
                              "restart")
    reweighted = []
    for node in old.nodes:
        now = new.node(node.node_id)
        if now is None:
            raise MembershipError(f"node {node.node_id} is missing: removing nodes while "
                                  "running is not supported")
        if _placement(now) != _placement(node):
            raise MembershipError(f"node {node.node_id} moved (host, ports or roles): "
                                  "restart it under a new node id instead")
        if (now.sequencer_weight, now.storage_capacity) != (
                node.sequencer_weight, node.storage_capacity):
            reweighted.append(now)
    added = tuple(n for n in new.nodes if old.node(n.node_id) is None)
    return ClusterChange(added=added, reweighted=tuple(reweighted))


class Membership:
    """The node's current cluster configuration, and who must hear when it changes."""

    def __init__(self, config: ProcessConfig) -> None:
        self.config = config
        self._listeners: list[Callable[[ClusterConfig, ClusterChange], None]] = []

    @property
    def cluster(self) -> ClusterConfig:
        return self.config.cluster

    def subscribe(self, listener: Callable[[ClusterConfig, ClusterChange], None]) -> None:
        self._listeners.append(listener)

    def apply(self, new: ProcessConfig) -> ClusterChange:
        """Switch to ``new``'s cluster (everything else in ``new`` is ignored: per-node
        settings need a restart)."""
        if new.node_id != self.config.node_id:
            raise MembershipError(f"the file is for node {new.node_id}, not "
                                  f"{self.config.node_id}")
        change = cluster_change(self.config.cluster, new.cluster)
        if change.added or change.reweighted:
            self.config = replace(self.config, cluster=new.cluster)
            for listener in self._listeners:
                listener(new.cluster, change)
        return change

    def reload(self, path: str) -> ClusterChange | None:
        """Re-read ``path`` and apply it; logs and returns None when it cannot. Blocking: a
        running node uses ``reload_async``."""
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            self._refused(path, exc)
            return None
        return self._apply_text(path, text)

    async def reload_async(self, path: str) -> ClusterChange | None:
        """``reload`` with the file read off the event loop (aiofiles: a slow disk or a
        network file system never stalls the node's appends)."""
        try:
            async with aiofiles.open(path, encoding="utf-8") as file:
                text = await file.read()
        except OSError as exc:
            self._refused(path, exc)
            return None
        return self._apply_text(path, text)

    def _refused(self, path: str, exc: Exception) -> None:
        log.error("node %s: configuration reload from %s refused: %s",
                  self.config.node_id, path, exc)

    def _apply_text(self, path: str, text: str) -> ClusterChange | None:
        try:
            change = self.apply(process_from_dict(json.loads(text)))
        except (ValueError, TypeError) as exc:
            self._refused(path, exc)
            return None
        log.info("node %s: configuration reloaded: %d nodes added (%s), %d reweighted",
                 self.config.node_id, len(change.added),
                 ",".join(n.node_id for n in change.added), len(change.reweighted))
        return change
