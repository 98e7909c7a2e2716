"""Integration fixtures: a real local cluster (3 storage nodes, 2 sequencers, R=3) started
once per session through ``services.local_cluster`` in a temporary directory on free ports,
and stopped at the end; ``cluster_dir``, a directory for a test's own cluster, stopped after
the test if it still runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from seqlog_cluster_support import RunningCluster, start_cluster

from services import local_cluster as lc


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("seqlog-cluster"))
    try:
        yield cluster
    finally:
        lc.down(cluster.dir)


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    if lc.load_state(tmp_path) is not None:
        lc.down(tmp_path)
