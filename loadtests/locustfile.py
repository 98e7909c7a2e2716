"""Locust traffic profiles for a Seqlog cluster (msgpack over FastHttpUser).

User classes: ``Producer`` (single appends), ``BatchProducer`` (append-batch),
``TailingConsumer`` (long-poll reads that continue from ``next_lsn``), ``CatchUpReader``
(paged reads from the start of a log) and ``Inspector`` (tail and find-time calls). Logs
are picked with a Zipf popularity; record sizes come from a configurable distribution.

Self-contained on purpose (stdlib, msgpack and locust only) so that ``locust -f`` works from
any directory and in ``--processes`` workers. Settings are Locust custom arguments, each
defaulting to a ``SEQLOG_LT_*`` environment variable; ``loadtests/run_locust.py`` drives it.

With ``SEQLOG_TOKEN`` set, every request carries it as a bearer token (docs/SECURITY.md);
401 and 403 answers are failures.

Outcome accounting follows API.md: a 429 ``SEQNOBUFS`` is backpressure and is reported as a
success under its own name (``append [429 backpressure]``) so that it never counts as a
crash nor pollutes the append latency; 503s are failures ("nothing written"), 504/500 are
failures whose outcome is unknown.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import random
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import msgpack
from locust import FastHttpUser, between, constant_throughput, events, task
from locust.argument_parser import LocustArgumentParser
from locust.contrib.fasthttp import ResponseContextManager
from locust.env import Environment

MSGPACK = "application/msgpack"
AUTH_HEADERS = ({"Authorization": f"Bearer {os.environ['SEQLOG_TOKEN']}"}
                if os.environ.get("SEQLOG_TOKEN") else {})
"""A cluster with auth on (docs/SECURITY.md): every user sends ``SEQLOG_TOKEN``."""
HEADERS = {"Content-Type": MSGPACK, "Accept": MSGPACK, **AUTH_HEADERS}
SEQUENCER_HEADER = "X-Seqlog-Sequencer"
FIND_TIME_PATH = "/v1/logs/{log_id}/find-time"
DISCOVERY_TIMEOUT_S = 10.0
PAYLOAD_POOL_BYTES = 4 << 20
"""Payloads are slices of one random buffer: generating bytes per request would make the
load generator, not Seqlog, the bottleneck."""
RECORD_MAX_BYTES = 1 << 20
BACKPRESSURE_SUFFIX = " [429 backpressure]"
NO_LOG_SUFFIX = " [404 no such log]"
ALL_STATUSES = frozenset(range(100, 600))
READER_DRAWS_MAX = 8
RETRY_PAUSE_S = 0.2


# -- settings ------------------------------------------------------------------------------


def _add_arguments(parser: LocustArgumentParser) -> None:
    def env(name: str, default: str) -> str:
        return os.environ.get(f"SEQLOG_LT_{name}", default)

    group = parser.add_argument_group("seqlog")
    group.add_argument("--seqlog-logs", type=int, default=int(env("LOGS", "100")),
                       help="number of logs written and read")
    group.add_argument("--seqlog-log-base", type=int, default=int(env("LOG_BASE", "1000")),
                       help="first log id; logs are BASE .. BASE+LOGS-1")
    group.add_argument("--seqlog-zipf-s", type=float, default=float(env("ZIPF_S", "1.1")),
                       help="Zipf exponent of log popularity (0 = uniform)")
    group.add_argument("--seqlog-record-size", default=env("RECORD_SIZE", "lognormal:512:1.0"),
                       help="record size distribution: fixed:N | uniform:LO:HI | "
                            "lognormal:MEDIAN:SIGMA | choice:A,B,C (bytes)")
    group.add_argument("--seqlog-batch-records", type=int,
                       default=int(env("BATCH_RECORDS", "16")), help="records per append-batch")
    group.add_argument("--seqlog-producer-rate", type=float,
                       default=float(env("PRODUCER_RATE", "10")),
                       help="appends (or batches) per second per producer user; 0 = no pause")
    group.add_argument("--seqlog-wait-ms", type=int, default=int(env("WAIT_MS", "1000")),
                       help="long-poll wait of tailing consumers")
    group.add_argument("--seqlog-page-records", type=int,
                       default=int(env("PAGE_RECORDS", "500")), help="catch-up page size")


@dataclass(slots=True)
class Settings:
    logs: int = 100
    log_base: int = 1000
    zipf_s: float = 1.1
    record_size: str = "lognormal:512:1.0"
    batch_records: int = 16
    producer_rate: float = 10.0
    wait_ms: int = 1000
    page_records: int = 500


def size_sampler(spec: str, rng: random.Random) -> Callable[[], int]:
    """A function drawing record sizes (bytes, clamped to 1 .. 1 MiB) from ``spec``."""
    kind, _, rest = spec.partition(":")
    parts = [p for p in rest.replace(",", ":").split(":") if p]
    try:
        if kind == "fixed" and len(parts) == 1:
            size = int(parts[0])
            draw: Callable[[], float] = lambda: size  # noqa: E731
        elif kind == "uniform" and len(parts) == 2:
            lo, hi = int(parts[0]), int(parts[1])
            draw = lambda: rng.randint(lo, hi)  # noqa: E731
        elif kind == "lognormal" and len(parts) == 2:
            median, sigma = float(parts[0]), float(parts[1])
            mu = math.log(median)
            draw = lambda: rng.lognormvariate(mu, sigma)  # noqa: E731
        elif kind == "choice" and parts:
            sizes = [int(p) for p in parts]
            draw = lambda: rng.choice(sizes)  # noqa: E731
        else:
            raise ValueError(spec)
    except ValueError:
        raise ValueError(f"bad record size distribution {spec!r}") from None
    return lambda: max(1, min(RECORD_MAX_BYTES, int(draw())))


class Zipf:
    """Draws indexes ``0 .. n-1`` with probability proportional to ``1 / (i + 1) ** s``."""

    def __init__(self, n: int, s: float) -> None:
        weights = [1.0 / (i + 1) ** s for i in range(max(1, n))]
        self._cumulative = list(itertools.accumulate(weights))

    def draw(self, rng: random.Random) -> int:
        point = rng.random() * self._cumulative[-1]
        return min(bisect.bisect_right(self._cumulative, point), len(self._cumulative) - 1)


# -- shared per-process state ----------------------------------------------------------------


@dataclass(slots=True)
class ClusterView:
    """What every user of this Locust process knows about the cluster."""

    settings: Settings = field(default_factory=Settings)
    sequencer_urls: dict[str, str] = field(default_factory=dict)
    """node id -> base URL of every node with the sequencer role."""
    owner_url: dict[int, str] = field(default_factory=dict)
    """log id -> base URL of its sequencer, from the last ``X-Seqlog-Sequencer`` seen."""
    written: set[int] = field(default_factory=set)
    """Logs that an append of this process succeeded on: readers prefer them."""
    find_time: bool = False
    discovered: bool = False
    started_ms: int = 0
    payload_pool: bytes = b""
    zipf: Zipf = field(default_factory=lambda: Zipf(1, 0.0))

    def log_id(self, rng: random.Random) -> int:
        return self.settings.log_base + self.zipf.draw(rng)

    def readable_log_id(self, rng: random.Random) -> int:
        log_id = self.log_id(rng)
        for _ in range(READER_DRAWS_MAX):
            if not self.written or log_id in self.written:
                break
            log_id = self.log_id(rng)
        return log_id

    def url_for(self, log_id: int, rng: random.Random) -> str:
        owner = self.owner_url.get(log_id)
        if owner is not None:
            return owner
        return rng.choice(list(self.sequencer_urls.values()))

    def learn_owner(self, log_id: int, node_id: str) -> None:
        url = self.sequencer_urls.get(node_id)
        if url is not None:
            self.owner_url[log_id] = url


VIEW = ClusterView()


def _get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json",
                                                   **AUTH_HEADERS})
    with urllib.request.urlopen(request, timeout=DISCOVERY_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def discover(host: str) -> None:
    """Sequencer nodes from ``GET /v1/cluster`` and find-time support from the served
    ``/openapi.json`` paths (find-time is only called when the cluster really serves it)."""
    if VIEW.discovered:
        return
    base = host.rstrip("/")
    cluster = _get_json(f"{base}/v1/cluster")
    urls = {str(n["node_id"]): f"http://{n['http']}" for n in cluster["nodes"]
            if "sequencer" in n.get("roles", [])}
    try:
        paths = _get_json(f"{base}/openapi.json").get("paths", {})
    except (OSError, ValueError):
        paths = {}
    VIEW.sequencer_urls = urls or {"entry": base}
    VIEW.find_time = FIND_TIME_PATH in paths
    VIEW.discovered = True


def _on_init(environment: Environment, **_kwargs: Any) -> None:
    options = environment.parsed_options
    if options is not None:
        VIEW.settings = Settings(
            logs=options.seqlog_logs, log_base=options.seqlog_log_base,
            zipf_s=options.seqlog_zipf_s, record_size=options.seqlog_record_size,
            batch_records=options.seqlog_batch_records,
            producer_rate=options.seqlog_producer_rate, wait_ms=options.seqlog_wait_ms,
            page_records=options.seqlog_page_records,
        )
    size_sampler(VIEW.settings.record_size, random.Random())  # fail early on a bad spec
    VIEW.zipf = Zipf(VIEW.settings.logs, VIEW.settings.zipf_s)
    VIEW.payload_pool = os.urandom(PAYLOAD_POOL_BYTES)
    VIEW.started_ms = int(time.time() * 1000)


# Module-level hooks; registered without decorators because locust's are untyped.
events.init_command_line_parser.add_listener(_add_arguments)  # type: ignore[no-untyped-call]
events.init.add_listener(_on_init)  # type: ignore[no-untyped-call]


# -- outcome accounting ----------------------------------------------------------------------


class Outcome(Protocol):
    """The typed subset of locust's ``ResponseContextManager`` that the users rely on."""

    status_code: int
    content: bytes | None
    headers: Any
    request_meta: dict[str, Any]
    error: object

    def success(self) -> None: ...

    def failure(self, exc: object) -> None: ...


