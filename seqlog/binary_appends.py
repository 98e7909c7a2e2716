"""Appends over the binary protocol with the client's routing and retry rules.

The common case costs one APPEND frame, one future and one callback: ``submit`` sends straight
to the log's expected owner (with ``no_forward``) on its open connection and resolves the
caller's future from the answer, without a Task. Anything else (no connection yet, a redirect,
an error to retry) continues in one Task per such append (``_run``), with the rules of the HTTP
path (``seqlog.client``): a redirect (NOSEQUENCER with the owner's data address) is followed
at most ``redirects_max`` times and never back to a node already tried, after which the client
lets the nodes forward; statuses in ``NOTHING_WRITTEN`` are retried with bounded backoff; an
append whose outcome is unknown (TIMEDOUT, a connection lost after sending) is retried only
when it is idempotent (it names a producer) and otherwise raises ``LogError(TIMEDOUT)``.

Single appends to one log (same key, no producer pair, a payload of at most
``GROUP_PAYLOAD_BYTES_MAX``) issued on one connection in one event-loop iteration leave as ONE
APPEND of all their payloads (Kafka's producer batching what queued up while it was busy, with
no linger): a sequencer hands appends of one loop iteration to one appender anyway (one STORE
wave, consecutive LSNs in arrival order, one timestamp), so this changes nothing the caller
can see except the cost: one frame, one check and one answer per group instead of per append.
Each append still gets its own LSN (``first_lsn + i``) and its own future. On a connection
whose node speaks protocol version 3 every log's groups of one loop iteration leave together
as one APPEND_MULTI (one entry per log and key, ``shared.wire.append_multi``), answered in one
APPENDED_MULTI; each entry's answer is handled as its group's would be. A group that is not
written (any answer but OK) is taken apart: each append goes on alone through the rules above,
so an answer about the group (TOOBIG against a node's smaller batch limits) is never wrongly
pinned on one append, and an unknown outcome stays unknown for each. An append made on an
idle connection (nothing in flight: one append at a time) leaves alone, as before.

A node that refuses the client's HELLO (an older node, protocol version 1), or data ports of
which none was ever reachable (a client outside a network that exposes only HTTP), make the
client fall back to HTTP for good (``BinaryUnavailable``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from seqlog.binary import BinaryConnection, Connections
from seqlog.routing import Router
from shared.http_contract import NOTHING_WRITTEN, OUTCOME_UNKNOWN, TRY_ELSEWHERE
from shared.status import LogError, Status
from shared.types import LogId, NodeId
from shared.wire.append import Append, Appended
from shared.wire.append_multi import (
    APPEND_MULTI_ENTRIES_MAX,
    AppendedMulti,
    AppendMulti,
    appended_multi_results,
)
from shared.wire.codec import Message

T = TypeVar("T")

GROUP_PAYLOAD_BYTES_MAX = 64 * 1024
"""Bigger payloads travel alone: a group must stay far below any node's request limits."""
GROUP_RECORDS_MAX = 512
GROUP_BYTES_MAX = 512 * 1024
"""A group reaching either bound leaves at once and the next appends start another (the
defaults of ``ApiConfig``: 10,000 records and 1 MiB per request; a node configured below them
answers TOOBIG or INVALID_PARAM, and the group's appends are then sent one by one)."""
_Held = tuple[bytes, "asyncio.Future[Any]", Callable[[Appended], Any]]
"""A single append waiting for its group to leave: payload, caller's future, result maker."""
_REGROUP_ALONE = frozenset({Status.TOOBIG, Status.INVALID_PARAM, Status.BADMSG})
"""Answers to a group that may be about the group, not the appends: each is sent alone."""
MULTI_RECORDS_MAX = 4096
MULTI_BYTES_MAX = 1024 * 1024
"""An APPEND_MULTI (appends to many logs bound for one node, one entry per log) leaves at
once when it holds this many appends, and carries at most this many payload bytes (and
``APPEND_MULTI_ENTRIES_MAX`` entries; more go in another frame)."""
_MULTI = "multi"
"""The one key under which a connection that takes APPEND_MULTI holds its single appends."""
_MultiHeld = tuple[LogId, str | None, NodeId | None, bytes, "asyncio.Future[Any]",
                   Callable[[Appended], Any]]
