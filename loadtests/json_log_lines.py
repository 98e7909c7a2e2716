"""Realistic JSON log lines for benchmarks: what a fleet of web services writes.

Each line is one JSON object: an ISO-8601 timestamp that moves forward, a level (mostly
INFO), a service and host, request and trace ids (random hex: the part that does not
compress), the HTTP method, path (with ids in it), status, latency (log-normal), bytes, client
IP, user agent, a message, sometimes extra context, and on some errors a stack trace.
``size`` makes lines average about that many bytes (context fields are added until a line
reaches its target, drawn around ``size``; nothing is cut, so every line stays valid JSON).
Seeded: the same seed gives the same lines.

    from loadtests.json_log_lines import LogLineGenerator
    lines = LogLineGenerator(seed=1, size=1024).lines(10_000)

    .venv/bin/python -m loadtests.json_log_lines --count 5 --size 1024
    .venv/bin/python -m loadtests.json_log_lines --count 10000 --size 1024 --stats
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime

SERVICES = ["checkout", "cart", "catalog", "search", "payments", "auth", "users", "orders",
            "inventory", "shipping", "recommendations", "notifications"]
LEVELS = ["DEBUG", "INFO", "WARN", "ERROR"]
LEVEL_WEIGHTS = [12, 75, 9, 4]
METHODS = ["GET", "GET", "GET", "POST", "PUT", "DELETE", "PATCH"]
PATHS = ["/api/v1/orders/{id}", "/api/v1/orders", "/api/v1/users/{id}/cart",
         "/api/v1/catalog/items/{id}", "/api/v1/search", "/api/v2/payments/{id}/capture",
         "/api/v1/auth/token", "/api/v1/shipping/quotes", "/healthz", "/api/v1/inventory/{id}",
         "/api/v1/recommendations/{id}", "/static/js/app.{id}.js"]
STATUS_OK = [200, 200, 200, 200, 201, 204, 304]
STATUS_BAD = [400, 401, 403, 404, 409, 429]
STATUS_ERR = [500, 502, 503, 504]
USER_AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/130.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/18.0 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Mobile/15E148",
    "Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0",
    "okhttp/4.12.0", "python-requests/2.32.3", "Go-http-client/2.0", "curl/8.9.1",
    "kube-probe/1.31",
]
MESSAGES = {
    "DEBUG": ["cache lookup", "loaded feature flags", "query plan chosen",
              "retrying idempotent call", "connection reused from pool"],
    "INFO": ["request served", "order created", "payment authorized", "user signed in",
             "search completed", "item added to cart", "shipment quote computed"],
    "WARN": ["slow upstream response", "retrying after timeout", "cache miss storm",
             "rate limit close to threshold", "deprecated API version used"],
    "ERROR": ["upstream call failed", "database deadlock detected",
              "payment provider returned an error", "unhandled exception in handler",
              "circuit breaker open"],
}
EXCEPTIONS = ["TimeoutError: upstream did not answer within 2000 ms",
              "psycopg.errors.DeadlockDetected: deadlock detected",
              "KeyError: 'shipping_address'", "ConnectionResetError: [Errno 104] Connection "
              "reset by peer", "ValueError: invalid literal for int() with base 10: 'null'"]
FRAMES = ["app/handlers/{svc}.py", "app/services/{svc}_service.py", "app/db/session.py",
          "app/clients/http.py", "lib/retry.py", "app/middleware/tracing.py"]
FUNCS = ["handle", "process", "execute", "call", "_send", "commit", "wrapper", "dispatch"]
FLAGS = ["new_checkout", "fast_search", "dark_mode", "one_click", "ml_ranking_v3",
         "async_payments", "inventory_v2"]
REGIONS = ["eu-west-1", "us-east-1", "us-west-2", "ap-southeast-1"]


class LogLineGenerator:
    """Seeded generator of JSON log lines (bytes, UTF-8, no trailing newline)."""

    def __init__(self, seed: int = 0, size: int | None = None,
                 start_ms: int = 1_764_000_000_000) -> None:
        self._rng = random.Random(seed)
        self._size = size
        self._now_ms = start_ms
        self._hosts = {s: [f"{s}-{self._hex(5)}-{self._hex(5)}" for _ in range(4)]
                       for s in SERVICES}

    def _hex(self, chars: int) -> str:
        return f"{self._rng.getrandbits(chars * 4):0{chars}x}"

    def _ip(self) -> str:
        r = self._rng
        return f"10.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(1, 255)}"

    def record(self) -> dict[str, object]:
        """One log event as a dict (before padding to ``size``)."""
        r = self._rng
        self._now_ms += int(r.expovariate(1 / 3.0))  # ~300 events/s from this stream
        level = r.choices(LEVELS, LEVEL_WEIGHTS)[0]
        service = r.choice(SERVICES)
        if level == "ERROR":
            status = r.choice(STATUS_ERR)
        elif level == "WARN":
            status = r.choice(STATUS_BAD + STATUS_OK)
        else:
            status = r.choice(STATUS_OK)
        ts = datetime.fromtimestamp(self._now_ms / 1000, tz=UTC)
        event: dict[str, object] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self._now_ms % 1000:03d}Z",
            "level": level,
            "service": service,
            "host": r.choice(self._hosts[service]),
            "region": r.choice(REGIONS),
            "request_id": self._hex(32),
            "trace_id": self._hex(16),
            "method": r.choice(METHODS),
            "path": r.choice(PATHS).replace("{id}", str(r.randrange(1, 10_000_000))),
            "status": status,
            "latency_ms": round(r.lognormvariate(3.0, 1.0), 2),
            "bytes": int(r.lognormvariate(7.5, 1.2)),
            "client_ip": self._ip(),
            "user_agent": r.choice(USER_AGENTS),
            "msg": r.choice(MESSAGES[level]),
        }
        if level == "ERROR" and r.random() < 0.6:
            event["error"] = r.choice(EXCEPTIONS)
            event["stack"] = self._stack(service)
        return event

    def _stack(self, service: str) -> str:
        r = self._rng
        frames = ["Traceback (most recent call last):"]
        for _ in range(r.randrange(3, 9)):
            frames.append(f'  File "/srv/{r.choice(FRAMES).format(svc=service)}", '
                          f"line {r.randrange(10, 900)}, in {r.choice(FUNCS)}")
        return "\n".join(frames)

    def _pad(self, event: dict[str, object], target: int, length: int) -> None:
        """Adds realistic context until the line is about ``target`` bytes long."""
        r = self._rng
        n = 0
        while length < target:
            kind = n % 4
            if kind == 0:
                value: object = {"user_id": r.randrange(1, 5_000_000),
                                 "session": self._hex(24), "tenant": f"t-{r.randrange(400)}"}
            elif kind == 1:
                value = sorted(r.sample(FLAGS, r.randrange(1, len(FLAGS))))
            elif kind == 2:
                value = [{"sku": f"SKU-{r.randrange(100000):05d}", "qty": r.randrange(1, 5),
                          "price_cents": r.randrange(99, 99999)}
                         for _ in range(r.randrange(1, 4))]
            else:
                value = {"db_ms": round(r.lognormvariate(1.5, 0.8), 2),
                         "cache_hits": r.randrange(20), "upstream": r.choice(SERVICES),
                         "attempt": r.randrange(1, 3)}
            name = ("ctx", "flags", "items", "timings")[kind] + (str(n // 4) if n >= 4 else "")
            event[name] = value
            length += len(json.dumps({name: value})) - 1  # minus the braces, plus a comma
            n += 1

    def line(self) -> bytes:
        event = self.record()
        if self._size is not None:
            text = json.dumps(event, separators=(",", ":"))
            target = int(self._size * self._rng.uniform(0.7, 1.3))
            if len(text) < target:
                self._pad(event, target, len(text))
            return json.dumps(event, separators=(",", ":")).encode()
        return json.dumps(event, separators=(",", ":")).encode()

    def lines(self, count: int) -> list[bytes]:
        return [self.line() for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=10, help="lines to print")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=None,
                   help="average line size in bytes (default: the natural ~450 bytes)")
    p.add_argument("--stats", action="store_true",
                   help="print one JSON line of statistics (average size, compression ratios "
                        "of batches of --batch lines) instead of the lines")
    p.add_argument("--batch", type=int, default=1000, help="lines per batch for --stats")
    args = p.parse_args(argv)
    gen = LogLineGenerator(seed=args.seed, size=args.size)
    t0 = time.perf_counter()
    lines = gen.lines(args.count)
    elapsed = time.perf_counter() - t0
    if not args.stats:
        out = sys.stdout.buffer
        for line in lines:
            out.write(line + b"\n")
        return 0
    from shared.compression import Codec, compress_batch

    plain = sum(map(len, lines))
    stats: dict[str, object] = {"lines": len(lines), "avg_bytes": round(plain / len(lines), 1),
                                "generate_us_per_line": round(elapsed / len(lines) * 1e6, 2)}
    for codec in (Codec.LZ4, Codec.ZSTD):
        sent = 0
        for i in range(0, len(lines), args.batch):
            chunk = lines[i:i + args.batch]
            blob = compress_batch(chunk, codec)
            sent += len(blob) if blob is not None else sum(map(len, chunk))
        stats[f"ratio_{codec.name.lower()}"] = round(plain / sent, 2)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
