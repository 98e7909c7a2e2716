"""Prometheus instruments of the HTTP API edge, registered in the registry the caller passes.

Labels are bounded: ``route`` is the route's template (``/v1/logs/{log_id}/append``) or
``unmatched``, ``method`` is one of the methods the API knows or ``OTHER``, ``code`` is the HTTP
status code. Durations are in seconds, the Prometheus base unit (the metric name says so).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

UNMATCHED_ROUTE = "unmatched"
KNOWN_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"})

# Appends wait for R storage nodes and reads may long-poll up to a minute.
_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)


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

    def observe(self, route: str, method: str, code: int, duration_s: float) -> None:
        method_label = method if method in KNOWN_METHODS else "OTHER"
        code_label = str(code)
        self.requests.labels(route, method_label, code_label).inc()
        self.duration.labels(route, method_label, code_label).observe(duration_s)