"""A single append held for an APPEND_MULTI: log, key, owner, payload, future, result maker."""


class BinaryUnavailable(Exception):
    """The cluster does not speak the binary protocol to this client: use HTTP."""


class BinaryAppends:
    def __init__(self, *, router: Router, connections: Connections, retries_max: int,
                 redirects_max: int, backoff_ms: Callable[[int, int], float],
                 refresh_cluster: Callable[[], Awaitable[None]],
                 http_fallback: Callable[[Append, Callable[[Appended], Any]], Awaitable[Any]],
                 on_unavailable: Callable[[], None],
                 make_single: Callable[[int, int], Any] | None = None) -> None:
        self._router = router
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        """Looked up once: ``asyncio.get_running_loop()`` is a getpid() system call per call
        on Python 3.11, a tenth of the client's CPU per append. The connections are bound to
        this loop anyway."""
        self._retries_max = retries_max
        self._redirects_max = redirects_max
        self._backoff_ms = backoff_ms
        self._refresh_cluster = refresh_cluster
        self._http_fallback = http_fallback
        self._on_unavailable = on_unavailable
        self._make_single = make_single
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresh_task: asyncio.Task[None] | None = None
        self._closed = False

    def submit(self, message: Append, future: asyncio.Future[T],
               make: Callable[[Appended], T]) -> None:
        """Send ``message`` and resolve ``future`` with ``make(answer)``, or fail it with
        ``LogError``."""
        router = self._router
        if router.cluster_stale:
            self._refresh_soon()
        owner = router.owner(message.log_id)
        address = router.data_address(owner) if owner is not None else None
        conn = self.connections.ready(address) if address is not None else None
        if conn is None:
            self._spawn(self._run(message, None, None, future, make))
            return
        conn.send_held()  # appends leave in the order they were made
        self._request(conn, message, owner, future, make)

    def submit_single(self, log_id: LogId, payload: bytes, key: str | None,
                      future: asyncio.Future[T], make: Callable[[Appended], T]) -> None:
        """``submit`` for a single append without a producer pair (its arguments checked):
        it may travel in a group, its result then made by ``make_single(lsn, timestamp_ms)``.
        Its APPEND is built only if it travels alone."""
        router = self._router
        owner = router.owner(log_id)
        address = router.data_address(owner) if owner is not None else None
        conn = self.connections.ready(address) if address is not None else None
        if router.cluster_stale:
            self._refresh_soon()
        if conn is None:
            self._spawn(self._run(_single(log_id, payload, key), None, None, future, make))
            return
        # An idle connection (one append at a time) sends at once, as without groups.
        if (not conn.inflight or self._make_single is None
                or len(payload) > GROUP_PAYLOAD_BYTES_MAX):
            conn.send_held()  # appends leave in the order they were made
            self._request(conn, _single(log_id, payload, key), owner, future, make)
            return
        if conn.multi:
            # Every log's appends of this loop iteration to this node: one APPEND_MULTI.
            if conn.hold(_MULTI, (log_id, key, owner, payload, future, make),
                         self._send_multi) >= MULTI_RECORDS_MAX:
                self._send_multi(conn, _MULTI, conn.release_held(_MULTI))
            return
        group_key = (log_id, key, owner)
        if conn.hold(group_key, (payload, future, make), self._send_group) >= GROUP_RECORDS_MAX:
            self._send_group(conn, group_key, conn.release_held(group_key))

    def _send_multi(self, conn: BinaryConnection, _key: object,
                    items: list[_MultiHeld]) -> None:
        """Send the single appends held for one node's connection, of any logs: each log's
        (and key's) appends as one entry within the group bounds, the entries in as few
        APPEND_MULTI frames as the frame bounds allow (a lone entry as an APPEND)."""
        groups: dict[tuple[LogId, str | None], list[_MultiHeld]] = {}
        for item in items:
            group = groups.get((item[0], item[1]))
            if group is None:
                groups[(item[0], item[1])] = [item]
            else:
                group.append(item)
        owner = items[0][2]
        frame: list[tuple[LogId, str | None, list[_Held]]] = []
        frame_bytes = 0
        for (log_id, key), group in groups.items():
            start = 0
            size = 0
            held = [(item[3], item[4], item[5]) for item in group]
            for index, (payload, _, _) in enumerate(held):
                grown = size + len(payload)
                if index > start and (grown > GROUP_BYTES_MAX or index - start >= (
                        GROUP_RECORDS_MAX)):
                    frame_bytes = self._add_entry(conn, owner, frame, frame_bytes,
                                                  (log_id, key, held[start:index]), size)
                    start, grown = index, len(payload)
                size = grown
            frame_bytes = self._add_entry(conn, owner, frame, frame_bytes,
                                          (log_id, key, held[start:] if start else held), size)
        self._send_frame(conn, owner, frame)

    def _add_entry(self, conn: BinaryConnection, owner: NodeId | None,
                   frame: list[tuple[LogId, str | None, list[_Held]]], frame_bytes: int,
                   entry: tuple[LogId, str | None, list[_Held]], size: int) -> int:
        """Add ``entry`` (of ``size`` payload bytes) to ``frame``, sending the frame first if
        it would grow past its bounds; the frame's bytes afterwards."""
        if frame and (len(frame) >= APPEND_MULTI_ENTRIES_MAX
                      or frame_bytes + size > MULTI_BYTES_MAX):
            self._send_frame(conn, owner, frame[:])
            frame.clear()
            frame_bytes = 0
        frame.append(entry)
        return frame_bytes + size

    def _send_frame(self, conn: BinaryConnection, owner: NodeId | None,
                    frame: list[tuple[LogId, str | None, list[_Held]]]) -> None:
        if len(frame) == 1:
            log_id, key, group = frame[0]
            self._send_combined(conn, (log_id, key, owner), group)
            return
        make_single = self._make_single
        assert make_single is not None
        router = self._router
        shape = [(log_id, len(group)) for log_id, _, group in frame]

        def on_reply(reply: Message | Status) -> None:
            answers = (appended_multi_results(reply, shape) if type(reply) is AppendedMulti
                       else None)
            node = reply.sequencer_node if answers is not None else None  # type: ignore[union-attr]
            for index, (log_id, key, group) in enumerate(frame):
                answer = reply if answers is None else answers[index]
                if isinstance(answer, tuple):  # OK: (first_lsn, timestamp_ms)
                    if node is not None and node != owner:
                        router.learn_route(log_id, node)
                    first_lsn, timestamp_ms = answer
                    for lsn, (_, future, _) in enumerate(group, first_lsn):
                        if not future.done():  # else cancelled: the outcome stays unknown
                            future.set_result(make_single(lsn, timestamp_ms))
                    continue
                # Nothing written, or unknown: each append goes on alone, as for a group.
                alone = (type(answer) is Appended and answer.status in _REGROUP_ALONE
                         and len(group) > 1)
                if alone:
                    self._make_single = None  # a node that refuses groups: stop grouping
                for payload, future, make in group:
                    if not future.done():
                        self._spawn(self._run(_single(log_id, payload, key),
                                              None if alone else owner,
                                              None if alone else answer, future, make))

        conn.request(AppendMulti(appends=tuple(
            (log_id, tuple(p for p, _, _ in group), key) for log_id, key, group in frame)),
            on_reply)

    def _send_group(self, conn: BinaryConnection,
                    group_key: tuple[LogId, str | None, NodeId | None],
                    items: list[_Held]) -> None:
        """Send the single appends held under ``group_key`` as few APPENDs as the group
        bounds allow (see the module docstring)."""
        start = 0
        size = 0
        for index, item in enumerate(items):
            size += len(item[0])
            if size > GROUP_BYTES_MAX and index > start:
                self._send_combined(conn, group_key, items[start:index])
                start, size = index, len(item[0])
        self._send_combined(conn, group_key, items[start:] if start else items)

    def _send_combined(self, conn: BinaryConnection,
                       group_key: tuple[LogId, str | None, NodeId | None],
                       group: list[_Held]) -> None:
        log_id, key, owner = group_key
        if len(group) == 1:
            payload, future, make = group[0]
            self._request(conn, _single(log_id, payload, key), owner, future, make)
            return
        make_single = self._make_single
        assert make_single is not None
        router = self._router

        def on_reply(reply: Message | Status) -> None:
            if (type(reply) is Appended and reply.status is Status.OK
                    and reply.last_lsn - reply.first_lsn + 1 == len(group)):
                node = reply.sequencer_node
                if node is not None and node != owner:
                    router.learn_route(log_id, node)
                timestamp_ms = reply.timestamp_ms
                for lsn, (_, future, _) in enumerate(group, reply.first_lsn):
                    if not future.done():  # else cancelled: the outcome stays unknown
                        future.set_result(make_single(lsn, timestamp_ms))
                return
            # Nothing written, or unknown: each append goes on alone by the usual rules.
            alone = type(reply) is Appended and reply.status in _REGROUP_ALONE
            if alone:
                self._make_single = None  # a node that refuses groups: stop grouping
            for payload, future, make in group:
                if not future.done():
                    self._spawn(self._run(_single(log_id, payload, key),
                                          None if alone else owner,
                                          None if alone else reply, future, make))

        conn.request(Append(log_id=log_id, payloads=tuple(p for p, _, _ in group), key=key,
                            hops=0, no_forward=True), on_reply)

    def _request(self, conn: BinaryConnection, message: Append, owner: NodeId | None,
                 future: asyncio.Future[T], make: Callable[[Appended], T]) -> None:
        router = self._router

        def on_reply(reply: Message | Status) -> None:
            if future.done():
                return  # cancelled by the caller: the outcome stays unknown to them
            if type(reply) is Appended and reply.status is Status.OK:
                node = reply.sequencer_node
                if node is not None and node != owner:
                    router.learn_route(message.log_id, node)
                future.set_result(make(reply))
            else:
                self._spawn(self._run(message, owner, reply, future, make))

        conn.request(message, on_reply)

    def _refresh_soon(self) -> None:
        """Refresh the cluster view in the background (the refresh is rate-limited), so that
        appends on open connections need not wait for it."""
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.ensure_future(self._refresh_cluster())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, message: Append, node: NodeId | None, reply: Message | Status | None,
                   future: asyncio.Future[T], make: Callable[[Appended], T]) -> None:
        try:
            if self._closed:
                if node is not None and reply in (Status.PEER_CLOSED, Status.TIMEDOUT):
                    # Sent before the close: the outcome is unknown, not "nothing sent".
                    raise _transport_error(node, reply)
                raise LogError(Status.SHUTDOWN, "client closed; nothing was sent")
            answer = await self._retrying(message, node, reply)
        except asyncio.CancelledError:
            if not future.done():
                future.set_exception(LogError(
                    Status.TIMEDOUT, "client closed during the append; the outcome is unknown"))
            raise
        except BinaryUnavailable:
            self._on_unavailable()
            try:
                result = await self._http_fallback(message, make)
            except Exception as exc:  # the HTTP path raises LogError; pass on whatever it is
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(result)
            return
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(make(answer))

    async def _retrying(self, message: Append, node: NodeId | None,
                        reply: Message | Status | None) -> Appended:
        router = self._router
        log_id = message.log_id
        idempotent = message.producer_id is not None
        attempt = 0
        retry_after_ms = 0
        redirects = 0
        tried: set[NodeId] = set()
        no_forward = True
        asked = message.no_forward
        while True:
            if reply is None:
                if router.cluster_stale:
                    await self._refresh_cluster()
                # Only ask a node not to forward when the client thinks it is the owner.
                asked = no_forward and router.owner(log_id) is not None
                if message.no_forward != asked:
                    message = dataclasses.replace(message, no_forward=asked)
                node, reply = await self._send(message)
            assert node is not None
            tried.add(node)
            if type(reply) is Appended:
                sequencer = reply.sequencer_node
                if sequencer:
                    router.learn_route(log_id, sequencer)
                if reply.status is Status.OK:
                    return reply
                if reply.status is Status.NOSEQUENCER and reply.redirect_data and sequencer:
                    router.learn_node_data(sequencer, reply.redirect_data)
                    router.cluster_stale = True
                    redirects += 1
                    if sequencer in tried or redirects >= self._redirects_max or not asked:
                        # Views disagree (a loop) or the redirects go on: let the nodes
                        # forward, which they bound by hops.
                        no_forward = False
                        router.forget_route(log_id)
                    if redirects > self._redirects_max + 1:
                        raise LogError(Status.NOSEQUENCER, f"redirected {redirects} times")
                    reply = None
                    continue
                error = LogError(reply.status, reply.message)
                retry_after_ms = reply.retry_after_ms
            elif isinstance(reply, Status):
                error = _transport_error(node, reply)
                if error.status in OUTCOME_UNKNOWN:
                    router.cluster_stale = True
            else:
                error = LogError(Status.BADMSG, f"{node} answered {type(reply).__name__}")
            retry = error.status in NOTHING_WRITTEN or (
                idempotent and error.status in OUTCOME_UNKNOWN)
            if not retry or attempt >= self._retries_max:
                raise error
            if error.status in TRY_ELSEWHERE:
                router.demote_node(node)
            await asyncio.sleep(self._backoff_ms(attempt, retry_after_ms) / 1000)
            attempt += 1
            retry_after_ms = 0
            reply = None

    async def _send(self, message: Append) -> tuple[NodeId, Message | Status]:
        """Send to the first candidate node we can connect to: (node, its answer or the
        transport's status)."""
        failures: list[str] = []
        router = self._router
        owner = router.owner(message.log_id)
        for node, address in router.data_candidates(message.log_id):
            if node != owner and message.no_forward:
                # Not the owner: let this node forward rather than redirect us back.
                message = dataclasses.replace(message, no_forward=False)
            try:
                conn = await self.connections.get(address)
            except LogError as exc:
                if exc.status is Status.PROTONOSUPPORT:
                    raise BinaryUnavailable(exc.message) from None
                if exc.status in (Status.SHUTDOWN, Status.UNAUTHENTICATED):
                    raise
                failures.append(exc.message)
                router.demote_node(node)
                router.cluster_stale = True
                continue
            answer: asyncio.Future[Message | Status] = (
                asyncio.get_running_loop().create_future())

            def on_reply(reply: Message | Status,
                         answer: asyncio.Future[Message | Status] = answer) -> None:
                if not answer.done():
                    answer.set_result(reply)

            conn.request(message, on_reply)
            return node, await answer
        if not failures:
            raise BinaryUnavailable("no node with a data address is known")
        if not self.connections.connected_once:
            # No data port was ever reachable from here; HTTP may be.
            raise BinaryUnavailable("no data port reachable: " + "; ".join(failures))
        raise LogError(Status.CONNFAILED, "no node reachable: " + "; ".join(failures))

    async def close(self) -> None:
        """Fail every append in flight (outcome unknown) and close the connections."""
        self._closed = True
        await self.connections.close()
        tasks = [*self._tasks, *([self._refresh_task] if self._refresh_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _single(log_id: LogId, payload: bytes, key: str | None) -> Append:
    """The APPEND of one checked single append without a producer pair."""
    return Append(log_id=log_id, payloads=(payload,), key=key, hops=0, no_forward=True)


def _transport_error(node: NodeId, status: Status) -> LogError:
    if status in (Status.PEER_CLOSED, Status.TIMEDOUT):
        return LogError(Status.TIMEDOUT,
                        f"{node}: {status.name} after sending; the outcome is unknown")
    if status is Status.OVERLOADED:
        return LogError(Status.OVERLOADED, f"{node}: too much unsent; nothing was sent")
    # CONNFAILED: the connection was closed before the request left.
    return LogError(Status.NOTREADY if status is Status.CONNFAILED else status,
                    f"{node}: {status.name}; nothing was sent")
