"""HELLO: the first frame on every connection to a data port (identity, protocol version, cluster
config), from nodes and from clients alike; and AUTH, a node's answer to the cluster-secret
challenge of a HELLO_REPLY (``shared.net.node_auth``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.status import Status
from shared.types import NodeId
from shared.wire.extension import EXTENSION

PROTOCOL_VERSION = 3
"""The newest protocol version this build speaks. 2: clients may send APPEND (with
``no_forward``) and get ``Appended.redirect_data``; 3: also APPEND_MULTI (docs/PROTOCOL.md)."""
PROTOCOL_VERSION_MIN = 1
"""The oldest version a node accepts in a HELLO."""
NODE_PROTOCOL_VERSION = 1
"""The version nodes announce to each other: node-to-node traffic uses nothing newer (new
fields are extensions, absent at their defaults), so nodes of either version keep talking
while a cluster is upgraded one node at a time."""
CLIENT_APPEND_VERSION = 2
"""A client must announce at least this version to send APPEND; a node too old for that
refuses its HELLO with PROTONOSUPPORT."""
CLIENT_APPEND_MULTI_VERSION = 3
"""A client must announce at least this version to send APPEND_MULTI. A node too old for it
refuses the HELLO with PROTONOSUPPORT; the client then says hello again with
``CLIENT_APPEND_VERSION`` and sends APPENDs only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    node_id: NodeId
    protocol_version: int
    cluster_fingerprint: str
    auth_nonce: bytes = field(default=b"", metadata=EXTENSION)
    """A node's challenge to the node it connects to, when it has a cluster secret: the
    HELLO_REPLY proves the answering node knows the secret too."""
    token: str = field(default="", metadata=EXTENSION)
    """A client's bearer token (docs/SECURITY.md); empty from nodes and from clients of an
    open cluster."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HelloReply:
    status: Status
    node_id: NodeId
    auth_nonce: bytes = field(default=b"", metadata=EXTENSION)
    """The answering node's challenge: a peer that claims to be a node and has no node
    certificate must send AUTH with its proof before anything else."""
    auth_proof: bytes = field(default=b"", metadata=EXTENSION)
    """The answering node's proof over both challenges (when the HELLO carried one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Auth:
    """A node's proof over both challenges (one-way, correlation id 0)."""

    proof: bytes
