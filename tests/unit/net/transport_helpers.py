"""Shared helpers for the transport tests: a scriptable handler, message builders, polling."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared.config import TransportConfig
from shared.net import PeerPool, ReplyFn, Server, start_server
from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId
from shared.wire.codec import Message
from shared.wire.store import Store, Stored, payloads_checksum

FINGERPRINT = "fp-test"
SERVER_ID = NodeId("s1")
CLIENT_ID = NodeId("c1")
CONFIG = TransportConfig(connect_timeout_ms=2_000, reconnect_backoff_ms_max=100)


def store(lsn: int, payload: bytes = b"x") -> Store:
    payloads = (payload,)
    return Store(log_id=LogId(1), lsn=Lsn(lsn), wave=1, sequencer_node=CLIENT_ID,
                 copyset=(SERVER_ID,), timestamp_ms=0, last_known_good=Esn(0),
                 release_lsn=Lsn(0), timeout_ms=1000, key=None, payloads=payloads,
                 checksum=payloads_checksum(payloads))


def stored(lsn: int) -> Stored:
    return Stored(log_id=LogId(1), lsn=Lsn(lsn), wave=1, status=Status.OK,
                  sealed_epoch=Epoch(0), sealed_by=None)


@dataclass
class Handler:
    """Answers STORE with STORED at once, or holds the replies when ``hold`` is set."""

    hold: bool = False
    received: list[tuple[NodeId, Message]] = field(default_factory=list)
    held: list[tuple[Message, ReplyFn]] = field(default_factory=list)

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        self.received.append((peer, message))
        if self.hold:
            self.held.append((message, reply))
        elif isinstance(message, Store):
            reply(stored(message.lsn))

    def reply_held(self, *, reverse: bool = False) -> None:
        """Answer every held STORE (in reverse arrival order if asked) and forget them."""
        held = list(reversed(self.held)) if reverse else self.held
        self.held = []
        for message, reply in held:
            assert isinstance(message, Store)
            reply(stored(message.lsn))

    def store_lsns(self) -> list[int]:
        return [m.lsn for _, m in self.received if isinstance(m, Store)]


class Results:
    """Collects request callbacks' results, keyed by a label."""

    def __init__(self) -> None:
        self.by_key: dict[object, Message | Status] = {}

    def callback(self, key: object) -> Callable[[Message | Status], None]:
        def done(result: Message | Status) -> None:
            assert key not in self.by_key, f"second callback for {key!r}"
            self.by_key[key] = result

        return done


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.002)


async def serve(handler: Handler, port: int = 0, fingerprint: str = FINGERPRINT,
                config: TransportConfig = CONFIG) -> Server:
    return await start_server("127.0.0.1", port, node_id=SERVER_ID,
                              cluster_fingerprint=fingerprint, handler=handler, config=config)


def make_pool(port: int, fingerprint: str = FINGERPRINT,
              config: TransportConfig = CONFIG) -> PeerPool:
    def addresses(node: NodeId) -> tuple[str, int] | None:
        return ("127.0.0.1", port) if node == SERVER_ID else None

    return PeerPool(node_id=CLIENT_ID, cluster_fingerprint=fingerprint, config=config,
                    addresses=addresses)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ScriptedServer:
    """A hand-written peer for protocol violations: runs ``script`` for each connection and,
    on exit, waits (boundedly) for every script to finish and its socket to close."""

    def __init__(self, script: Script) -> None:
        self._script = script
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._run, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=5)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
        await self._server.wait_closed()

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._script(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
