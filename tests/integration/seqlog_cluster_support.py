"""Starting a real local cluster for integration tests (used by conftest.py and tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

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
