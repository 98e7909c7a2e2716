"""HELLO: the first frame on every node-to-node connection (identity, protocol, cluster config)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.status import Status
from shared.types import NodeId

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    node_id: NodeId
    protocol_version: int
    cluster_fingerprint: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HelloReply:
    status: Status
    node_id: NodeId
