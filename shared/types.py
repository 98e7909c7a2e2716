"""Domain number types (log ids, epochs, ESNs, LSNs, node ids) and their one set of conversions.

An LSN is ``epoch << 32 | esn``. Humans see it as ``e5n8``. Every conversion between the
three lives here so that nobody else shifts or masks bits.
"""

from __future__ import annotations

import re
from typing import NewType

LogId = NewType("LogId", int)
Epoch = NewType("Epoch", int)
Esn = NewType("Esn", int)
Lsn = NewType("Lsn", int)
NodeId = NewType("NodeId", str)

LOG_ID_MIN = LogId(1)
LOG_ID_MAX = LogId(2**62 - 1)

EPOCH_INVALID = Epoch(0)
EPOCH_MIN = Epoch(1)
EPOCH_MAX = Epoch(2**32 - 2)

ESN_INVALID = Esn(0)
ESN_MIN = Esn(1)
ESN_MAX = Esn(2**32 - 2)

LSN_INVALID = Lsn(0)
LSN_OLDEST = Lsn(1)
LSN_MAX = Lsn(2**64 - 1)

_ESN_BITS = 32
_ESN_MASK = (1 << _ESN_BITS) - 1
_LSN_TEXT = re.compile(r"^e(\d+)n(\d+)$")
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def compose_lsn(epoch: Epoch, esn: Esn) -> Lsn:
    """The LSN of ``esn`` in ``epoch``; esn 0 is the slot just before the epoch's first record."""
    assert 0 <= epoch <= EPOCH_MAX + 1, epoch
    assert 0 <= esn <= _ESN_MASK, esn
    return Lsn((epoch << _ESN_BITS) | esn)


def lsn_to_epoch(lsn: Lsn) -> Epoch:
    return Epoch(lsn >> _ESN_BITS)


def lsn_to_esn(lsn: Lsn) -> Esn:
    return Esn(lsn & _ESN_MASK)


def format_lsn(lsn: Lsn) -> str:
    """``e5n8`` for LSN ``5 << 32 | 8``."""
    return f"e{lsn_to_epoch(lsn)}n{lsn_to_esn(lsn)}"


def parse_lsn(text: str) -> Lsn | None:
    """Parse ``e5n8`` or a decimal LSN; None when the text is not an LSN."""
    match = _LSN_TEXT.match(text)
    if match is not None:
        epoch, esn = int(match.group(1)), int(match.group(2))
        if epoch > EPOCH_MAX + 1 or esn > _ESN_MASK:
            return None
        return compose_lsn(Epoch(epoch), Esn(esn))
    if text.isdigit() and int(text) <= LSN_MAX:
        return Lsn(int(text))
    return None


def log_id_valid(value: object) -> bool:
    return type(value) is int and LOG_ID_MIN <= value <= LOG_ID_MAX


def lsn_valid(value: object) -> bool:
    return type(value) is int and 0 <= value <= LSN_MAX


def epoch_valid(epoch: int) -> bool:
    return EPOCH_MIN <= epoch <= EPOCH_MAX


def node_id_valid(value: object) -> bool:
    return isinstance(value, str) and _NODE_ID.match(value) is not None


CLIENT_ID_PREFIX = "client."
"""Peers whose HELLO names them ``client.<anything>`` are readers, not cluster nodes: they may
only send the read-only messages (see ``shared.net.server``). No node id may start so."""


def is_client_id(node_id: str) -> bool:
    return node_id.startswith(CLIENT_ID_PREFIX)


# Relationships the rest of the code relies on, checked once at import.
assert not epoch_valid(lsn_to_epoch(LSN_MAX))
assert compose_lsn(EPOCH_MIN, ESN_MIN) > LSN_OLDEST
assert lsn_to_esn(compose_lsn(EPOCH_MAX, ESN_MAX)) == ESN_MAX
assert format_lsn(compose_lsn(Epoch(5), Esn(8))) == "e5n8"
