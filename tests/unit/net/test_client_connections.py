"""Client readers on the node transport: a peer named ``client.*`` may read, and a connection
that tries anything else is closed before the handler sees it; no node may take the name."""

from __future__ import annotations

import pytest

from shared.config import NodeConfig
from shared.net import PeerPool
from shared.status import Status
from shared.types import LogId, Lsn, NodeId
from shared.wire.read import Read
from tests.unit.net.transport_helpers import CONFIG, FINGERPRINT, SERVER_ID, Handler, serve, store


def client_pool(port: int) -> PeerPool:
    def addresses(node: NodeId) -> tuple[str, int] | None:
        return ("127.0.0.1", port) if node == SERVER_ID else None

    return PeerPool(node_id=NodeId("client.reader-1"), cluster_fingerprint=FINGERPRINT,
                    config=CONFIG, addresses=addresses)


READ = Read(log_id=LogId(1), from_lsn=Lsn(1), until_lsn=Lsn(10), release_lsn=Lsn(0),
            records_max=10, bytes_max=1000)


async def test_client_may_read_but_not_store() -> None:
    handler = Handler()
    server = await serve(handler)
    pool = client_pool(server.port)
    try:
        # The handler does not answer READs; the request reaching it is what counts.
        assert await pool.call(SERVER_ID, READ, 300) is Status.TIMEDOUT
        assert [type(m) for _, m in handler.received] == [Read]
        assert handler.received[0][0] == "client.reader-1"
        answer = await pool.call(SERVER_ID, store(1), 2_000)
        assert answer is Status.PEER_CLOSED, answer
        assert [type(m) for _, m in handler.received] == [Read]
    finally:
        await pool.close()
        await server.close()


def test_no_node_may_use_the_client_prefix() -> None:
    with pytest.raises(ValueError, match="reserved for client readers"):
        NodeConfig(node_id=NodeId("client.n1"), roles=("storage",))
