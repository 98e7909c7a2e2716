"""Opening an epoch store from its URL, and a blocking read of a log's state for tooling.

URLs: ``file:///abs/dir`` (the file backend, shared by the processes of one machine),
``zk://host:port[,host:port...]/root`` (ZooKeeper, optionally with ``?session_timeout_ms=N`` and
``op_timeout_ms=N``) and ``memory:`` (a fresh in-process store, for tests and single-process
experiments).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from epoch_store.backends.file import FileEpochStore, FileObjects
from epoch_store.backends.memory import MemoryEpochStore
from epoch_store.backends.zookeeper import ZooKeeperEpochStore, parse_zk_url
from epoch_store.backends.zookeeper_tool import read_znodes
from epoch_store.core import metadata as core
from shared.config import TlsConfig
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.ports import EpochStore
from shared.status import Status
from shared.types import LogId


def _file_root(url: str) -> str | None:
    """The directory of a ``file:`` URL, or None when ``url`` is not one."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        return None
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise ValueError(f"epoch store URL must be file:///absolute/dir, got {url!r}")
    path = unquote(parts.path)
    if not path.startswith("/") or path == "/":
        raise ValueError(f"epoch store URL needs an absolute directory, got {url!r}")
    return path.rstrip("/")


def open_epoch_store(url: str, *, zk_tls: TlsConfig | None = None) -> EpochStore:
    """The store named by ``url``; raises ValueError for an unknown or malformed URL. Does no
    I/O: the file backend creates its directories on first write. ``zk_tls``: TLS to
    ZooKeeper (docs/SECURITY.md)."""
    if url == "memory:":
        return MemoryEpochStore()
    if url.startswith("zk://"):
        return ZooKeeperEpochStore.from_url(url, tls=zk_tls)
    root = _file_root(url)
    if root is None:
        raise ValueError(f"unknown epoch store URL {url!r} (want file:///dir, zk://... or memory:)")
    return FileEpochStore(root)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogState:
    status: Status
    metadata: LogMetadata | None
    last_clean_epoch: LastCleanEpoch | None


def read_log_state(url: str, log_id: LogId, *, timeout_ms: int = 5_000) -> LogState:
    """Blocking read of a log's metadata and last clean epoch from a ``file:`` or ``zk:``
    store, for command-line tooling (never call it on an event loop). ``NOTFOUND`` for an
    unknown log, ``INVALID_PARAM`` for a bad log id, ``INTERNAL`` for corrupt data,
    ``CONNFAILED`` when ZooKeeper cannot be reached within ``timeout_ms``."""
    if core.check_log_id(log_id) != Status.OK:
        return LogState(status=Status.INVALID_PARAM, metadata=None, last_clean_epoch=None)
    if url.startswith("zk://"):
        hosts, root, _ = parse_zk_url(url)
        status, meta, lce = read_znodes(hosts, root, log_id, timeout_ms=timeout_ms)
    else:
        status, meta, lce = _read_files(url, log_id)
    if status != Status.OK or meta is None:
        status = Status.NOTFOUND if status == Status.OK else status
        return LogState(status=status, metadata=meta, last_clean_epoch=None)
    view_status, view = core.view_last_clean_epoch(lce, log_id=log_id, log_provisioned=True)
    return LogState(status=view_status, metadata=meta, last_clean_epoch=view)


def _read_files(
    url: str, log_id: LogId
) -> tuple[Status, LogMetadata | None, LastCleanEpoch | None]:
    root = _file_root(url)
    if root is None:
        raise ValueError(f"read_log_state needs a file:///dir or zk:// URL, got {url!r}")
    objects = FileObjects(root)
    try:
        status, meta = objects.read_metadata_sync(log_id)
        if status != Status.OK or meta is None:
            return status, None, None
        status, lce = objects.read_lce_sync(log_id)
        return status, meta, lce
    finally:
        objects.journal.close()
