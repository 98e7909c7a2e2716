"""Which sequencer node runs a log: weighted rendezvous (highest-random-weight) hashing of the
log id over the sequencer nodes. Nodes and clients compute the same answer from the same list.

Rendezvous hashing is a consistent hash: removing a node moves only that node's logs, and a
node's share of logs is proportional to its ``sequencer_weight``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

from shared.types import LogId, NodeId


def _unit_hash(log_id: LogId, node_id: NodeId) -> float:
    digest = hashlib.blake2b(f"{log_id}/{node_id}".encode(), digest_size=8).digest()
    # Map to (0, 1): never 0, so the log below is finite.
    return (int.from_bytes(digest, "big") + 1) / (2**64 + 1)


def sequencer_for(log_id: LogId, nodes: Iterable[tuple[NodeId, float]]) -> NodeId | None:
    """The node with the highest score ``-weight / ln(h)``; None when no node has weight."""
    best: NodeId | None = None
    best_score = -math.inf
    for node_id, weight in nodes:
        if weight <= 0:
            continue
        score = -weight / math.log(_unit_hash(log_id, node_id))
        if score > best_score or (score == best_score and best is not None and node_id < best):
            best, best_score = node_id, score
    return best


def routable_sequencers(
    weights: Iterable[tuple[NodeId, float]], states: Mapping[NodeId, str]
) -> list[tuple[NodeId, float]]:
    """The sequencer nodes appends may go to: those the failure detector reports ``ALIVE``
    (a node missing from ``states`` counts as ALIVE); when none is, the ``SUSPECT`` ones,
    since a node that may be back beats no sequencer at all. Nodes and clients both apply
    this to the same view (GET /v1/cluster) and so pick the same owner."""
    candidates = [(n, w) for n, w in weights if w > 0]
    for state in ("ALIVE", "SUSPECT"):
        chosen = [(n, w) for n, w in candidates if states.get(n, "ALIVE") == state]
        if chosen:
            return chosen
    return []


def rendezvous_order(log_id: LogId, nodes: Iterable[tuple[NodeId, float]]) -> list[NodeId]:
    """Every node with weight, best first by the same score as ``sequencer_for`` (ties by id):
    the order in which a log's nodeset takes storage nodes (``shared.epoch_metadata``
    ``NodesetTarget``), so logs spread over added nodes in proportion to their weight and a
    log's choice changes only by the nodes added or removed."""
    scored = [(-weight / math.log(_unit_hash(log_id, node_id)), node_id)
              for node_id, weight in nodes if weight > 0]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [node_id for _, node_id in scored]
