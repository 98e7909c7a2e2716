"""Effects shared by the pure cores: what a core asks its driver to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.types import NodeId


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to ``node`` over the node-to-node transport (one-way or a request whose
    reply comes back to the core as a message)."""

    node: NodeId
    message: Any
