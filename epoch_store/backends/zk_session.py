"""One kazoo ZooKeeper client driven from an asyncio event loop.

kazoo is thread based: its own threads own the socket and run completion callbacks. Requests go
through kazoo's ``*_async`` calls, which only enqueue the request and wake kazoo's connection
thread, and the completion is handed back to the loop with ``call_soon_threadsafe``. Nothing
here blocks the event loop; starting and stopping the client (which joins threads) runs on a
worker thread.

Connection state reaches the loop through a kazoo state listener and is kept in an
``asyncio.Event``: callers wait for a live connection (bounded by their deadline) before sending
anything, so that a request is not left queued inside kazoo while the server is unreachable.
kazoo reconnects by itself, forever, with a backoff capped at ``reconnect_delay_ms_max``; after a
session expiry it opens a new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState  # type: ignore[import-untyped]
from kazoo.exceptions import (  # type: ignore[import-untyped]
    ConnectionClosedError,
    ConnectionLoss,
    SessionExpiredError,
)
from kazoo.retry import KazooRetry  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)
KAZOO_LOGGER = logging.getLogger(__name__ + ".kazoo")
"""Where kazoo's own messages go. It warns on every failed reconnect attempt (twice a second
while ZooKeeper is down); the transitions that matter are logged by ``ZkSession`` itself, so
kazoo's are kept to errors unless someone lowers this logger's level."""
KAZOO_LOGGER.setLevel(logging.ERROR)

CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    ConnectionLoss, SessionExpiredError, ConnectionClosedError,
)
"""Failures after which a request's outcome is unknown: it may or may not have been applied."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ZkOptions:
    """How the ZooKeeper backend talks to the ensemble."""

    session_timeout_ms: int = 10_000
    """Requested session timeout (the server clamps it to 2..20 ticks)."""
    op_timeout_ms: int = 4_000
    """Longest one backend operation may take, waiting for a connection included."""
    reconnect_delay_ms_max: int = 500
    """Cap of kazoo's reconnect backoff, so service resumes soon after the ensemble does."""
    requests_inflight_max: int = 1024
    """Requests handed to kazoo and not yet answered; further callers wait."""
    tls_ca_file: str = ""
    """TLS to ZooKeeper's secure client port when set: the CA that signed its certificate
    (the node's ``tls.zookeeper``; kazoo reads the files at every connect)."""
    tls_cert_file: str = ""
    """Our client certificate for ZooKeeper (optional), with ``tls_key_file``."""
    tls_key_file: str = ""

    def __post_init__(self) -> None:
        # Settings may come from a URL typed by an operator: ValueError, not assert.
        for name, low, high in (("session_timeout_ms", 1_000, 600_000),
                                ("op_timeout_ms", 1, 600_000),
                                ("reconnect_delay_ms_max", 10, 60_000),
                                ("requests_inflight_max", 1, 100_000)):
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")


class ZkSession:
    """A lazily started kazoo client bound to the event loop of its first use."""

    def __init__(self, hosts: str, options: ZkOptions) -> None:
        self.hosts = hosts
        self.options = options
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = asyncio.Event()
        self._inflight = asyncio.Semaphore(options.requests_inflight_max)
        self._closed = False
        self.connections_lost_count = 0
        """Times the connection dropped (SUSPENDED) or the session was lost (LOST)."""

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """The current ZooKeeper session's id and password (for diagnostics and tests)."""
        if self._client is None or self._client.client_id is None:
            return None
        session_id, password = self._client.client_id
        return int(session_id), bytes(password)

    async def wait_connected(self, deadline_s: float) -> bool:
        """Start the client if needed; True once it is connected, False if the deadline (loop
        time) passes first or the session is closed."""
        if self._closed:
            return False
        if self._client is None:
            await self._start()
        if self._connected.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline_s):
                await self._connected.wait()
        return self._connected.is_set() and not self._closed

    async def call(self, request: Callable[[Any], Any], deadline_s: float) -> Any:
        """Run ``request(kazoo_client)``, which must return a kazoo async result, and return
        its value. Raises kazoo's exception, or ``TimeoutError`` at the deadline (the request
        may still be applied later)."""
        assert self._client is not None and self._loop is not None, "call wait_connected first"
        async with asyncio.timeout_at(deadline_s), self._inflight:
            future: asyncio.Future[Any] = self._loop.create_future()
            async_result = request(self._client)
            async_result.rawlink(lambda result: self._complete(future, result))
            return await future

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._connected.clear()
        client, self._client = self._client, None
        if client is not None:
            client.remove_listener(self._on_state_thread)
            await asyncio.to_thread(_stop_client, client)

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_jitter=0.2,
                           max_delay=self.options.reconnect_delay_ms_max / 1000)
        options = self.options
        tls: dict[str, object] = {}
        if options.tls_ca_file:
            tls = {"use_ssl": True, "verify_certs": True, "ca": options.tls_ca_file,
                   "certfile": options.tls_cert_file or None,
                   "keyfile": options.tls_key_file or None}
        client = KazooClient(hosts=self.hosts, timeout=options.session_timeout_ms / 1000,
                             connection_retry=retry,
                             command_retry=KazooRetry(max_tries=0), logger=KAZOO_LOGGER, **tls)
        client.add_listener(self._on_state_thread)
        # Set before the first await so that concurrent callers do not start a second client.
        self._client = client
        # start_async returns at once (kazoo keeps connecting in its own thread), but it first
        # joins any previous connection thread, so it runs off the loop.
        await asyncio.to_thread(client.start_async)

    def _on_state_thread(self, state: str) -> None:
        """kazoo state listener: runs on kazoo's connection thread and must not block."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._on_state, state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED and not self._closed:
            self._connected.set()
            logger.info("connected to ZooKeeper %s", self.hosts)
        else:
            if self._connected.is_set():
                self.connections_lost_count += 1
                logger.warning("ZooKeeper connection %s: %s", state.lower(), self.hosts)
            self._connected.clear()

    def _complete(self, future: asyncio.Future[Any], async_result: Any) -> None:
        """kazoo completion callback (a kazoo thread): hand the outcome to the loop."""
        loop = self._loop
        assert loop is not None
        try:
            value, error = async_result.get(block=False), None
        except Exception as exc:  # kazoo reports every failure as an exception
            value, error = None, exc
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_deliver, future, value, error)


def _deliver(future: asyncio.Future[Any], value: Any, error: Exception | None) -> None:
    if future.done():  # the caller timed out or was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _stop_client(client: Any) -> None:
    try:
        client.stop()
    finally:
        client.close()
