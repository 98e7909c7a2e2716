"""Free TCP ports for local clusters and test servers, chosen below the kernel's ephemeral
range: a port inside it may be taken by any outgoing connection while a node or ZooKeeper
restarts, and the restarted server could then not bind it again."""

from __future__ import annotations

import random
import socket

_FALLBACK_RANGE = (20_000, 30_000)
_LOW_PORT = 10_000


def _candidate_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            first, last = (int(v) for v in file.read().split())
    except (OSError, ValueError):
        return _FALLBACK_RANGE
    if first - _LOW_PORT >= 2_000:
        return _LOW_PORT, first
    return last + 1, 65_000


def busy_ports(host: str, ports: list[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers do not count.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def free_port_block(count: int, *, host: str = "127.0.0.1", seed: int | None = None,
                    attempts: int = 100) -> int:
    """The first of ``count`` consecutive ports, all free right now (even first port)."""
    rng = random.Random(seed)
    low, high = _candidate_range()
    for _ in range(attempts):
        base = rng.randrange(low, high - count, 2)
        if not busy_ports(host, list(range(base, base + count))):
            return base
    raise OSError(f"no {count} consecutive free ports found in {low}..{high}")
