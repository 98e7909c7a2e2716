"""Prometheus instruments of the HTTP API edge, registered in the registry the caller passes.

Labels are bounded: ``route`` is the route's template (``/v1/logs/{log_id}/append``) or
``unmatched``, ``method`` is one of the methods the API knows or ``OTHER``, ``code`` is the HTTP
status code. Durations are in seconds, the Prometheus base unit (the metric name says so).

Per request the edge only bumps plain Python counters (no locks, no label lookups): the
prometheus-client instruments cost several microseconds of locking per request, a visible share
of a node's CPU under load. A collector turns the counts into the same metric families
(``seqlog_http_requests_total``, the ``seqlog_http_request_duration_seconds`` histogram and the
``seqlog_http_requests_in_flight`` gauge) when ``/metrics`` is scraped. All of it runs on the
event loop's thread, so no lock is needed.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

UNMATCHED_ROUTE = "unmatched"
KNOWN_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"})

# Appends wait for R storage nodes and reads may long-poll up to a minute.
_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)


_BUCKET_LABELS: tuple[str, ...] = (*(repr(b) for b in _DURATION_BUCKETS_S), "+Inf")
"""The ``le`` label of each bucket, as prometheus-client writes them (Go's float format, which
is Python's ``repr`` for these values)."""

CHILDREN_CACHED_MAX = 1024
"""Label sets (route, method, code) counted separately at most; past it, new label sets are
folded into the ``OTHER`` method of their route and code, so memory stays bounded."""


class _Series:
    """Counts of one label set: requests, histogram buckets (not cumulative) and the sum."""

    __slots__ = ("bucket_counts", "count", "created_s", "sum_s")

    def __init__(self) -> None:
        self.count = 0
        self.sum_s = 0.0
        # One slot per finite bucket plus the +Inf overflow.
        self.bucket_counts = [0] * (len(_DURATION_BUCKETS_S) + 1)
        self.created_s = time.time()


class HttpMetrics:
    """Request counters, latency histograms and an in-flight gauge for one API app."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.in_flight = 0
        """HTTP requests being handled (the edge adds and subtracts one around each)."""
        self._series: dict[tuple[str, str, int], _Series] = {}
        registry.register(_HttpCollector(self))

    def observe(self, route: str, method: str, code: int, duration_s: float) -> None:
        series = self._series.get((route, method, code))
        if series is None:
            series = self._new_series(route, method, code)
        series.count += 1
        series.sum_s += duration_s
        series.bucket_counts[bisect.bisect_left(_DURATION_BUCKETS_S, duration_s)] += 1

    def _new_series(self, route: str, method: str, code: int) -> _Series:
        if method not in KNOWN_METHODS:
            method = "OTHER"
        key = (route, method, code)
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= CHILDREN_CACHED_MAX:
                key = (route, "OTHER", code)
                series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series()
        return series

    def families(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "seqlog_http_requests", "HTTP requests answered, by route, method and status code",
            labels=("route", "method", "code"))
        duration = HistogramMetricFamily(
            "seqlog_http_request_duration_seconds",
            "Time from receiving a request's headers to producing its answer",
            labels=("route", "method", "code"))
        for (route, method, code), series in list(self._series.items()):
            labels = [route, method, str(code)]
            requests.add_metric(labels, series.count, created=series.created_s)
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for label, count in zip(_BUCKET_LABELS, series.bucket_counts, strict=True):
                cumulative += count
                buckets.append((label, cumulative))
            duration.add_metric(labels, buckets, series.sum_s)
        yield requests
        yield duration
        yield GaugeMetricFamily("seqlog_http_requests_in_flight", "HTTP requests being handled",
                                value=self.in_flight)


class _HttpCollector(Collector):
    def __init__(self, metrics: HttpMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.families()
