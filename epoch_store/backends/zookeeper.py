"""ZooKeeper epoch store: ``VersionedObjects`` on znodes, through kazoo.

Layout under the configured root (LogDevice's, ``logdevice-digest.md`` §1.4)::

    <root>/logs/<log_id>              empty
    <root>/logs/<log_id>/sequencer    LogMetadata (next epoch, nodeset, replication, last writer)
    <root>/logs/<log_id>/lce          LastCleanEpoch (empty until first set)

Values are the JSON of ``epoch_store.core.records`` plus a random ``write_id``. Versions map
onto ZooKeeper's ``stat.version``: ``sequencer`` is created holding its first value, so its
version is ``stat.version + 1``; ``lce`` is created empty, so its version is ``stat.version``.
A log is provisioned by one ZooKeeper transaction creating all three znodes (its first
activation's value included); every later change is ``set(version=...)``.

Writes are batched: the writes of all logs that reach the store in one event-loop iteration (or
while earlier batches are in flight) go to ZooKeeper as multi-operation transactions of at most
``MULTI_OPS_MAX`` operations, so that provisioning many logs or marking thousands of epochs clean
at a graceful stop costs a few requests, not one per log. A transaction applies all or none of
its operations: when one log's operation fails (its version moved, its znode exists), that log
gets its answer and the others, rolled back, go again in the next transaction.

Connection loss and session expiry: an operation waits for a connection until its deadline
and then answers ``CONNFAILED``. A write whose reply was lost may or may not have been applied,
so it is never blindly retried: the object is re-read and the write counts as done only if the
stored bytes are exactly the ones written, ``write_id`` included. Otherwise it answers ``AGAIN``
and ``CasEpochStore`` plans afresh from the new read. A lost write that ZooKeeper applies later
consumed an epoch nobody was given, which is allowed; giving one out twice never happens.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kazoo.exceptions import (  # type: ignore[import-untyped]
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from epoch_store.backends.cas import CasEpochStore, CasRetry
from epoch_store.backends.zk_session import CONNECTION_ERRORS, ZkOptions, ZkSession
from epoch_store.core import metadata as core
from epoch_store.core import records
from shared.config import TlsConfig
from shared.epoch_metadata import LastCleanEpoch, LogMetadata
from shared.status import Status
from shared.types import LogId

logger = logging.getLogger(__name__)

_ROOT_RE = re.compile(r"(/[A-Za-z0-9_.\-]+)+")
_HOST_RE = re.compile(r"[A-Za-z0-9_.\-]+:\d{1,5}")
_READ_RETRY_DELAY_S = 0.02
_PROVISION_ATTEMPTS_MAX = 4
_UNSETTLED: tuple[type[Exception], ...] = (*CONNECTION_ERRORS, TimeoutError)
LCE_SEEN_MAX = 1_000_000
"""Logs whose last LCE ``ZooKeeperObjects`` remembers (about 150 bytes each)."""
MULTI_OPS_MAX = 256
"""Most operations in one ZooKeeper transaction (a few tens of kilobytes, far below the
server's 1 MB request limit)."""


def parse_zk_url(url: str) -> tuple[str, str, ZkOptions]:
    """``zk://host:port[,host:port...]/root[?session_timeout_ms=N&op_timeout_ms=N]`` as
    ``(hosts, root, options)``; raises ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "zk" or parts.fragment:
        raise ValueError(f"not a zk:// URL: {url!r}")
    hosts = parts.netloc.split(",")
    if not all(_HOST_RE.fullmatch(h) and 0 < int(h.rsplit(":", 1)[1]) < 65536 for h in hosts):
        raise ValueError(f"zk URL needs host:port[,host:port...], got {parts.netloc!r}")
    root = parts.path.rstrip("/")
    names = root.split("/")[1:]
    if not _ROOT_RE.fullmatch(root) or any(n in (".", "..") for n in names) or (
        names[0] == "zookeeper"
    ):
        raise ValueError(f"zk URL needs a root path such as /seqlog, got {parts.path!r}")
    settings: dict[str, Any] = {}  # ints only (checked below); Any for ZkOptions' str fields
    for key, value in parse_qsl(parts.query, strict_parsing=bool(parts.query)):
        if key not in ("session_timeout_ms", "op_timeout_ms") or not value.isdigit():
            raise ValueError(f"unknown or bad zk URL setting {key}={value!r}")
        settings[key] = int(value)
    return ",".join(hosts), root, ZkOptions(**settings)


def log_path(root: str, log_id: LogId) -> str:
    return f"{root}/logs/{int(log_id)}"


def metadata_from_znode(raw: bytes, stat_version: int, log_id: LogId) -> LogMetadata | str:
    """The metadata in a ``sequencer`` znode, or why it is not valid."""
    data = records.decode(raw)
    if isinstance(data, str):
        return data
    value = records.metadata_from_dict(records.without_write_id(data), log_id)
    return value if isinstance(value, str) else replace(value, version=stat_version + 1)


def lce_from_znode(raw: bytes, stat_version: int, log_id: LogId) -> LastCleanEpoch | str | None:
    """The last clean epoch in an ``lce`` znode (None while it was never set), or why it is not
    valid."""
    if not raw:
        return None if stat_version == 0 else f"empty at version {stat_version}"
    data = records.decode(raw)
    if isinstance(data, str):
        return data
    value = records.lce_from_dict(records.without_write_id(data), log_id)
    return value if isinstance(value, str) else replace(value, version=stat_version)


def _stamped(data: dict[str, Any]) -> bytes:
    return records.encode(records.with_write_id(data, secrets.token_hex(8)))


@dataclass(slots=True)
class _Write:
    """One log's part of a transaction."""

    path: str
    """The znode whose stored bytes tell, after a lost reply, whether the write applied."""
    raw: bytes
    add: Callable[[Any], None]
    ops_count: int
    future: asyncio.Future[Status]


class ZooKeeperObjects:
    """``VersionedObjects`` in ZooKeeper znodes under ``root``."""

    def __init__(self, hosts: str, root: str, options: ZkOptions | None = None) -> None:
        assert _ROOT_RE.fullmatch(root), root
        self.root = root
        self.session = ZkSession(hosts, options or ZkOptions())
        self.ambiguous_writes_count = 0
        """Writes whose reply was lost and whose outcome was settled by re-reading."""
        self.transactions_count = 0
        """Multi-operation transactions sent (each carrying the writes of one or more logs)."""
        self._lce_seen: dict[LogId, LastCleanEpoch] = {}
        """The LCE last read or written per log, newest last (``cached_lce``), at most
        ``LCE_SEEN_MAX``."""
        self._queue: deque[_Write] = deque()
        self._batcher: asyncio.Task[None] | None = None

    async def read_metadata(self, log_id: LogId) -> tuple[Status, LogMetadata | None]:
        path = log_path(self.root, log_id) + "/sequencer"
        status, raw, version = await self._read(path, self._deadline())
        if status != Status.OK or raw is None:
            return status, None
        value = metadata_from_znode(raw, version, log_id)
        return (Status.OK, value) if not isinstance(value, str) else _corrupt(path, value)

    async def read_lce(self, log_id: LogId) -> tuple[Status, LastCleanEpoch | None]:
        path = log_path(self.root, log_id) + "/lce"
        status, raw, version = await self._read(path, self._deadline())
        if status != Status.OK or raw is None:
            return status, None
        value = lce_from_znode(raw, version, log_id)
        if value is None:
            # The empty znode of a provisioned log whose LCE was never set. Answered as such
            # (version 0, the version a first write expects), so that nobody has to read the
            # metadata to learn that the log exists.
            value = core.no_last_clean_epoch(log_id)
        if isinstance(value, str):
            return _corrupt(path, value)
        self._remember_lce(value)
        return Status.OK, value

    def cached_lce(self, log_id: LogId) -> LastCleanEpoch | None:
        return self._lce_seen.get(log_id)

    def _remember_lce(self, value: LastCleanEpoch) -> None:
        seen = self._lce_seen
        seen.pop(value.log_id, None)
        if len(seen) >= LCE_SEEN_MAX:
            del seen[next(iter(seen))]
        seen[value.log_id] = value

    async def write_metadata(
        self, log_id: LogId, value: LogMetadata, *, expected_version: int
    ) -> Status:
        assert value.log_id == log_id and value.version == expected_version + 1, value
        raw = _stamped(records.metadata_to_dict(value))
        if expected_version == 0:
            return await self._provision(log_id, raw)
        path = log_path(self.root, log_id) + "/sequencer"
        status = await self._write(
            path, raw, lambda tx: tx.set_data(path, raw, version=expected_version - 1), 1)
        return Status.AGAIN if status == Status.NOTFOUND else status

    async def write_lce(
        self, log_id: LogId, value: LastCleanEpoch, *, expected_version: int
    ) -> Status:
        assert value.log_id == log_id and value.version == expected_version + 1, value
        raw = _stamped(records.lce_to_dict(value))
        path = log_path(self.root, log_id) + "/lce"
        status = await self._write(
            path, raw, lambda tx: tx.set_data(path, raw, version=expected_version), 1)
        if status == Status.NOTFOUND and expected_version == 0:
            # Only a hand-edited store lacks the lce znode of a provisioned log: recreate it,
            # empty and then set, so that its version still maps as for any other lce.
            def recreate(tx: Any) -> None:
                tx.create(path, b"")
                tx.set_data(path, raw, version=0)

            status = await self._write(path, raw, recreate, 2)
        if status == Status.OK:
            self._remember_lce(value)
        return Status.AGAIN if status == Status.NOTFOUND else status

    async def close(self) -> None:
        if self._batcher is not None:
            await asyncio.gather(self._batcher, return_exceptions=True)
        await self.session.close()

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.session.options.op_timeout_ms / 1000

    async def _read(self, path: str, deadline_s: float) -> tuple[Status, bytes | None, int]:
        """The znode's bytes and ``stat.version``; ``(OK, None, 0)`` when it does not exist.
        Reads change nothing, so connection failures are retried until the deadline."""
        while True:
            if not await self.session.wait_connected(deadline_s):
                return self._unreachable(), None, 0
            try:
                data, stat = await self.session.call(lambda zk: zk.get_async(path), deadline_s)
            except NoNodeError:
                return Status.OK, None, 0
            except CONNECTION_ERRORS:
                await asyncio.sleep(_READ_RETRY_DELAY_S)
                continue
            except TimeoutError:
                return Status.TIMEDOUT, None, 0
            except KazooException as exc:
                logger.error("ZooKeeper read of %s failed: %r", path, exc)
                return Status.INTERNAL, None, 0
            return Status.OK, bytes(data), int(stat.version)

    async def _write(
        self, path: str, raw: bytes, add: Callable[[Any], None], ops_count: int
    ) -> Status:
        """One log's conditional write that stores ``raw`` at ``path``, made of ``ops_count``
        operations that ``add`` puts into a transaction, sent in the next batch: ``OK``,
        ``AGAIN`` (a version differs or a znode exists), ``NOTFOUND`` (a znode it needs is
        missing), ``CONNFAILED`` (not sent), ``TIMEDOUT`` (sent, outcome unknown) or
        ``INTERNAL``."""
        future: asyncio.Future[Status] = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(path, raw, add, ops_count, future))
        if self._batcher is None or self._batcher.done():
            # Its first step runs in the next loop iteration: writes of this one join it.
            self._batcher = asyncio.get_running_loop().create_task(self._send_batches())
        return await future

    async def _send_batches(self) -> None:
        while self._queue:
            batches: list[list[_Write]] = []
            while self._queue:
                batch: list[_Write] = []
                ops = 0
                while self._queue and ops + self._queue[0].ops_count <= MULTI_OPS_MAX:
                    write = self._queue.popleft()
                    if not write.future.done():  # its caller gave up before it was sent
                        batch.append(write)
                        ops += write.ops_count
                if batch:
                    batches.append(batch)
            # Batches go out together (ZooKeeper pipelines them); writes arriving meanwhile,
            # and rolled-back ones, form the next round.
            await asyncio.gather(*(self._send_batch(b) for b in batches))

    async def _send_batch(self, batch: list[_Write]) -> None:
        try:
            statuses = await self._transaction(batch)
        except Exception:  # a bug: answer rather than leave callers hanging
            logger.exception("ZooKeeper transaction failed")
            statuses = [Status.INTERNAL] * len(batch)
        for write, status in zip(batch, statuses, strict=True):
            if status is None:
                self._queue.append(write)
            elif not write.future.done():
                write.future.set_result(status)

    async def _transaction(self, batch: list[_Write]) -> list[Status | None]:
        """Send ``batch`` as one transaction; a status per write, None for a write rolled
        back because another one failed (to be sent again)."""
        deadline_s = self._deadline()
        if not await self.session.wait_connected(deadline_s):
            return [self._unreachable()] * len(batch)

        def request(zk: Any) -> Any:
            tx = zk.transaction()
            for write in batch:
                write.add(tx)
            return tx.commit_async()

        self.transactions_count += 1
        try:
            results = await self.session.call(request, deadline_s)
        except CONNECTION_ERRORS as exc:
            settled = await asyncio.gather(
                *(self._settle(w.path, w.raw, deadline_s, exc) for w in batch))
            return list(settled)
        except TimeoutError:
            return [Status.SHUTDOWN if self.session.closed else Status.TIMEDOUT] * len(batch)
        except KazooException as exc:
            logger.error("ZooKeeper transaction of %d writes failed: %r", len(batch), exc)
            return [Status.INTERNAL] * len(batch)
        answers: list[Status | None] = []
        position = 0
        for write in batch:
            part = results[position:position + write.ops_count]
            position += write.ops_count
            if not any(isinstance(r, Exception) for r in part):
                answers.append(Status.OK)
            elif all(isinstance(r, RolledBackError | RuntimeInconsistency) for r in part):
                answers.append(None)
            else:
                answers.append(_transaction_status(write.path, part))
        return answers

    async def _settle(self, path: str, raw: bytes, deadline_s: float, exc: Exception) -> Status:
        """The reply to a write of ``raw`` was lost: find out from the stored bytes whether it
        was applied."""
        self.ambiguous_writes_count += 1
        status, stored, _ = await self._read(path, deadline_s)
        if status != Status.OK:
            outcome = Status.SHUTDOWN if self.session.closed else Status.TIMEDOUT
            logger.warning("write of %s lost its reply (%r) and could not be checked (%s): %s",
                           path, exc, status.name, outcome.name)
            return outcome
        applied = stored == raw
        logger.warning("write of %s lost its reply (%r); re-read shows it was %s", path, exc,
                       "applied" if applied else "not applied (or overwritten)")
        return Status.OK if applied else Status.AGAIN

    async def _provision(self, log_id: LogId, raw: bytes) -> Status:
        """Create the log's three znodes in one transaction, the log's first metadata value
        in ``sequencer``. Creates ``<root>/logs`` on first use, and tolerates a log znode
        left without its children by hand."""
        base = log_path(self.root, log_id)
        seq_path, lce_path = base + "/sequencer", base + "/lce"
        paths = [base, seq_path, lce_path]
        for _ in range(_PROVISION_ATTEMPTS_MAX):

            def creates(tx: Any, paths: list[str] = paths) -> None:
                for path in paths:
                    tx.create(path, raw if path == seq_path else b"")

            status = await self._write(seq_path, raw, creates, len(paths))
            if status == Status.NOTFOUND:
                status = await self._ensure_path(f"{self.root}/logs")
            elif status == Status.AGAIN and paths[0] == base:
                # Usually another writer provisioned the log first; if not, the log znode
                # exists without its children and only those are created.
                status, paths = await self._missing_children(seq_path, lce_path)
            else:
                return status
            if status != Status.OK:
                return status
            if not paths:
                return Status.AGAIN
        return Status.AGAIN

    async def _missing_children(
        self, seq_path: str, lce_path: str
    ) -> tuple[Status, list[str]]:
        missing = []
        for path in (seq_path, lce_path):
            status, raw, _ = await self._read(path, self._deadline())
            if status != Status.OK:
                return status, []
            if raw is None:
                missing.append(path)
        return Status.OK, missing if seq_path in missing else []

    async def _ensure_path(self, path: str) -> Status:
        deadline_s = self._deadline()
        if not await self.session.wait_connected(deadline_s):
            return self._unreachable()
        try:
            await self.session.call(lambda zk: zk.ensure_path_async(path), deadline_s)
        except _UNSETTLED:
            return Status.TIMEDOUT
        except KazooException as exc:
            logger.error("could not create %s in ZooKeeper: %r", path, exc)
            return Status.INTERNAL
        return Status.OK

    def _unreachable(self) -> Status:
        if self.session.closed:
            return Status.SHUTDOWN
        logger.warning("ZooKeeper %s unreachable", self.session.hosts)
        return Status.CONNFAILED


