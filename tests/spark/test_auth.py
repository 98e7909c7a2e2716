"""The Spark source against a cluster with client authentication on (docs/SECURITY.md): with
the ``token`` option a batch read returns what the client reads; without one the query fails
at planning with the node's UNAUTHENTICATED, and a token without ``read`` on the logs with
ACCESS."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from seqlog import Client
from services import local_cluster as lc
from services import token_cli
from shared.security.tokens import mint, parse_key_file
from tests.spark.support import SparkCluster, append_many, client_records, fresh_log

READY_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    root = tmp_path_factory.mktemp("seqlog-spark-secure")
    spec = lc.LocalClusterSpec(dir=root, storage_nodes=3, sequencers=1, replication=3,
                               base_port=lc.free_base_port(4), fsync="never",
                               auth=token_cli.write_local_auth(root))
    try:
        state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
    except lc.LocalClusterError as exc:
        pytest.fail(f"local cluster did not start:\n{exc}", pytrace=False)
    try:
        yield SparkCluster(dir=root.resolve(), urls=state.sequencer_urls)
    finally:
        lc.down(root)


def _token(cluster: SparkCluster, principal: str, scope: list[str]) -> str:
    keys = parse_key_file((cluster.dir / "auth" / "keys.txt").read_text())
    return mint(keys[0], principal, ttl_s=600, scope=scope)


def test_the_source_reads_with_its_token_and_is_refused_without(
        spark: SparkSession, secure_cluster: SparkCluster, monkeypatch: pytest.MonkeyPatch,
        ) -> None:
    monkeypatch.delenv("SEQLOG_TOKEN", raising=False)
    admin = token_cli.local_admin_token(secure_cluster.dir)
    log = fresh_log()

    async def write_and_read() -> list[tuple[int, bytes]]:
        async with Client(secure_cluster.urls, token=admin) as client:
            last = await append_many(client, log, 300)
            return [(r.lsn, r.payload) for r in await client_records(client, log, 1, last + 1)]

    expected = asyncio.run(write_and_read())
    assert len(expected) == 300

    def read(**options: str) -> list[tuple[int, bytes]]:
        frame = (spark.read.format("seqlog").option("urls", secure_cluster.urls_option)
                 .option("logs", str(log)).options(**options).load())
        return sorted((row.lsn, bytes(row.payload)) for row in frame.collect())

    reader = _token(secure_cluster, "spark-reader", [f"read:{log}"])
    assert read(token=reader) == expected
    with pytest.raises(Exception, match="UNAUTHENTICATED"):
        read()
    with pytest.raises(Exception, match="ACCESS"):
        read(token=_token(secure_cluster, "spark-writer", [f"append:{log}"]))

