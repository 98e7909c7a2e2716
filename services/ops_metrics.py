"""Metrics the dashboard and alert rules in ``k8s/monitoring/`` need beyond the roles' own
counters, read at scrape time (nothing is counted per request for them):

- the epoch store's lost compare-and-swap races (``cas_conflicts_count`` of the file and
  ZooKeeper stores), its writes whose reply was lost and whose outcome was settled by
  re-reading (ZooKeeper), and the ZooKeeper session's dropped connections and lost sessions.
  Every node exports all three (0 where the store has no such thing), so that one dashboard
  and one set of rules fit every deployment;
- the sequencers' release lag (LSNs handed out and not yet released, summed over the logs this
  node sequences, and the largest of one log), the age of the oldest append still in a window
  (a log that stops releasing shows here first), and sliding-window capacity (for the window
  occupancy panel: appends in flight over capacity);
- the free and total bytes of a storage node's data file system (``os.statvfs`` at scrape), so
  that "disk nearly full" fires before the node refuses stores at ``disk_free_bytes_min``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sequencer.runtime import SequencerRuntime
from shared.ports import EpochStore
from shared.types import compose_lsn


def _count(owner: object, *path: str) -> int:
    """``owner.a.b`` as an int, 0 when the store has no such counter."""
    value: object = owner
    for name in path:
        value = getattr(value, name, None)
        if value is None:
            return 0
    return value if isinstance(value, int) else 0


class OpsCollector(Collector):
    def __init__(self, epoch_store: EpochStore, sequencer: SequencerRuntime | None,
                 storage_dir: str | None) -> None:
        self.epoch_store = epoch_store
        self.sequencer = sequencer
        self.storage_dir = storage_dir

    def collect(self) -> Iterator[Metric]:
        store = self.epoch_store
        yield CounterMetricFamily(
            "seqlog_epoch_store_cas_conflicts", "epoch store compare-and-swap races lost "
            "(each retried, or answered AGAIN)", value=_count(store, "cas_conflicts_count"))
        yield CounterMetricFamily(
            "seqlog_epoch_store_ambiguous_writes", "epoch store writes whose reply was lost and "
            "whose outcome was settled by re-reading (ZooKeeper)",
            value=_count(store, "zk", "ambiguous_writes_count"))
        yield CounterMetricFamily(
            "seqlog_zookeeper_connections_lost", "times the ZooKeeper connection dropped or "
            "the session was lost", value=_count(store, "zk", "session",
                                                  "connections_lost_count"))
        if self.storage_dir is not None:
            try:
                fs = os.statvfs(self.storage_dir)
            except OSError:
                pass
            else:
                yield GaugeMetricFamily("seqlog_storage_fs_free_bytes", "bytes free for this "
                                        "storage node on its data file system",
                                        value=fs.f_bavail * fs.f_frsize)
                yield GaugeMetricFamily("seqlog_storage_fs_size_bytes", "size of this storage "
                                        "node's data file system", value=fs.f_blocks * fs.f_frsize)
        if self.sequencer is None:
            return
        unreleased = 0
        unreleased_max = 0
        oldest_ms: int | None = None
        for sequencer in self.sequencer.sequencers.values():
            # Appenders are kept in LSN order: the first is the oldest in flight.
            first = next(iter(sequencer.appenders.values()), None)
            if first is not None and (oldest_ms is None or first.timestamp_ms < oldest_ms):
                oldest_ms = first.timestamp_ms
            window = sequencer.window
            if window is None:
                continue
            lag = max(0, compose_lsn(sequencer.epoch, window.next_esn) - 1
                      - sequencer.release_lsn)
            # A new epoch's first LSNs sit above a release point of the previous epoch
            # until recovery releases them: count only the current epoch's span.
            lag = min(lag, window.next_esn - 1)
            unreleased += lag
            unreleased_max = max(unreleased_max, lag)
        yield GaugeMetricFamily(
            "seqlog_sequencer_unreleased_records", "LSNs handed out by this node's sequencers "
            "and not yet released (release lag), summed over its logs", value=unreleased)
        yield GaugeMetricFamily(
            "seqlog_sequencer_unreleased_records_max", "the largest release lag of one log "
            "sequenced here, in LSNs", value=unreleased_max)
        yield GaugeMetricFamily(
            "seqlog_sequencer_oldest_append_age_seconds", "how long the oldest append in flight "
            "on this node's sequencers has waited for its copies (0: none in flight)",
            value=0.0 if oldest_ms is None else max(0.0, time.time() - oldest_ms / 1000))
        yield GaugeMetricFamily(
            "seqlog_sequencer_window_capacity", "appends the sliding windows of this node's "
            "active logs can hold in flight (window_appends_max per log)",
            value=self.sequencer.config.window_appends_max * len(self.sequencer.sequencers))
