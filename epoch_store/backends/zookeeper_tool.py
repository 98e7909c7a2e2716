"""Blocking reads of the ZooKeeper epoch store for command-line tooling (``seqlog epochs``).

Uses kazoo's synchronous calls on a short-lived client; never call these on an event loop.
Decoding is the backend's own (``metadata_from_znode``/``lce_from_znode``), so tooling shows
exactly what the nodes would read.
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.exceptions import KazooException, NoNodeError  # type: ignore[import-untyped]
from kazoo.handlers.threading import KazooTimeoutError  # type: ignore[import-untyped]
from kazoo.retry import KazooRetry  # type: ignore[import-untyped]

from epoch_store.backends.zk_session import KAZOO_LOGGER
from epoch_store.backends.zookeeper import lce_from_znode, log_path, metadata_from_znode
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import LogId

logger = logging.getLogger(__name__)


def read_znodes(
    hosts: str, root: str, log_id: LogId, *, timeout_ms: int
) -> tuple[Status, LogMetadata | None, LastCleanEpoch | None]:
    """The log's metadata and stored LCE: ``(OK, None, None)`` for a log that does not exist,
    ``CONNFAILED`` if no server answered within ``timeout_ms``, ``INTERNAL`` for corrupt data."""
    retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5)
    client = KazooClient(hosts=hosts, timeout=max(timeout_ms / 1000, 1.0),
                         connection_retry=retry, command_retry=KazooRetry(max_tries=0),
                         logger=KAZOO_LOGGER)
    try:
        client.start(timeout=timeout_ms / 1000)
    except KazooTimeoutError:
        client.close()  # start() already stopped it
        return Status.CONNFAILED, None, None
    try:
        base = log_path(root, log_id)
        raw, version = _get(client, base + "/sequencer")
        if raw is None:
            return Status.OK, None, None
        meta = metadata_from_znode(raw, version, log_id)
        if isinstance(meta, str):
            logger.error("%s/sequencer is corrupt: %s", base, meta)
            return Status.INTERNAL, None, None
        raw, version = _get(client, base + "/lce")
        lce = None if raw is None else lce_from_znode(raw, version, log_id)
        if isinstance(lce, str):
            logger.error("%s/lce is corrupt: %s", base, lce)
            return Status.INTERNAL, meta, None
        return Status.OK, meta, lce
    except KazooException as exc:
        logger.error("reading log %d from ZooKeeper %s failed: %r", log_id, hosts, exc)
        return Status.CONNFAILED, None, None
    finally:
        client.stop()
        client.close()


def _get(client: Any, path: str) -> tuple[bytes | None, int]:
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return None, 0
    return bytes(data), int(stat.version)
