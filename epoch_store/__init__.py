"""The epoch store: per-log epoch metadata and last clean epoch, changed only by
compare-and-swap (``shared.ports.EpochStore``). Open one with ``open_epoch_store(url)``."""

from epoch_store.backends.cas import CasEpochStore, CasRetry, VersionedObjects
from epoch_store.backends.file import FileEpochStore, FileObjects
from epoch_store.backends.memory import MemoryEpochStore, MemoryObjects
from epoch_store.backends.zk_session import ZkOptions
from epoch_store.backends.zookeeper import ZooKeeperEpochStore, ZooKeeperObjects, parse_zk_url
from epoch_store.factory import LogState, open_epoch_store, read_log_state

__all__ = [
    "CasEpochStore",
    "CasRetry",
    "FileEpochStore",
    "FileObjects",
    "LogState",
    "MemoryEpochStore",
    "MemoryObjects",
    "VersionedObjects",
    "ZkOptions",
    "ZooKeeperEpochStore",
    "ZooKeeperObjects",
    "open_epoch_store",
    "parse_zk_url",
    "read_log_state",
]
