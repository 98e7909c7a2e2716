"""Tells a node's sequencer and front end which storage nodes are leaving (issue 17, drain).

Every ``SHARD_WATCH_INTERVAL_MS`` it reads the cluster state (``shared.cluster_state``, kept in
the epoch store) and hands on two sets of storage nodes:

- **retired** (DRAINING, DRAINED, REMOVED): they take no new copies. The sequencer moves each
  active log whose nodeset holds one to a new epoch on a nodeset without it, and every later
  activation leaves them out (``epoch_store.core.metadata``);
- **moved** (DRAINED, REMOVED): their copies were all re-replicated elsewhere. Readers and
  recovery read epochs whose nodeset held one where the copies are now
  (``shared.read_round.metadata_spans``).

A node that cannot read the cluster state keeps what it knew: leaving a retired node in a
nodeset only costs appends its DISABLED answers, and reading a moved node's span with it still
in is correct (it waits for more answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from shared.cluster_state import ClusterState, ClusterStateStore, ShardStatus
from shared.status import Status
from shared.types import NodeId

log = logging.getLogger(__name__)

SHARD_WATCH_INTERVAL_MS = 1_000
SHARD_READ_TIMEOUT_MS = 5_000

RETIRED = (ShardStatus.DRAINING, ShardStatus.DRAINED, ShardStatus.REMOVED)
MOVED = (ShardStatus.DRAINED, ShardStatus.REMOVED)

Listener = Callable[[frozenset[NodeId], frozenset[NodeId]], None]
"""Called with (retired, moved) after every successful read of the cluster state."""


def leaving(state: ClusterState) -> tuple[frozenset[NodeId], frozenset[NodeId]]:
    """(retired, moved) storage nodes of ``state``."""
    retired = frozenset(NodeId(s.node_id) for s in state.shards if s.status in RETIRED)
    moved = frozenset(NodeId(s.node_id) for s in state.shards if s.status in MOVED)
    return retired, moved


class ShardWatch:
    def __init__(self, store: ClusterStateStore, listener: Listener,
                 interval_ms: int = SHARD_WATCH_INTERVAL_MS) -> None:
        self._store = store
        self._listener = listener
        self._interval_ms = interval_ms
        self._task: asyncio.Task[None] | None = None

    async def poll_once(self) -> bool:
        """Read the cluster state once and tell the listener; False if it was unreadable."""
        try:
            async with asyncio.timeout(SHARD_READ_TIMEOUT_MS / 1000):
                status, state, _ = await self._store.read()
        except TimeoutError:
            return False
        if status is not Status.OK:
            return False
        self._listener(*leaving(state))
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="seqlog-shard-watch")

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:
                log.exception("reading the cluster state for draining nodes failed")
            await asyncio.sleep(self._interval_ms / 1000)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
