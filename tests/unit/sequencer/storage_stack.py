"""Real storage nodes behind real TCP servers in one process, and a PeerPool that reaches
them: the storage side for tests of the sequencer's driver code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from shared.config import StorageConfig, TransportConfig
from shared.net.pool import PeerPool
from shared.net.server import Server, start_server
from shared.types import NodeId
from storage_node.runtime import StorageNode


@dataclass
class StorageStack:
    nodes: list[StorageNode]
    servers: dict[NodeId, Server]
    ports: dict[NodeId, int]
    pool: PeerPool


@asynccontextmanager
async def storage_stack(root: Path, node_ids: tuple[NodeId, ...]) -> AsyncIterator[StorageStack]:
    transport = TransportConfig(connect_timeout_ms=500, reconnect_backoff_ms_max=100)
    nodes: list[StorageNode] = []
    servers: dict[NodeId, Server] = {}
    ports: dict[NodeId, int] = {}
    try:
        for node_id in node_ids:
            node = StorageNode(node_id=node_id, data_dir=str(root / node_id),
                               config=StorageConfig(fsync="never"))
            await node.start()
            nodes.append(node)
            server = await start_server("127.0.0.1", 0, node_id=node_id,
                                        cluster_fingerprint="t", handler=node, config=transport)
            servers[node_id] = server
            ports[node_id] = server.port
        pool = PeerPool(node_id=NodeId("seq"), cluster_fingerprint="t", config=transport,
                        addresses=lambda n: ("127.0.0.1", ports[n]) if n in ports else None)
        try:
            yield StorageStack(nodes, servers, ports, pool)
        finally:
            await pool.close()
    finally:
        for server in servers.values():
            await server.close()
        for node in nodes:
            await node.close()
