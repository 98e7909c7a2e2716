"""``services.ops_metrics``: the epoch store's CAS conflicts and ambiguous writes and the
ZooKeeper session's lost connections are exported from the store's own counters (0 where a
store has none), and a storage node's file system free and total bytes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest

from services.ops_metrics import OpsCollector


def _scrape(store: object, storage_dir: str | None) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(OpsCollector(cast(Any, store), None, storage_dir))
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_zookeeper_store_counters_are_exported(tmp_path: Path) -> None:
    store = SimpleNamespace(cas_conflicts_count=4, zk=SimpleNamespace(
        ambiguous_writes_count=2, session=SimpleNamespace(connections_lost_count=3)))
    samples = _scrape(store, str(tmp_path))
    assert samples["seqlog_epoch_store_cas_conflicts_total"] == 4
    assert samples["seqlog_epoch_store_ambiguous_writes_total"] == 2
    assert samples["seqlog_zookeeper_connections_lost_total"] == 3
    assert 0 < samples["seqlog_storage_fs_free_bytes"] <= samples["seqlog_storage_fs_size_bytes"]


def test_a_store_without_them_exports_zeros() -> None:
    samples = _scrape(SimpleNamespace(cas_conflicts_count=1), None)
    assert samples["seqlog_epoch_store_cas_conflicts_total"] == 1
    assert samples["seqlog_epoch_store_ambiguous_writes_total"] == 0
    assert samples["seqlog_zookeeper_connections_lost_total"] == 0
    assert "seqlog_storage_fs_free_bytes" not in samples