def outcome(resp: ResponseContextManager) -> Outcome:
    return cast(Outcome, resp)


def _body(resp: Outcome) -> Any:
    try:
        return msgpack.unpackb(resp.content or b"")
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None


def judge(resp: Outcome) -> Any:
    """Mark ``resp`` as API.md says and return its decoded 200 body (``None`` otherwise)."""
    status = resp.status_code
    body = _body(resp)
    if status == 200:
        if not isinstance(body, dict):
            resp.failure("200 with an undecodable body")
            return None
        resp.success()
        return body
    name = body.get("status", "?") if isinstance(body, dict) else "?"
    if status == 429:
        resp.request_meta["name"] = f"{resp.request_meta['name']}{BACKPRESSURE_SUFFIX}"
        resp.success()
    elif status == 404 and name == "NOTFOUND" and resp.request_meta["request_type"] == "GET":
        # A reader can pick a log no producer has written yet (fresh cluster, other process).
        resp.request_meta["name"] = f"{resp.request_meta['name']}{NO_LOG_SUFFIX}"
        resp.success()
    elif status in (500, 504):
        resp.failure(f"{status} {name} (outcome unknown)")
    elif status == 0:
        resp.failure(f"connection error: {getattr(resp, 'error', None)}")
    else:
        resp.failure(f"{status} {name}")
    return None


