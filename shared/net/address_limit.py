"""Connections per client address on the data port (``LimitsConfig.data_connections_per_ip_max``,
docs/SECURITY.md): one flooding host must not take the node's connection slots, nor, with
TLS, its handshake slots, from the other clients and nodes.

The data port counts each address twice over, with one ``AddressLimit`` each: TLS handshakes
under way (``shared.net.tls_listener``, checked at accept, before any handshake work) and
established connections (``shared.net.server``, checked before HELLO). A refused socket is
closed at once and counted in ``refused_count``; the warning is logged at most once per
``LOG_INTERVAL_S`` so that a flood does not flood the log too. A connection whose peer proved
it is a node of the cluster gives its slot back: its address cannot be starved by a client
sharing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 1.0


def peer_ip(peername: object) -> str:
    """The address part of a ``getpeername()`` answer ("" when there is none, e.g. a Unix
    socket: those share one count)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return ""


class AddressLimit:
    """Counts per address up to ``per_address_max`` (0: no bound)."""

    __slots__ = ("_clock", "_counts", "_last_log_s", "_what", "per_address_max",
                 "refused_count")

    def __init__(self, per_address_max: int, what: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_address_max = per_address_max
        self._what = what
        self._clock = clock
        self._counts: dict[str, int] = {}
        self._last_log_s = -LOG_INTERVAL_S
        self.refused_count = 0

    def acquire(self, ip: str) -> bool:
        """Takes a slot for ``ip``; False (counted, maybe logged) when it holds them all."""
        count = self._counts.get(ip, 0)
        if self.per_address_max and count >= self.per_address_max:
            self.refused_count += 1
            now_s = self._clock()
            if now_s - self._last_log_s >= LOG_INTERVAL_S:
                self._last_log_s = now_s
                log.warning("refusing a connection from %s: %d %s from that address already "
                            "(data_connections_per_ip_max; %d refused so far)", ip or "?",
                            count, self._what, self.refused_count)
            return False
        self._counts[ip] = count + 1
        return True

    def release(self, ip: str) -> None:
        count = self._counts.get(ip, 0) - 1
        if count > 0:
            self._counts[ip] = count
        else:
            self._counts.pop(ip, None)

    def count(self, ip: str) -> int:
        return self._counts.get(ip, 0)
