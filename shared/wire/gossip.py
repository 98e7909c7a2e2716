"""GOSSIP: one node's failure-detector view, sent every gossip interval to one random peer
(LogDevice's GOSSIP_Message). The node list is carried as parallel tuples; the codec checks
only that they are tuples, so the receiver validates their elements before use."""

from __future__ import annotations

from dataclasses import dataclass

from shared.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class Gossip:
    sender: NodeId
    instance_id: int
    """The sender's instance id: its start time in wall-clock ms; a restart increases it."""
    sent_wall_ms: int
    """Wall-clock send time; receivers drop gossip skewed by more than the allowed skew."""
    node_ids: tuple[NodeId, ...]
    heartbeats: tuple[int, ...]
    """Per node: gossip intervals since someone last heard from it (0 for the sender)."""
    instance_ids: tuple[int, ...]
    """Per node: its instance id as far as the sender knows (0: never heard of)."""
    failover: tuple[bool, ...]
    """Per node: True while that instance is shutting down gracefully (treat it DEAD now)."""
