"""A TLS listener that reports every failed handshake, with the peer's address.

``create_server(ssl=...)`` drops a connection whose handshake fails without a word (asyncio
logs it at debug level only), and a peer with the wrong CA never gets as far as a HELLO: the
data port must see those attempts to log and count them (``shared.net.node_auth``). So this
listener accepts sockets itself and runs each handshake through
``loop.connect_accepted_socket(ssl=context())``, which raises when the handshake fails or
overruns ``handshake_timeout_s``. ``context()`` is asked at every accept, so certificates
reloaded on SIGHUP apply to every new connection (``shared.tls``).

Handshakes under way are bounded by ``handshakes_max``: past it new sockets are closed at once
(a flood of half-open handshakes must not grow memory without bound); and by
``handshakes_per_address_max`` per client address, checked before any TLS work, so that one
flooding host cannot take every handshake slot (``shared.net.address_limit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from shared.net.address_limit import AddressLimit, peer_ip

log = logging.getLogger(__name__)

FailureFn = Callable[[str, BaseException], None]
"""``(peer address, error)`` of a failed handshake."""

BACKLOG = 1024
HANDSHAKES_MAX = 1024
ACCEPT_ERROR_PAUSE_S = 0.1
"""After an accept error (out of file descriptors, say), wait this long before the next."""


class TlsListener:
    """Listening socket + accept loop; the ``asyncio.Server`` subset ``shared.net.server``
    uses (``sockets``, ``close``, ``wait_closed``)."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.BaseProtocol],
                 context: Callable[[], ssl.SSLContext], *, handshake_timeout_s: float,
                 on_failure: FailureFn, handshakes_max: int = HANDSHAKES_MAX,
                 handshakes_per_address_max: int = 0,
                 on_address_full: Callable[[], None] | None = None) -> None:
        self.sockets = (sock,)
        self._sock = sock
        self._factory = factory
        self._context = context
        self._handshake_timeout_s = handshake_timeout_s
        self._on_failure = on_failure
        self._handshakes_max = handshakes_max
        self._handshakes: set[asyncio.Task[None]] = set()
        self.addresses = AddressLimit(handshakes_per_address_max, "TLS handshakes under way")
        self._on_address_full = on_address_full
        self._loop = asyncio.get_running_loop()
        self._accepting = self._loop.create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = self._loop
        while True:
            try:
                conn, address = await loop.sock_accept(self._sock)
            except OSError as exc:
                log.warning("accept failed: %r", exc)
                await asyncio.sleep(ACCEPT_ERROR_PAUSE_S)
                continue
            peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
            ip = peer_ip(address)
            if not self.addresses.acquire(ip):
                conn.close()
                if self._on_address_full is not None:
                    self._on_address_full()
                continue
            if len(self._handshakes) >= self._handshakes_max:
                conn.close()
                self.addresses.release(ip)
                self._on_failure(peer, OverflowError(
                    f"{self._handshakes_max} TLS handshakes already under way"))
                continue
            task = loop.create_task(self._handshake(conn, peer, ip))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, peer: str, ip: str) -> None:
        try:
            await self._loop.connect_accepted_socket(
                self._factory, conn, ssl=self._context(),
                ssl_handshake_timeout=self._handshake_timeout_s)
        except asyncio.CancelledError:
            conn.close()
            raise
        except (OSError, ssl.SSLError, ConnectionError, TimeoutError, EOFError) as exc:
            conn.close()
            self._on_failure(peer, exc)
        finally:
            self.addresses.release(ip)

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._accepting


async def start_tls_listener(host: str, port: int, factory: Callable[[], asyncio.BaseProtocol],
                             context: Callable[[], ssl.SSLContext], *,
                             handshake_timeout_s: float, on_failure: FailureFn,
                             handshakes_per_address_max: int = 0,
                             on_address_full: Callable[[], None] | None = None) -> TlsListener:
    """Listen on ``host:port`` (0: a free port) and serve TLS connections with ``factory``."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return TlsListener(sock, factory, context, handshake_timeout_s=handshake_timeout_s,
                       on_failure=on_failure,
                       handshakes_per_address_max=handshakes_per_address_max,
                       on_address_full=on_address_full)
