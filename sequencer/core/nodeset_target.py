"""Which nodeset a sequencer wants a log's next epoch on (LogDevice's nodeset selector), pure.

A log's nodeset is chosen when it is provisioned; storage nodes added to the cluster later
(``services.membership``) join it at its next epoch: every activation, and a graceful epoch
change when the membership grows (``Sequencer.on_nodes_retired``), asks the epoch store for
the nodeset topped up to the cluster's ``nodeset_size`` (0: every storage node) from the
storage nodes that may take copies: a positive ``storage_capacity``, not retired (draining,
drained, removed) and not reported DEAD (a dead node in a new nodeset would only cost reads
their f-majority; it joins at a later epoch). Candidates are ranked per log by weighted
rendezvous hashing (``shared.routing.rendezvous_order``), so with a nodeset smaller than the
cluster, logs spread over the added nodes in proportion to their capacity. The epoch store
keeps the nodes already in the nodeset (``shared.epoch_metadata.next_nodeset``): their
records stay where they are.
"""

from __future__ import annotations

from shared.config import ClusterConfig
from shared.epoch_metadata import NodesetTarget
from shared.routing import rendezvous_order
from shared.types import LogId, NodeId


def nodeset_target(log_id: LogId, cluster: ClusterConfig, *, retired: frozenset[NodeId],
                   unavailable: frozenset[NodeId]) -> NodesetTarget:
    """The nodeset wanted for ``log_id``'s next epoch; see the module doc."""
    weights = [(n.node_id, n.storage_capacity) for n in cluster.nodes
               if "storage" in n.roles and n.node_id not in retired
               and n.node_id not in unavailable]
    candidates = tuple(rendezvous_order(log_id, weights))
    size = cluster.nodeset_size or len(candidates)
    return NodesetTarget(candidates=candidates, size=size)


def may_grow(nodeset_size: int, replication: int, current: int, candidates_max: int) -> bool:
    """Whether a nodeset of ``current`` nodes can grow at all (cheap, before ranking): below
    ``nodeset_size`` (0: every storage node) or below R."""
    return current < max(nodeset_size or candidates_max, replication)