def _transaction_status(path: str, results: list[Any]) -> Status:
    errors = [r for r in results if isinstance(r, Exception)
              and not isinstance(r, RolledBackError | RuntimeInconsistency)]
    if not errors:
        return Status.OK
    if isinstance(errors[0], NodeExistsError | BadVersionError):
        return Status.AGAIN
    if isinstance(errors[0], NoNodeError):
        return Status.NOTFOUND
    logger.error("ZooKeeper transaction on %s failed: %r", path, errors)
    return Status.INTERNAL


def _corrupt(path: str, reason: str) -> tuple[Status, None]:
    logger.error("epoch store znode %s is corrupt (%s); repair or remove it", path, reason)
    return Status.INTERNAL, None


class ZooKeeperEpochStore(CasEpochStore):
    """An ``EpochStore`` in a ZooKeeper ensemble. Connects on first use, never in the
    constructor."""

    def __init__(
        self,
        hosts: str,
        root: str,
        *,
        options: ZkOptions | None = None,
        retry: CasRetry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.zk = ZooKeeperObjects(hosts, root, options)
        super().__init__(self.zk, retry=retry, rng=rng)

    @classmethod
    def from_url(cls, url: str, *, tls: TlsConfig | None = None) -> ZooKeeperEpochStore:
        """``tls``: talk TLS to ZooKeeper with its CA and certificate (``tls.zookeeper``)."""
        hosts, root, options = parse_zk_url(url)
        if tls is not None:
            options = replace(options, tls_ca_file=tls.ca_file, tls_cert_file=tls.cert_file,
                              tls_key_file=tls.key_file)
        return cls(hosts, root, options=options)
