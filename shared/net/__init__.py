"""Node-to-node asyncio transport: the only I/O in shared.

``start_server`` (server side, ``shared.net.server``) and ``PeerPool`` (client side,
``shared.net.pool``) exchange length-prefixed msgpack frames (``shared.wire``) over persistent
TCP connections, with correlation ids, bounded in-flight requests and coalesced writes.
"""

from shared.net.pool import PeerPool
from shared.net.server import Server, start_server
from shared.net.types import Counters, MessageHandler, ReplyFn, RequestCallback

__all__ = [
    "Counters",
    "MessageHandler",
    "PeerPool",
    "ReplyFn",
    "RequestCallback",
    "Server",
    "start_server",
]
