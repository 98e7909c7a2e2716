"""Real ZooKeeper servers for tests: a standalone server and a 3-node ensemble on loopback.

ZooKeeper is installed by the test command (``scripts/bootstrap.sh``), so a server that cannot
start fails the test with the server's log; it never skips.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from epoch_store import zk_server
from epoch_store.zk_server import Peer, ServerHandle

READY_TIMEOUT_MS = 30_000
ENSEMBLE_TICK_MS = 200
"""Short ticks so that a new leader is elected within about a second of the old one's death."""


def unique_root() -> str:
    """A fresh znode root, so that tests sharing a server never see each other's logs."""
    return f"/test-{uuid.uuid4().hex[:12]}"


def start_standalone(directory: Path, *, client_port: int | None = None) -> ServerHandle:
    try:
        return zk_server.start_standalone(directory, client_port=client_port, tick_ms=200,
                                          ready_timeout_ms=READY_TIMEOUT_MS)
    except zk_server.ZooKeeperServerError as exc:
        pytest.fail(f"ZooKeeper did not start:\n{exc}", pytrace=False)


def start_ensemble(directory: Path, size: int = 3) -> list[ServerHandle]:
    """``size`` servers forming one ensemble; returns once every one of them serves."""
    ports = zk_server.free_ports(3 * size)
    peers = tuple(Peer(server_id=i + 1, client_port=ports[3 * i], quorum_port=ports[3 * i + 1],
                       election_port=ports[3 * i + 2]) for i in range(size))
    handles: list[ServerHandle] = []
    try:
        for peer in peers:
            member_dir = directory / f"zk{peer.server_id}"
            zk_server.write_config(member_dir, peer.client_port, tick_ms=ENSEMBLE_TICK_MS,
                                   me=peer.server_id, peers=peers)
            handles.append(zk_server.launch(member_dir, peer.client_port, quorum=True))
        for handle in handles:
            zk_server.wait_serving(handle, timeout_ms=READY_TIMEOUT_MS)
    except zk_server.ZooKeeperServerError as exc:
        stop_all(handles)
        pytest.fail(f"ZooKeeper ensemble did not start:\n{exc}", pytrace=False)
    return handles


def leader(handles: list[ServerHandle]) -> ServerHandle | None:
    for handle in handles:
        if zk_server.server_mode(handle.client_port) == "leader":
            return handle
    return None


def hosts(handles: list[ServerHandle]) -> str:
    return ",".join(h.address for h in handles)


def stop_all(handles: list[ServerHandle]) -> None:
    for handle in handles:
        zk_server.stop(handle, kill=True)
