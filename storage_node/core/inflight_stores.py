"""STOREs accepted and not yet durable, so that a copy still being written is not written
again (pure).

A sequencer whose store timeout fired sends the same record again (a later wave of the same
append), and a network may duplicate a message. When such a STORE arrives while the node is
still writing the first one (it waits in the writer's queue behind other writes and fsyncs),
writing its payload a second time buys nothing: both carry the same LSN of the same epoch,
hence the same payload from the one sequencer of that epoch (the checksum is compared too), and
the first's write makes the copy durable for both. So the later STORE joins the first and is
answered with the first's outcome once it is known: STORED OK (with its own wave) when the
first is durable, or the first's error. The copy on disk is the first's (its wave and copyset),
as with the sequencer's amends: copies of one LSN written by its sequencer all carry the same
payload and the same precedence class, whichever wave wrote them.

Copies written by recovery (``flags``) never join: recovery decides between copies by them.
A node that crashes forgets everything here along with the replies it owed.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from shared.types import LogId, Lsn
from shared.wire.store import Store

T = TypeVar("T")

JOINED_PER_STORE_MAX = 16
"""Later STOREs answered by one write; past it they are written (a runaway retry loop must
not grow this without bound)."""


class InflightStores(Generic[T]):
    """By (log, first LSN), the STORE being written and the later ones waiting for it, each
    with a caller's token (the runtime's reply function)."""

    __slots__ = ("_joined", "_writing")

    def __init__(self) -> None:
        self._writing: dict[tuple[LogId, Lsn], Store] = {}
        self._joined: dict[tuple[LogId, Lsn], list[tuple[Store, T]]] = {}
        """Only for STOREs that have joiners (rare: no object per STORE written)."""

    def __len__(self) -> int:
        return len(self._writing)

    def join(self, store: Store, token: T) -> bool:
        """True when ``store`` is a copy of one being written: it must not be written, and
        ``token`` comes back from ``finish`` of the first. False: write it (then ``begin``)."""
        if store.flags:
            return False
        key = (store.log_id, store.lsn)
        first = self._writing.get(key)
        if first is None or (first.checksum != store.checksum
                             or first.records_count != store.records_count
                             or first.compression != store.compression):
            return False
        joined = self._joined.setdefault(key, [])
        if len(joined) >= JOINED_PER_STORE_MAX:
            return False
        joined.append((store, token))
        return True

    def writing(self, store: Store) -> bool:
        """Whether a STORE of ``store``'s log and LSN is being written (``join`` may take
        it): a cheap look before building a token."""
        return (store.log_id, store.lsn) in self._writing

    def begin(self, store: Store) -> None:
        """``store`` was queued for writing (a recovery copy is not tracked)."""
        if not store.flags:
            self._writing.setdefault((store.log_id, store.lsn), store)

    def finish(self, store: Store) -> list[tuple[Store, T]]:
        """``store``'s write ended (durable or failed): the STOREs that joined it, to be
        answered with its outcome."""
        key = (store.log_id, store.lsn)
        if self._writing.get(key) is not store:
            return []
        del self._writing[key]
        return self._joined.pop(key, []) if self._joined else []