class SeqlogUser(FastHttpUser):
    abstract = True
    network_timeout = 30.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        discover(self.host or "")
        # Seqlog answers errors in msgpack too, and geventhttpclient cannot log a binary body
        # of a status it considers bad; every status is judged by ``judge`` instead.
        cast(Any, self.client.client).valid_response_codes = ALL_STATUSES
        self.rng = random.Random()
        self.next_size = size_sampler(VIEW.settings.record_size, self.rng)

    def payload(self) -> bytes:
        size = self.next_size()
        start = self.rng.randrange(0, len(VIEW.payload_pool) - size + 1)
        return VIEW.payload_pool[start:start + size]

    def read(self, log_id: int, params: str, name: str) -> Any:
        url = f"{VIEW.url_for(log_id, self.rng)}/v1/logs/{log_id}/records?{params}"
        with self.client.get(url, headers=HEADERS, name=name, catch_response=True) as resp:
            return judge(outcome(resp))

    def tail(self, log_id: int) -> Any:
        url = f"{VIEW.url_for(log_id, self.rng)}/v1/logs/{log_id}/tail"
        with self.client.get(url, headers=HEADERS, name="tail", catch_response=True) as resp:
            body = judge(outcome(resp))
        if body is not None:
            VIEW.learn_owner(log_id, str(body.get("sequencer", "")))
        return body


def _producer_wait(user: SeqlogUser) -> float:
    rate = VIEW.settings.producer_rate
    return constant_throughput(rate)(user) if rate > 0 else 0.0


