"""Prometheus instruments of the HTTP API edge, registered in the registry the caller passes.

Labels are bounded: ``route`` is the route's template (``/v1/logs/{log_id}/append``) or
``unmatched``, ``method`` is one of the methods the API knows or ``OTHER``, ``code`` is the HTTP
status code. Durations are in seconds, the Prometheus base unit (the metric name says so).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

UNMATCHED_ROUTE = "unmatched"
KNOWN_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"})

# Appends wait for R storage nodes and reads may long-poll up to a minute.
_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)


CHILDREN_CACHED_MAX = 1024


class HttpMetrics:
    """Request counters, latency histograms and an in-flight gauge for one API app."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "seqlog_http_requests",
            "HTTP requests answered, by route, method and status code",
            ("route", "method", "code"),
            registry=registry,
        )
        self.duration = Histogram(
            "seqlog_http_request_duration_seconds",
            "Time from receiving a request's headers to producing its answer",
            ("route", "method", "code"),
            buckets=_DURATION_BUCKETS_S,
            registry=registry,
        )
        self.in_flight = Gauge(
            "seqlog_http_requests_in_flight",
            "HTTP requests being handled",
            registry=registry,
        )
        # Label lookups take a lock and hash the labels: done once per label set, not per
        # request. Bounded: routes are the app's templates, methods and codes are few.
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, route: str, method: str, code: int, duration_s: float) -> None:
        children = self._children.get((route, method, code))
        if children is None:
            method_label = method if method in KNOWN_METHODS else "OTHER"
            labels = (route, method_label, str(code))
            children = (self.requests.labels(*labels), self.duration.labels(*labels))
            if len(self._children) < CHILDREN_CACHED_MAX:
                self._children[(route, method, code)] = children
        children[0].inc()
        children[1].observe(duration_s)
