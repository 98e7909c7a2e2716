"""``AddressLimit``: the per-address count behind ``limits.data_connections_per_ip_max``."""

from __future__ import annotations

import logging

import pytest

from shared.net.address_limit import AddressLimit, peer_ip


def test_an_address_holds_at_most_its_bound_and_others_are_unaffected() -> None:
    limit = AddressLimit(2, "connections")
    assert limit.acquire("10.0.0.1") and limit.acquire("10.0.0.1")
    assert not limit.acquire("10.0.0.1")
    assert limit.acquire("10.0.0.2")
    assert limit.refused_count == 1
    limit.release("10.0.0.1")
    assert limit.acquire("10.0.0.1")
    for _ in range(3):
        limit.release("10.0.0.1")
    assert limit.count("10.0.0.1") == 0 and limit.acquire("10.0.0.1")


def test_zero_means_no_bound() -> None:
    limit = AddressLimit(0, "connections")
    assert all(limit.acquire("a") for _ in range(10_000))
    assert limit.refused_count == 0


def test_a_flood_logs_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    limit = AddressLimit(1, "connections", clock=lambda: now[0])
    assert limit.acquire("a")
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            assert not limit.acquire("a")
        now[0] += 1.5
        assert not limit.acquire("a")
    assert len(caplog.records) == 2 and limit.refused_count == 1001


def test_peer_ip() -> None:
    assert peer_ip(("127.0.0.2", 5555)) == "127.0.0.2"
    assert peer_ip(("::1", 5555, 0, 0)) == "::1"
    assert peer_ip(None) == "" and peer_ip("") == ""
