"""The chaos workload: concurrent writers and tailing readers over the public HTTP API, each
bound to one node, and release-pointer observers; everything they see goes to the history.

- A writer appends to one log through one node, one request at a time (an append, or now and
  then an append-batch), each payload unique in the run (``log.writer.seq``), so the checkers
  can tell every record's origin. Plain writers never retry a payload. Idempotent writers
  (every other one) name themselves as the producer (``producer_id`` = writer name,
  ``producer_seq`` = the seq of the first payload) and retry an append whose outcome is
  unknown with the same pair, as a new op with the same payloads: the checkers then prove
  that no retry wrote a second copy. Its answer is classified
  as API.md says: 200 ``ok``; 429, 503 and other 4xx ``fail`` (nothing written); 504, 500, a
  client timeout or a connection lost after sending ``unknown``. A connection that could not
  be opened is ``fail`` too: nothing was sent. Every request opens a fresh connection, so a
  stale keep-alive connection to a killed node cannot turn a refusal into an unknown.
- A reader follows one log through one node with long polls on GET /v1/logs/{id}/records,
  from LSN 1, continuing at each answer's ``next_lsn``.
- An observer per node asks GET /v1/logs/{id}/tail for every log in turn.

Every request has a bounded timeout; nothing waits for state by sleeping (the pauses below
only pace the load).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.chaos.history import History, payload_text

APPEND_TIMEOUT_S = 15.0
"""Client-side bound of one append: the sequencer's append timeout plus a forwarding hop."""
READ_WAIT_MS = 500
READ_TIMEOUT_S = READ_WAIT_MS / 1000 + 5.0
READ_LIMIT = 500
TAIL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0
ERROR_PAUSE_S = 0.2
IDLE_READ_PAUSE_S = 0.1
"""After an empty long poll: a node whose view of the log is stale may answer at once."""
BUSY_READ_PAUSE_S = 0.1
"""After a read with entries: lets records pile up so readers do not flood the nodes."""
TAIL_PAUSE_S = 0.1
CONNECTIONS_MAX = 200
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
NOTHING_WRITTEN_HTTP = frozenset({400, 404, 409, 413, 429, 503})
"""Answers after which nothing was written (API.md); 307 too, since we never follow one."""


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    logs: tuple[int, ...] = (1, 2, 3, 4)
    writers_per_log: int = 2
    readers_per_log: int = 3
    writer_pause_s: float = 0.05
    batch_fraction: float = 0.2
    batch_records_max: int = 3
    idempotent_retries_max: int = 3
    """Retries of an unknown outcome by an idempotent writer (0: no idempotent writers)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str
    """``ok``, ``fail`` or ``unknown`` (history event names)."""
    lsns: tuple[int, ...] = ()
    status: str = ""
    http: int | None = None


def _error_status(body: bytes, code: int) -> str:
    try:
        doc = json.loads(body)
        return str(doc.get("status") or f"HTTP{code}")
    except (ValueError, AttributeError):
        return f"HTTP{code}"


async def append(session: aiohttp.ClientSession, http: str, log: int,
                 payloads: list[bytes], producer: tuple[str, int] | None = None) -> Outcome:
    """One append (or append-batch) through ``http``, classified by what it says about the
    outcome."""
    if len(payloads) == 1:
        url = f"http://{http}/v1/logs/{log}/append"
        body: dict[str, Any] = {"payload": base64.b64encode(payloads[0]).decode()}
    else:
        url = f"http://{http}/v1/logs/{log}/append-batch"
        body = {"payloads": [base64.b64encode(p).decode() for p in payloads]}
    if producer is not None:
        body["producer_id"], body["producer_seq"] = producer
    timeout = aiohttp.ClientTimeout(total=APPEND_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    try:
        async with session.post(url, data=json.dumps(body), headers=JSON_HEADERS,
                                timeout=timeout, allow_redirects=False) as response:
            raw = await response.read()
            code = response.status
    except aiohttp.ClientConnectorError:
        return Outcome("fail", status="CONNECT_FAILED")  # never connected: nothing sent
    except TimeoutError:
        return Outcome("unknown", status="CLIENT_TIMEOUT")
    except aiohttp.ClientError as exc:
        return Outcome("unknown", status=f"CLIENT_{type(exc).__name__}")
    if code == 200:
        doc = json.loads(raw)
        if "lsn" in doc:
            return Outcome("ok", (int(doc["lsn"]),), http=code)
        first, last = int(doc["first_lsn"]), int(doc["last_lsn"])
        return Outcome("ok", tuple(range(first, last + 1)), http=code)
    status = _error_status(raw, code)
    if code in NOTHING_WRITTEN_HTTP or code == 307:
        return Outcome("fail", status=status, http=code)
    return Outcome("unknown", status=status, http=code)


def writer_placement(settings: WorkloadSettings, nodes: list[str]
                     ) -> list[tuple[str, int, str]]:
    """(writer name, log, node) of every writer: the writers of one log go through different
    nodes (while there are enough), and the logs spread over the nodes."""
    placement = []
    for log_index, log in enumerate(settings.logs):
        for k in range(settings.writers_per_log):
            index = log_index * settings.writers_per_log + k
            placement.append((f"w{index}", log, nodes[index % len(nodes)]))
    return placement


def reader_placement(settings: WorkloadSettings, nodes: list[str]
                     ) -> list[tuple[str, int, str]]:
    """(reader name, log, node): each log is followed through ``readers_per_log`` different
    nodes."""
    return [(f"r{log}-{nodes[(log_index + k) % len(nodes)]}", log,
             nodes[(log_index + k) % len(nodes)])
            for log_index, log in enumerate(settings.logs)
            for k in range(min(settings.readers_per_log, len(nodes)))]


class Workload:
    """Writers, readers and tail observers against the nodes in ``http`` (node id ->
    host:port); ``incarnation(node)`` names the node's current process for the history."""

    def __init__(self, history: History, http: dict[str, str], entry_nodes: list[str],
                 read_nodes: list[str], incarnation: Callable[[str], int],
                 settings: WorkloadSettings, seed: int, token: str | None = None) -> None:
        self.history = history
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        """A cluster with auth on (docs/SECURITY.md): every request carries the token."""
        self.http = http
        self.entry_nodes = entry_nodes
        self.read_nodes = read_nodes
        self.incarnation = incarnation
        self.settings = settings
        self.rng = random.Random(seed)
        self.stop_writes = asyncio.Event()
        self.stop_reads = asyncio.Event()
        self.reader_cursors: dict[str, int] = {}
        self.release_seen: dict[int, int] = {}
        """Per log, the highest release pointer any answer reported."""
        self.reader_logs: dict[str, int] = {}
        self.read_errors = 0
        self.tail_errors = 0
        self._next_op = 0
        self._writers: list[asyncio.Task[None]] = []
        self._readers: list[asyncio.Task[None]] = []
        self._sessions: list[aiohttp.ClientSession] = []

    async def start(self) -> None:
        # Writers: a fresh connection per request; readers and observers: keep-alive.
        write_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=CONNECTIONS_MAX, force_close=True), headers=self.headers)
        read_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=CONNECTIONS_MAX), headers=self.headers)
        self._sessions = [write_session, read_session]
        for name, log, node in writer_placement(self.settings, self.entry_nodes):
            rng = random.Random(self.rng.getrandbits(64))
            self._writers.append(asyncio.create_task(
                self._writer(write_session, name, log, node, rng)))
        for name, log, node in reader_placement(self.settings, self.read_nodes):
            self.reader_cursors[name] = 1
            self.reader_logs[name] = log
            self._readers.append(asyncio.create_task(
                self._reader(read_session, name, log, node)))
        for node in self.http:
            self._readers.append(asyncio.create_task(self._observer(read_session, node)))

    async def stop_writers(self, timeout_s: float) -> None:
        """Let every writer finish its request in flight (bounded), then stop."""
        self.stop_writes.set()
        await _finish(self._writers, timeout_s)

    async def stop_readers(self, timeout_s: float) -> None:
        self.stop_reads.set()
        await _finish(self._readers, timeout_s)

    async def close(self) -> None:
        """Cancel whatever still runs (errors were reported by the stop calls)."""
        for task in self._writers + self._readers:
            task.cancel()
        for task in self._writers + self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for session in self._sessions:
            await session.close()

    async def _writer(self, session: aiohttp.ClientSession, name: str, log: int, node: str,
                      rng: random.Random) -> None:
        seq = 0
        settings = self.settings
        idempotent = settings.idempotent_retries_max > 0 and int(name[1:]) % 2 == 1
        while not self.stop_writes.is_set():
            count = 1
            if rng.random() < settings.batch_fraction:
                count = rng.randint(2, settings.batch_records_max)
            payloads = [f"{log}.{name}.{seq + i}" for i in range(count)]
            producer = (name, seq) if idempotent else None
            seq += count
            retries = 0
            while True:
                outcome = await self._append_op(session, name, log, node, payloads, producer,
                                                retry=retries > 0)
                if (producer is None or outcome.kind != "unknown"
                        or retries >= settings.idempotent_retries_max
                        or self.stop_writes.is_set()):
                    break
                retries += 1
                await asyncio.sleep(ERROR_PAUSE_S * rng.uniform(0.5, 1.5))
            pause = settings.writer_pause_s if outcome.kind == "ok" else ERROR_PAUSE_S
            await asyncio.sleep(pause * rng.uniform(0.5, 1.5))

    async def _append_op(self, session: aiohttp.ClientSession, name: str, log: int, node: str,
                         payloads: list[str], producer: tuple[str, int] | None,
                         retry: bool) -> Outcome:
        self._next_op += 1
        op = self._next_op
        self.history.add("invoke", op=op, log=log, node=node, writer=name,
                         payloads=payloads, producer=list(producer) if producer else None,
                         retry=retry)
        try:
            outcome = await append(session, self.http[node], log,
                                   [p.encode() for p in payloads], producer)
        except asyncio.CancelledError:
            self.history.add("unknown", op=op, status="CANCELLED", http=None)
            raise
        if outcome.kind == "ok":
            self.history.add("ok", op=op, lsns=list(outcome.lsns))
        else:
            self.history.add(outcome.kind, op=op, status=outcome.status, http=outcome.http)
        return outcome

    async def _reader(self, session: aiohttp.ClientSession, name: str, log: int,
                      node: str) -> None:
        timeout = aiohttp.ClientTimeout(total=READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        while not self.stop_reads.is_set():
            cursor = self.reader_cursors[name]
            inc = self.incarnation(node)
            url = (f"http://{self.http[node]}/v1/logs/{log}/records?from={cursor}"
                   f"&limit={READ_LIMIT}&wait_ms={READ_WAIT_MS}")
            try:
                async with session.get(url, headers=JSON_HEADERS, timeout=timeout) as response:
                    raw = await response.read()
                    code = response.status
            except (aiohttp.ClientError, TimeoutError):
                code, raw = 0, b""
            if code != 200:
                self.read_errors += 1
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            doc = json.loads(raw)
            records = [[int(r["lsn"]), payload_text(base64.b64decode(r["payload"]))]
                       for r in doc["records"]]
            gaps = [[str(g["type"]), int(g["lo"]), int(g["hi"])] for g in doc["gaps"]]
            release = int(doc["release_lsn"])
            self.history.add("read", reader=name, node=node, inc=inc, log=log,
                             **{"from": cursor}, next=int(doc["next_lsn"]),
                             release=release, records=records, gaps=gaps)
            self._saw_release(log, release)
            # A next_lsn below the cursor is in the history for the checkers; do not follow it.
            self.reader_cursors[name] = max(cursor, int(doc["next_lsn"]))
            await asyncio.sleep(BUSY_READ_PAUSE_S if records or gaps else IDLE_READ_PAUSE_S)

    def _saw_release(self, log: int, release: int) -> None:
        if release > self.release_seen.get(log, 0):
            self.release_seen[log] = release

    async def _observer(self, session: aiohttp.ClientSession, node: str) -> None:
        timeout = aiohttp.ClientTimeout(total=TAIL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        while not self.stop_reads.is_set():
            for log in self.settings.logs:
                inc = self.incarnation(node)
                asked_t = self.history.now()
                try:
                    async with session.get(f"http://{self.http[node]}/v1/logs/{log}/tail",
                                           headers=JSON_HEADERS, timeout=timeout) as response:
                        raw = await response.read()
                        code = response.status
                except (aiohttp.ClientError, TimeoutError):
                    code, raw = 0, b""
                if code == 200:
                    release = int(json.loads(raw)["release_lsn"])
                    self.history.add("tail", node=node, inc=inc, log=log, release=release,
                                     asked_t=asked_t)
                    self._saw_release(log, release)
                else:
                    self.tail_errors += 1
                await asyncio.sleep(TAIL_PAUSE_S)


async def _finish(tasks: list[asyncio.Task[None]], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``tasks``, cancel the rest; a task that crashed raises."""
    pending = {t for t in tasks if not t.done()}
    if pending and timeout_s > 0:
        _, pending = await asyncio.wait(pending, timeout=timeout_s)
    for task in pending:
        task.cancel()
    errors = []
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await task
            except Exception as exc:
                errors.append(exc)
    if errors:
        raise RuntimeError(f"{len(errors)} workload tasks crashed") from errors[0]
