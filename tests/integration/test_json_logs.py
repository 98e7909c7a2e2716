"""``SEQLOG_LOG_FORMAT=json`` on real node processes (``--log-format json``): every line of a
node's log is a JSON object with its node id, and the sequencer's lines about a log carry the
log id and epoch as fields."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest
from seqlog_cluster_support import start_cluster

from seqlog import Client

pytestmark = pytest.mark.integration


async def test_nodes_log_json_lines_with_log_fields(cluster_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQLOG_LOG_FORMAT", "json")  # the nodes inherit it
    cluster = await asyncio.to_thread(start_cluster, cluster_dir, storage_nodes=3,
                                      sequencers=1)
    log_id = int.from_bytes(os.urandom(3), "big") + 9_000_000
    async with Client(cluster.sequencer_urls) as client:
        written = await client.append(log_id, b"logged")
    assert written.lsn > 0
    docs = []
    for node in cluster.state.nodes:
        lines = (cluster.dir / node.node_id / "node.log").read_text().splitlines()
        assert lines, node.node_id
        for line in lines:
            doc = orjson.loads(line)
            assert doc["node_id"] == node.node_id and doc["level"] and doc["message"], line
            docs.append(doc)
    active = [d for d in docs if d.get("log_id") == log_id and "sequencer active" in d["message"]]
    assert active and active[0]["epoch"] >= 1, [d for d in docs if d.get("log_id") == log_id]
