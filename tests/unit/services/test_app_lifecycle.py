"""services.app tears a node down one resource at a time: a failing step (the sequencer's
drain, the gossip farewell) must not skip the others, above all ``storage.close()``, which
drains the record store's writer, fsyncs and releases the data directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from gossip.runtime import GossipRuntime
from sequencer.runtime import SequencerRuntime
from services.app import create_app
from shared.config import ClusterConfig, NodeConfig, ProcessConfig
from shared.types import NodeId
from storage_node.runtime import StorageNode


def _config(tmp_path: Path) -> ProcessConfig:
    node = NodeConfig(node_id=NodeId("n1"), roles=("sequencer", "storage"))
    cluster = ClusterConfig(nodes=(node,), replication_factor=1)
    return ProcessConfig(node_id=NodeId("n1"), cluster=cluster,
                         data_dir=str(tmp_path / "n1"), epoch_store_dir=str(tmp_path / "epochs"))


@pytest.mark.parametrize("failing", ["drain", "farewell"])
async def test_a_failing_stop_step_still_closes_storage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    closed: list[str] = []
    original_close = StorageNode.close

    async def close(self: StorageNode) -> None:
        closed.append("storage")
        await original_close(self)

    async def broken(*_: object) -> None:
        raise RuntimeError(f"{failing} failed")

    monkeypatch.setattr(StorageNode, "close", close)
    if failing == "drain":
        monkeypatch.setattr(SequencerRuntime, "drain", broken)
    else:
        monkeypatch.setattr(GossipRuntime, "farewell", broken)
    config = _config(tmp_path)
    runner = web.AppRunner(create_app(config, drain_timeout_s=0.5))
    await runner.setup()
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        await runner.cleanup()
    assert closed == ["storage"]
    # The data directory was released (flock): another node can open it.
    again = StorageNode(node_id=NodeId("n1"), data_dir=config.data_dir, config=config.storage)
    await again.start()
    await again.close()
