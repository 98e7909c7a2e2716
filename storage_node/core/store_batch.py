"""Answers of a STORE_BATCH (pure): collects the STORED of each of its STOREs, which the node
handles one by one exactly as if each came alone, and sends them as one STORED_BATCH once the
last one is in (``shared.wire.store_batch``).

Each STORE is answered through its own ``StoreSlot`` (a ``ReplyFn``): at once when refused
(PREEMPTED, BADMSG, NOSPC, ...), or once its write is durable. The STOREs of one batch join
one group commit, so the reply waits for one write and one fsync, not for each.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.status import Status
from shared.wire.store import Stored
from shared.wire.store_batch import SealAnswer, StoredBatch

_OK = int(Status.OK)


class StoredBatchAnswers:
    """The answers of one STORE_BATCH of ``count`` STOREs; ``reply`` gets the STORED_BATCH
    exactly once, when every STORE has been answered."""

    __slots__ = ("_missing", "_reply", "_seals", "_statuses")

    def __init__(self, count: int, reply: Callable[[StoredBatch], None]) -> None:
        assert count > 0
        self._statuses: list[int | None] = [None] * count
        self._seals: list[SealAnswer] = []
        self._missing = count
        self._reply = reply

    def slot(self, index: int) -> StoreSlot:
        """The ``ReplyFn`` of the batch's STORE ``index``."""
        return StoreSlot(self, index)

    def put(self, index: int, stored: Stored) -> None:
        """STORE ``index`` is answered with ``stored``; only its first answer counts."""
        statuses = self._statuses
        if statuses[index] is not None:
            return
        statuses[index] = int(stored.status)
        if stored.sealed_epoch or stored.sealed_by is not None:
            self._seals.append((index, int(stored.sealed_epoch), stored.sealed_by))
        self._missing -= 1
        if not self._missing:
            self._finish()

    def put_ok(self, index: int) -> None:
        """STORE ``index`` is durable: OK, with no seal (what ``put`` does with a STORED OK,
        without one being built per STORE)."""
        statuses = self._statuses
        if statuses[index] is not None:
            return
        statuses[index] = _OK
        self._missing -= 1
        if not self._missing:
            self._finish()

    def _finish(self) -> None:
        self._seals.sort(key=lambda seal: seal[0])
        self._reply(StoredBatch(statuses=tuple(s for s in self._statuses if s is not None),
                                seals=tuple(self._seals)))

    @property
    def missing(self) -> int:
        """STOREs not answered yet."""
        return self._missing


class StoreSlot:
    """The ``ReplyFn`` of one STORE of a batch."""

    __slots__ = ("_answers", "_index")

    def __init__(self, answers: StoredBatchAnswers, index: int) -> None:
        self._answers = answers
        self._index = index

    def __call__(self, stored: object) -> None:
        assert type(stored) is Stored, stored
        self._answers.put(self._index, stored)
