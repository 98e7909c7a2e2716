"""Trims reach every storage node of the nodeset eventually.

``FrontEnd.trim`` answers once R nodes (at least an f-majority) wrote the trim point: every
f-majority of the nodeset then holds at least one of them, and readers take the highest trim
point any answering node reports, so no reader reads below an acknowledged trim point
(``shared.read_merge``). The nodes that missed it (down, paused, slow) still hold the records
below it on disk and answer find-time from them; ``TrimSpreader`` keeps sending them the trim,
with backoff, until each has written it or ``TRIM_RETRY_DURATION_MS`` passed. It is in memory,
but the trim point is durable on the nodes that have it: every ``tail`` call compares the
nodes' trim points and owes the highest to those behind it, so a node that was away longer,
or a front end that stopped, is caught up by the next tail of the log (consumers poll it).
"""

from __future__ import annotations

import asyncio
import logging

from shared.net.pool import PeerPool
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.trim import Trim, Trimmed

log = logging.getLogger(__name__)

TRIM_LOGS_OWED_MAX = 10_000
"""Logs with trims owed to some node at once; past it a trim is not retried (logged)."""
TRIM_RETRY_DURATION_MS = 600_000
TRIM_RETRY_FIRST_MS = 500
TRIM_RETRY_MAX_MS = 30_000
TRIM_CALL_TIMEOUT_MS = 2_000


class TrimSpreader:
    def __init__(self, pool: PeerPool) -> None:
        self._pool = pool
        self._owed: dict[LogId, tuple[Lsn, set[NodeId]]] = {}
        self._tasks: dict[LogId, asyncio.Task[None]] = {}

    def owe(self, log_id: LogId, trim_lsn: Lsn, nodes: set[NodeId]) -> None:
        """``nodes`` have not written ``trim_lsn`` of ``log_id`` yet: retry until they have."""
        if not nodes:
            return
        owed = self._owed.get(log_id)
        if owed is None and len(self._owed) >= TRIM_LOGS_OWED_MAX:
            log.warning("log %d: trim to %d not retried on %s (%d logs owe trims)", log_id,
                        trim_lsn, sorted(nodes), len(self._owed))
            return
        if owed is not None:
            trim_lsn = Lsn(max(trim_lsn, owed[0]))
            nodes = nodes | owed[1]
        self._owed[log_id] = (trim_lsn, nodes)
        if log_id not in self._tasks:
            self._tasks[log_id] = asyncio.get_running_loop().create_task(
                self._retry(log_id), name=f"seqlog-trim-retry-{log_id}")

    def owed(self, log_id: LogId) -> tuple[Lsn, frozenset[NodeId]] | None:
        found = self._owed.get(log_id)
        return None if found is None else (found[0], frozenset(found[1]))

    async def _retry(self, log_id: LogId) -> None:
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + TRIM_RETRY_DURATION_MS / 1000
        delay_ms = TRIM_RETRY_FIRST_MS
        try:
            while loop.time() < deadline_s:
                await asyncio.sleep(delay_ms / 1000)
                trim_lsn, nodes = self._owed[log_id]
                replies = await asyncio.gather(*(
                    self._pool.call(node, Trim(log_id=log_id, trim_lsn=trim_lsn),
                                    TRIM_CALL_TIMEOUT_MS) for node in sorted(nodes)))
                done = {node for node, reply in zip(sorted(nodes), replies, strict=True)
                        if type(reply) is Trimmed and reply.status is Status.OK
                        and reply.trim_lsn >= trim_lsn}
                current_lsn, current = self._owed[log_id]
                if current_lsn == trim_lsn:
                    current -= done
                if not current:
                    return
                delay_ms = min(delay_ms * 2, TRIM_RETRY_MAX_MS)
            log.warning("log %d: trim to %d still not written on %s after %d s; call trim "
                        "again to retry", log_id, self._owed[log_id][0],
                        sorted(self._owed[log_id][1]), TRIM_RETRY_DURATION_MS // 1000)
        finally:
            self._owed.pop(log_id, None)
            self._tasks.pop(log_id, None)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
