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


_new_object = object.__new__
_set_node = Send.__dict__["node"].__set__
_set_message = Send.__dict__["message"].__set__
assert len(Send.__dataclass_fields__) == 2 and not hasattr(Send, "__post_init__")


def send_of(node: NodeId, message: Any) -> Send:
    """``Send(node, message)`` set through the slots' descriptors: a quarter of the frozen
    dataclass ``__init__``'s cost (a sequencer builds R per record, with many logs)."""
    send = _new_object(Send)
    _set_node(send, node)
    _set_message(send, message)
    return send
