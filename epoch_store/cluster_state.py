"""Where the cluster-wide shard state (``shared.cluster_state``) is kept, per epoch store URL.

- ``file:///dir``: ``dir/cluster_state.json``, changed under an exclusive ``flock`` of
  ``dir/cluster_state.lock`` (read, compare the version inside, write a temporary file, fsync,
  rename, fsync the directory), so every process of the machine sees one document and a crash
  leaves the old or the new one.
- ``zk://hosts/root``: the znode ``root/cluster_state``; the compare-and-swap is ZooKeeper's
  versioned ``set`` (``create`` for the first version).
- ``memory:``: one process (tests).

The version is a counter inside the file (ZooKeeper: the znode's version plus one), 0 when
there is no document yet.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from typing import Any

from shared import cluster_state as cs
from shared.cluster_state import ClusterState, ClusterStateStore
from shared.durable_files import replace_atomically
from shared.status import Status

FILE_NAME = "cluster_state.json"
LOCK_NAME = "cluster_state.lock"


class MemoryClusterState:
    def __init__(self) -> None:
        self.state = cs.EMPTY
        self.version = 0

    async def read(self) -> tuple[Status, ClusterState, int]:
        return Status.OK, self.state, self.version

    async def write(self, state: ClusterState, *, expected_version: int) -> Status:
        if expected_version != self.version:
            return Status.AGAIN
        self.state, self.version = state, self.version + 1
        return Status.OK

    async def close(self) -> None:
        pass


class FileClusterState:
    """Blocking file work runs in the default executor (small, rare writes)."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._path = os.path.join(root, FILE_NAME)

    async def read(self) -> tuple[Status, ClusterState, int]:
        return await asyncio.get_running_loop().run_in_executor(None, self._read_sync)

    async def write(self, state: ClusterState, *, expected_version: int) -> Status:
        return await asyncio.get_running_loop().run_in_executor(
            None, self._write_sync, state, expected_version)

    async def close(self) -> None:
        pass

    def _read_sync(self) -> tuple[Status, ClusterState, int]:
        try:
            with open(self._path, "rb") as file:
                raw = file.read()
        except FileNotFoundError:
            return Status.OK, cs.EMPTY, 0
        except OSError:
            return Status.INTERNAL, cs.EMPTY, 0
        return _parse(raw)

    def _write_sync(self, state: ClusterState, expected_version: int) -> Status:
        try:
            os.makedirs(self._root, exist_ok=True)
            lock_fd = os.open(os.path.join(self._root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return Status.INTERNAL
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            status, _, version = self._read_sync()
            if status is not Status.OK:
                return status
            if version != expected_version:
                return Status.AGAIN
            document = {"version": version + 1, "state": json.loads(cs.encode(state))}
            replace_atomically(self._path, json.dumps(document, sort_keys=True).encode())
            return Status.OK
        except OSError:
            return Status.INTERNAL
        finally:
            os.close(lock_fd)  # also releases the lock


def _parse(raw: bytes) -> tuple[Status, ClusterState, int]:
    try:
        document: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return Status.INTERNAL, cs.EMPTY, 0
    if type(document) is not dict or type(document.get("version")) is not int or not (
            0 < document["version"] < 2**62):
        return Status.INTERNAL, cs.EMPTY, 0
    state = cs.decode(json.dumps(document.get("state")).encode())
    if state is None:
        return Status.INTERNAL, cs.EMPTY, 0
    return Status.OK, state, document["version"]


class ZooKeeperClusterState:
    """The znode ``root/cluster_state`` through the backend's asyncio kazoo session."""

    def __init__(self, url: str) -> None:
        from epoch_store.backends.zk_session import ZkSession
        from epoch_store.backends.zookeeper import parse_zk_url
        hosts, root, options = parse_zk_url(url)
        self._path = root.rstrip("/") + "/cluster_state"
        self._options = options
        self._session = ZkSession(hosts, options)

    async def read(self) -> tuple[Status, ClusterState, int]:
        from kazoo.exceptions import NoNodeError  # type: ignore[import-untyped]
        deadline_s = self._deadline_s()
        if not await self._session.wait_connected(deadline_s):
            return Status.CONNFAILED, cs.EMPTY, 0
        try:
            raw, stat = await self._session.call(lambda zk: zk.get_async(self._path), deadline_s)
        except NoNodeError:
            return Status.OK, cs.EMPTY, 0
        except Exception:
            return Status.CONNFAILED, cs.EMPTY, 0
        state = cs.decode(raw)
        if state is None:
            return Status.INTERNAL, cs.EMPTY, 0
        return Status.OK, state, stat.version + 1

    async def write(self, state: ClusterState, *, expected_version: int) -> Status:
        from kazoo.exceptions import (
            BadVersionError,
            NodeExistsError,
        )
        raw = cs.encode(state)
        deadline_s = self._deadline_s()
        if not await self._session.wait_connected(deadline_s):
            return Status.CONNFAILED
        try:
            if expected_version == 0:
                await self._session.call(
                    lambda zk: zk.create_async(self._path, raw, makepath=True), deadline_s)
            else:
                await self._session.call(
                    lambda zk: zk.set_async(self._path, raw, version=expected_version - 1),
                    deadline_s)
        except (BadVersionError, NodeExistsError):
            return Status.AGAIN
        except Exception:
            # Unknown outcome (a lost reply): the caller re-reads, and a transition that was
            # applied plans nothing the second time.
            return Status.CONNFAILED
        return Status.OK

    def _deadline_s(self) -> float:
        return asyncio.get_running_loop().time() + self._options.op_timeout_ms / 1000

    async def close(self) -> None:
        await self._session.close()


def open_cluster_state(url: str) -> ClusterStateStore:
    """The cluster state store beside the epoch store named by ``url``."""
    if url == "memory:":
        return MemoryClusterState()
    if url.startswith("zk://"):
        return ZooKeeperClusterState(url)
    from epoch_store.factory import _file_root
    root = _file_root(url)
    if root is None:
        raise ValueError(f"unknown epoch store URL {url!r}")
    return FileClusterState(root)
