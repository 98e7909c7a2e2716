"""Fixtures of the Spark tests: one real local cluster (3 storage nodes, 2 sequencers, R=3)
and one real local Spark session (local[2], bound to 127.0.0.1) shared by all of them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from services import local_cluster as lc
from spark_ingest import local_session
from tests.spark.support import SparkCluster

READY_TIMEOUT_MS = 60_000


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    root = tmp_path_factory.mktemp("seqlog-spark-cluster")
    spec = lc.LocalClusterSpec(dir=root, storage_nodes=3, sequencers=2, replication=3,
                               base_port=lc.free_base_port(5), fsync="never")
    try:
        state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
    except lc.LocalClusterError as exc:
        pytest.fail(f"local cluster did not start:\n{exc}", pytrace=False)
    try:
        yield SparkCluster(dir=root.resolve(), urls=state.sequencer_urls)
    finally:
        lc.down(root)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Loopback only, and workers on this interpreter (it has pyarrow), whatever the shell says.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = local_session("local[2]", conf={
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",  # quicker start-up
    })
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
