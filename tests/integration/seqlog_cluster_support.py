"""Starting a real local cluster for integration tests (used by conftest.py and tests)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from seqlog import LogError
from services import local_cluster as lc

READY_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class RunningCluster:
    dir: Path
    state: lc.ClusterState

    @property
    def sequencer_urls(self) -> list[str]:
        return self.state.sequencer_urls


def start_cluster(root: Path, *, storage_nodes: int = 3, sequencers: int = 2) -> RunningCluster:
    """3 storage nodes and 2 sequencers with R=3 on free ports; fails the test with the
    failing node's log if the cluster does not become ready."""
    spec = lc.LocalClusterSpec(
        dir=root, storage_nodes=storage_nodes, sequencers=sequencers, replication=3,
        base_port=lc.free_base_port(storage_nodes + sequencers), fsync="never",
    )
    try:
        state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
    except lc.LocalClusterError as exc:
        pytest.fail(f"local cluster did not start:\n{exc}", pytrace=False)
    return RunningCluster(dir=root.resolve(), state=state)


async def poll(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Wait until ``check()`` is true (a ``LogError`` counts as not yet), or fail after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if await check():
                return
        except LogError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def metric(address: str, name: str, default: float | None = None) -> float:
    """One sample of a node's /metrics (``address``: host:port or a URL); ``default`` when it
    is absent, or an assertion failure without one."""
    base = address if "://" in address else f"http://{address}"
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    if default is None:
        raise AssertionError(f"{name} not in the metrics of {address}")
    return default