# -- user classes ----------------------------------------------------------------------------


class Producer(SeqlogUser):
    """Single-record appends to Zipf-popular logs, sent to the log's sequencer."""

    weight = 6
    wait_time = _producer_wait

    def post(self, log_id: int, path: str, body: dict[str, Any], name: str) -> None:
        url = f"{VIEW.url_for(log_id, self.rng)}/v1/logs/{log_id}/{path}"
        with self.client.post(url, data=msgpack.packb(body), headers=HEADERS, name=name,
                              catch_response=True) as raw:
            resp = outcome(raw)
            reply = judge(resp)
            owner = resp.headers.get(SEQUENCER_HEADER) if resp.headers else None
            if owner:
                VIEW.learn_owner(log_id, owner)
            if reply is None:
                return
            if isinstance(reply.get("lsn", reply.get("last_lsn")), int):
                VIEW.written.add(log_id)
            else:
                resp.failure("200 without an LSN")

    @task
    def append(self) -> None:
        log_id = VIEW.log_id(self.rng)
        self.post(log_id, "append", {"payload": self.payload()}, "append")


class BatchProducer(Producer):
    """Atomic batches of ``--seqlog-batch-records`` records."""

    weight = 2

    @task
    def append(self) -> None:
        log_id = VIEW.log_id(self.rng)
        payloads = [self.payload() for _ in range(VIEW.settings.batch_records)]
        self.post(log_id, "append-batch", {"payloads": payloads}, "append-batch")


class TailingConsumer(SeqlogUser):
    """Follows one popular log from its tail with long polls, always from ``next_lsn``."""

    weight = 2
    wait_time = between(0.0, 0.01)

    def on_start(self) -> None:
        super().on_start()
        self.log_id = VIEW.readable_log_id(self.rng)
        self.next_lsn = 0

    @task
    def follow(self) -> None:
        if self.next_lsn == 0:
            state = self.tail(self.log_id)
            if state is not None:
                self.next_lsn = int(state["release_lsn"]) + 1
            else:
                self.log_id = VIEW.readable_log_id(self.rng)
                # Cooperative under gevent: paces retries while no log exists yet.
                time.sleep(RETRY_PAUSE_S)
            return
        params = f"from={self.next_lsn}&limit=1000&wait_ms={VIEW.settings.wait_ms}"
        page = self.read(self.log_id, params, "records (tail)")
        if page is not None:
            self.next_lsn = max(self.next_lsn, int(page["next_lsn"]))


class CatchUpReader(SeqlogUser):
    """Reads a log from LSN 1 in pages until it has caught up, then picks another log."""

    weight = 1
    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        super().on_start()
        self.log_id = VIEW.readable_log_id(self.rng)
        self.next_lsn = 1

    @task
    def page(self) -> None:
        params = f"from={self.next_lsn}&limit={VIEW.settings.page_records}"
        page = self.read(self.log_id, params, "records (catch-up)")
        next_lsn = 0 if page is None else int(page["next_lsn"])
        if page is None or next_lsn <= self.next_lsn or next_lsn > int(page["release_lsn"]):
            self.log_id = VIEW.readable_log_id(self.rng)
            self.next_lsn = 1
        else:
            self.next_lsn = next_lsn


class Inspector(SeqlogUser):
    """Occasional tail calls, and find-time calls when the cluster serves find-time."""

    weight = 1
    wait_time = between(0.2, 1.0)

    @task(1)
    def tail_call(self) -> None:
        self.tail(VIEW.readable_log_id(self.rng))

    # As often as tail: a short smoke run must see find-time calls too (at 3:1 a 10 s run with
    # one Inspector saw none about once in a hundred runs).
    @task(1)
    def find_time(self) -> None:
        if not VIEW.find_time:
            return
        log_id = VIEW.readable_log_id(self.rng)
        now_ms = int(time.time() * 1000)
        timestamp_ms = self.rng.randint(min(VIEW.started_ms, now_ms), now_ms)
        url = (f"{VIEW.url_for(log_id, self.rng)}/v1/logs/{log_id}/find-time"
               f"?timestamp_ms={timestamp_ms}")
        with self.client.get(url, headers=HEADERS, name="find-time",
                             catch_response=True) as raw:
            resp = outcome(raw)
            body = judge(resp)
            if body is not None and not isinstance(body.get("lsn"), int):
                resp.failure("200 without an LSN")
