"""Marks a message field as an *extension*: one added after version 1 of the protocol.

Fields of a message go on the wire as an array in dataclass order, and that order is permanent:
a new field is only ever appended, with a default, and marked ``metadata=EXTENSION``. The
codec sends a message's trailing extension fields only up to the last one that differs from
its default, and fills in the defaults of those missing from a received frame (and ignores
fields past the ones it knows, sent by a newer peer). So a frame whose extensions are all at
their defaults is byte for byte what an older peer sends and expects (docs/PROTOCOL.md).
"""

from __future__ import annotations

from types import MappingProxyType

EXTENSION = MappingProxyType({"extension": True})
"""``dataclasses.field(default=..., metadata=EXTENSION)``."""
