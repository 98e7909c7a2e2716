"""Failover benchmark: time from ``kill -9`` of a log's sequencer node to the next successful
append on that log, to that append being released (epoch recovery done), and the recovery of
an epoch that had ~1000 appends in flight when its sequencer died.

Starts its own local cluster (``services.local_cluster``: one process per node, fsync=always,
file epoch store, the integration tests' short gossip timing unless told otherwise) and stops
it at the end. Two parts:

1. ``--rounds`` (20) kill rounds, victims taken in turn: a fresh log owned by the victim gets
   a few appends (released), the victim is killed with SIGKILL, and a probe appends through
   the ``seqlog.Client`` (which retries through the other nodes) every
   ``--probe-interval-ms`` until one is acknowledged (``ack_ms``); then
   ``GET /v1/logs/{id}/tail`` on the new owner is polled until ``release_lsn`` covers it
   (``release_ms``). A poller of the survivors' ``GET /v1/cluster`` gives ``dead_ms`` (every
   survivor sees the victim DEAD); the new owner's ``node.log`` gives the activation,
   ``recovery attempt 1: SEALING`` and ``last clean epoch ->`` times (``recovery_ms`` is the
   time between the two). The victim is restarted and every sequencer node must see it
   ALIVE before the next round. Every acknowledged record must read back.
2. ``--inflight-rounds`` (5) rounds with ``--inflight`` concurrent closed-loop appenders on
   one log (``--load-batch`` > 1: append-batches): once ``--load-acks-before-kill`` records
   are acknowledged the owner is killed, the appenders stop after their current request,
   and the same probe measures ack and release. The whole log is then read back: ``lost``
   counts acknowledged records missing or changed; old-epoch records whose append had an
   unknown outcome (TIMEDOUT) but that recovery kept, and HOLE gaps (LSNs recovery plugged),
   are counted, and each storage node's copies of the old epoch are scanned over the
   node-to-node protocol for the markers recovery leaves (re-replicated records, holes,
   bridges).

Times are in ms from the moment the SIGKILL was sent (monotonic clock; log-line times use the
wall clock, 1 ms resolution). Prints one JSON document (progress goes to stderr); exits 1 if
an acknowledged record was lost or a failover did not complete within ``--deadline-s``, and
then the JSON holds the evidence (the surviving nodes' log lines about the log).

Run from the repo root: ``.venv/bin/python -m loadtests.bench_failover [--rounds 20] ...``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.bench_append import loadavg, percentile
from seqlog import Client, LogError
from services import local_cluster as lc
from shared.config import (
    GossipConfig,
    SequencerConfig,
    TransportConfig,
    process_from_dict,
)
from shared.net.pool import PeerPool
from shared.routing import routable_sequencers, sequencer_for
from shared.status import Status
from shared.types import (
    ESN_MAX,
    Epoch,
    Esn,
    LogId,
    Lsn,
    NodeId,
    compose_lsn,
    format_lsn,
    lsn_to_epoch,
    lsn_to_esn,
)
from shared.wire.read import Read, ReadReply
from shared.wire.store import RecordFlags

POLL_S = 0.01
"""Pause between polls of a tail or a cluster view."""
HTTP_TIMEOUT_S = 2.0
"""Bound of every small GET (tail, cluster view, metrics)."""
STORAGE_READ_TIMEOUT_MS = 10_000
UNKNOWN_OUTCOME = frozenset({Status.TIMEDOUT, Status.INTERNAL})
"""Append failures after which the record may or may not have been written."""
_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: log (\d+): (.*)$")
_ACTIVE = re.compile(r"sequencer active in epoch (\d+) \(last clean epoch (-?\d+)\)")
_PHASE = re.compile(r"recovery attempt (\d+): (\w+)")
_LCE = re.compile(r"last clean epoch -> (\d+) \(tail (\d+)\): (\w+)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=None,
                   help="new cluster directory (default: a fresh one under /tmp, kept)")
    p.add_argument("--storage-nodes", type=int, default=3)
    p.add_argument("--sequencers", type=int, default=3)
    p.add_argument("--replication", type=int, default=3)
    p.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    p.add_argument("--rounds", type=int, default=20, help="kill rounds without load")
    p.add_argument("--warm-appends", type=int, default=20,
                   help="appends (released) to the round's log before each kill")
    p.add_argument("--inflight-rounds", type=int, default=5,
                   help="kill rounds with --inflight appends outstanding")
    p.add_argument("--inflight", type=int, default=1000, help="concurrent appenders")
    p.add_argument("--load-batch", type=int, default=1,
                   help="records per load request (>1: append-batch; records in flight = "
                        "inflight x load-batch)")
    p.add_argument("--load-acks-before-kill", type=int, default=3000,
                   help="acknowledged appends of the load before the owner is killed")
    p.add_argument("--size", type=int, default=1024, help="payload bytes of the load")
    p.add_argument("--window-appends-max", type=int,
                   default=SequencerConfig().window_appends_max,
                   help="sequencer window (appends per log with an LSN, not yet done)")
    p.add_argument("--gossip-interval-ms", type=int, default=50)
    p.add_argument("--gossip-threshold-intervals", type=int, default=10)
    p.add_argument("--suspect-duration-ms", type=int, default=1_000)
    p.add_argument("--probe-interval-ms", type=int, default=20,
                   help="pause between failed probe appends")
    p.add_argument("--deadline-s", type=float, default=60.0,
                   help="bound of every wait (ack, release, ALIVE, load)")
    return p


# -- small helpers ------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    """n, median, p90 (nearest rank), min and max of a list of ms."""
    vals = sorted(values)
    if not vals:
        return {"n": 0}
    return {"n": len(vals), "median": round(statistics.median(vals), 1),
            "p90": round(percentile(vals, 90), 1), "min": round(vals[0], 1),
            "max": round(vals[-1], 1)}


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def ms_since(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


async def get_json(session: aiohttp.ClientSession, http: str, path: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with session.get(f"http://{http}{path}", timeout=timeout) as resp:
        if resp.status != 200:
            raise LogError(Status.INTERNAL, f"GET {http}{path}: HTTP {resp.status}")
        return await resp.json()


async def wait_for(predicate: Callable[[], Awaitable[bool]], deadline_s: float,
                   what: str) -> None:
    end = time.monotonic() + deadline_s
    while True:
        with contextlib.suppress(LogError, aiohttp.ClientError, OSError, TimeoutError):
            if await predicate():
                return
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {deadline_s} s waiting for {what}")
        await asyncio.sleep(POLL_S)


def payload_of(tag: str, size: int) -> bytes:
    return tag.encode().ljust(size, b".")


class RoundFailed(Exception):
    """A failover did not complete in time; ``sample`` holds the evidence gathered."""

    def __init__(self, sample: dict[str, Any]) -> None:
        super().__init__(sample.get("error"))
        self.sample = sample


def failed(bench: Bench, sample: dict[str, Any], exc: BaseException, log: LogId,
           offsets: dict[NodeId, int], killed_wall: float) -> RoundFailed:
    """The round's sample with the error and every surviving sequencer node's log lines
    about ``log`` since the kill."""
    sample["error"] = repr(exc)
    sample["log_lines_by_node"] = {
        n: recovery_lines(bench, n, offsets[n], log, killed_wall) for n in bench.sequencers
        if n != sample["victim"]}
    return RoundFailed(sample)


# -- the cluster ----------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    root: Path
    session: aiohttp.ClientSession
    https: dict[NodeId, str] = field(default_factory=dict)
    sequencers: list[NodeId] = field(default_factory=list)
    next_log: int = 1000

    def state(self) -> lc.ClusterState:
        state = lc.load_state(self.root)
        assert state is not None
        return state

    def entry(self, node: NodeId) -> lc.NodeEntry:
        return next(n for n in self.state().nodes if n.node_id == node)

    def urls(self, nodes: list[NodeId] | None = None) -> list[str]:
        return [f"http://{self.https[n]}" for n in (nodes or self.sequencers)]

    async def view(self, observer: NodeId) -> tuple[dict[NodeId, str], list[tuple[NodeId, float]]]:
        doc = await get_json(self.session, self.https[observer], "/v1/cluster")
        states = {NodeId(n["node_id"]): str(n["state"]) for n in doc["nodes"]}
        weights = [(NodeId(n["node_id"]), float(n["sequencer_weight"])) for n in doc["nodes"]
                   if "sequencer" in n["roles"]]
        return states, weights

    async def all_alive(self) -> bool:
        for observer in self.sequencers:
            states, _ = await self.view(observer)
            if set(states.values()) != {"ALIVE"}:
                return False
        return True

    async def log_owned_by(self, victim: NodeId) -> LogId:
        """A log id never used before whose owner, in every sequencer node's view, is
        ``victim``."""
        views = [await self.view(o) for o in self.sequencers]
        while True:
            self.next_log += 1
            log = LogId(self.next_log)
            owners = {sequencer_for(log, routable_sequencers(w, s)) for s, w in views}
            if owners == {victim}:
                return log

    async def kill9(self, node: NodeId) -> float:
        """SIGKILL the node's process group; returns the monotonic time right after."""
        entry = self.entry(node)
        if not lc.node_alive(self.root, entry):
            raise RuntimeError(f"{node} (pid {entry.pid}) is not running")
        os.killpg(entry.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        end = killed_at + 10
        while lc.node_alive(self.root, entry):
            if time.monotonic() > end:
                raise RuntimeError(f"{node} (pid {entry.pid}) survived SIGKILL")
            await asyncio.sleep(POLL_S)
        return killed_at

    async def restart(self, node: NodeId) -> dict[str, float]:
        t0 = time.monotonic()
        await asyncio.to_thread(lc.restart, self.root, node, ready_timeout_ms=60_000)
        ready_ms = ms_since(t0)
        await wait_for(self.all_alive, self.args.deadline_s, f"{node} ALIVE everywhere")
        return {"restart_ready_ms": ready_ms, "restart_alive_ms": ms_since(t0)}

    async def tail(self, node: NodeId, log: LogId) -> dict[str, Any]:
        doc: dict[str, Any] = await get_json(self.session, self.https[node],
                                             f"/v1/logs/{log}/tail")
        return doc

    async def metric(self, node: NodeId, name: str) -> float | None:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with self.session.get(f"http://{self.https[node]}/metrics",
                                    timeout=timeout) as resp:
            text = await resp.text()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def probe_client(self) -> Client:
        return Client(self.urls(), timeout_ms=5_000, retries_max=2, retry_backoff_ms_max=100,
                      cluster_refresh_ms_min=100)

    def log_offset(self, node: NodeId) -> int:
        try:
            return (self.root / node / "node.log").stat().st_size
        except OSError:
            return 0


# -- one failover: detection, probe, release, log lines ---------------------------------------


async def watch_dead(bench: Bench, victim: NodeId, killed_at: float) -> float | None:
    """ms until every surviving sequencer node's view calls ``victim`` DEAD."""
    survivors = [s for s in bench.sequencers if s != victim]
    end = killed_at + bench.args.deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(LogError, aiohttp.ClientError, OSError, TimeoutError):
            views = [await bench.view(s) for s in survivors]
            if all(states.get(victim) == "DEAD" for states, _ in views):
                return ms_since(killed_at)
        await asyncio.sleep(POLL_S)
    return None


@dataclass
class Probe:
    ack_ms: float
    lsn: Lsn
    attempts: int
    failures: Counter[str]
    unknown_payloads: set[bytes]
    payload: bytes


async def probe_append(bench: Bench, client: Client, log: LogId, killed_at: float,
                       tag: str) -> Probe:
    """Append to ``log`` until one is acknowledged; failures are counted by status."""
    failures: Counter[str] = Counter()
    unknown: set[bytes] = set()
    attempt = 0
    end = killed_at + bench.args.deadline_s
    while True:
        attempt += 1
        payload = f"{tag}-probe-{attempt}".encode()
        try:
            result = await client.append(log, payload)
        except LogError as exc:
            failures[exc.status.name] += 1
            if exc.status in UNKNOWN_OUTCOME:
                unknown.add(payload)
            if time.monotonic() > end:
                raise TimeoutError(f"log {log}: no append acknowledged within "
                                   f"{bench.args.deadline_s} s: {dict(failures)}") from exc
            await asyncio.sleep(bench.args.probe_interval_ms / 1000)
            continue
        return Probe(ack_ms=ms_since(killed_at), lsn=result.lsn, attempts=attempt,
                     failures=failures, unknown_payloads=unknown, payload=payload)


async def wait_released(bench: Bench, log: LogId, lsn: Lsn, killed_at: float
                        ) -> tuple[float, NodeId]:
    """ms until the log's new owner reports ``release_lsn >= lsn``, polled on that node. The
    owner is the node the running sequencer nodes name in their tail answers; a view that
    still names the killed node (not DEAD there yet) is asked again on the next poll."""
    owner: NodeId | None = None
    end = killed_at + bench.args.deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(LogError, aiohttp.ClientError, OSError, TimeoutError):
            if owner is None:
                owner = await running_owner(bench, log)
            if owner is not None:
                doc = await bench.tail(owner, log)
                if int(doc["release_lsn"]) >= lsn:
                    return ms_since(killed_at), owner
                if doc["sequencer"] != owner:
                    owner = None
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"log {log}: {format_lsn(lsn)} not released within "
                       f"{bench.args.deadline_s} s (owner {owner})")


async def running_owner(bench: Bench, log: LogId) -> NodeId | None:
    """The log's owner if every running sequencer node names the same running node."""
    running = [n for n in bench.sequencers if lc.node_alive(bench.root, bench.entry(n))]
    named = {NodeId((await bench.tail(n, log))["sequencer"]) for n in running}
    if len(named) == 1 and next(iter(named)) in running:
        return next(iter(named))
    return None


def recovery_lines(bench: Bench, node: NodeId, offset: int, log: LogId, killed_wall: float
                   ) -> dict[str, Any]:
    """What ``node``'s log says about ``log`` after ``offset``: times in ms after the kill
    (wall clock) of activation, each recovery phase and the last-clean-epoch write."""
    path = bench.root / node / "node.log"
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return {"error": str(exc)}
    out: dict[str, Any] = {"node": node, "phases": []}
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m is None or int(m.group(2)) != log:
            continue
        at_ms = round((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                       - killed_wall) * 1000, 1)
        message = m.group(3)
        if (a := _ACTIVE.match(message)) and "activated_ms" not in out:
            out.update(activated_ms=at_ms, epoch=int(a.group(1)), lce_at_activation=int(
                a.group(2)))
        elif p := _PHASE.match(message):
            attempt, phase = int(p.group(1)), p.group(2)
            out["phases"].append([at_ms, attempt, phase])
            out["attempts"] = max(out.get("attempts", 0), attempt)
            if phase == "SEALING" and "sealing_ms" not in out:
                out["sealing_ms"] = at_ms
        elif (c := _LCE.match(message)) and "lce_ms" not in out:
            out.update(lce_ms=at_ms, lce_epoch=int(c.group(1)), lce_status=c.group(3))
    if "sealing_ms" in out and "lce_ms" in out:
        out["recovery_ms"] = round(out["lce_ms"] - out["sealing_ms"], 1)
    return out


# -- reading back -----------------------------------------------------------------------------


@dataclass
class ReadBack:
    records: dict[int, bytes] = field(default_factory=dict)
    gaps: list[tuple[str, int, int]] = field(default_factory=list)
    coverage_errors: list[str] = field(default_factory=list)


async def read_all(client: Client, log: LogId, until_lsn: Lsn, deadline_s: float) -> ReadBack:
    """Every record and gap from LSN 1 through ``until_lsn``, checking the coverage rule."""
    out = ReadBack()
    cursor = 1
    end = time.monotonic() + deadline_s
    while cursor <= until_lsn:
        if time.monotonic() > end:
            out.coverage_errors.append(f"read stalled at {format_lsn(Lsn(cursor))}")
            break
        result = await client.read(log, cursor, limit=1000, wait_ms=1000)
        covered = sorted([(r.lsn, r.lsn) for r in result.records]
                         + [(g.lo, g.hi) for g in result.gaps])
        for lo, hi in covered:
            if lo != cursor:
                out.coverage_errors.append(f"coverage broken at {cursor}: ({lo}, {hi})")
            cursor = hi + 1
        out.records.update((r.lsn, r.payload) for r in result.records)
        out.gaps.extend((g.type, g.lo, g.hi) for g in result.gaps)
        if cursor != result.next_lsn:
            out.coverage_errors.append(f"next_lsn {result.next_lsn} != covered end {cursor}")
            cursor = max(cursor, result.next_lsn)
    return out


def lost_of(acked: dict[int, bytes], back: ReadBack) -> list[str]:
    """Acknowledged LSNs that do not read back with their payload."""
    return [format_lsn(Lsn(lsn)) for lsn, payload in sorted(acked.items())
            if back.records.get(lsn) != payload]


async def scan_epoch_copies(bench: Bench, log: LogId, epoch: Epoch) -> dict[str, Any]:
    """Every storage node's copies of ``log``'s ``epoch`` up to that node's release pointer
    (storage nodes cap every READ there; once the next epoch's recovery released, that is all
    of ``epoch``), over the node-to-node protocol: copies per LSN, and the markers epoch
    recovery wrote."""
    config = process_from_dict(json.loads(
        (bench.root / bench.sequencers[0] / "config.json").read_text()))
    nodes = {n.node_id: (n.host, n.data_port) for n in config.cluster.nodes}
    pool = PeerPool(node_id=NodeId("bench-failover"),
                    cluster_fingerprint=config.cluster.fingerprint(),
                    config=TransportConfig(), addresses=nodes.get)
    copies: Counter[int] = Counter()
    rereplicated: dict[int, int] = Counter()
    holes: set[int] = set()
    bridges: set[int] = set()
    first, last = compose_lsn(epoch, Esn(1)), compose_lsn(epoch, ESN_MAX)
    errors: list[str] = []
    try:
        for node in config.cluster.storage_node_ids:
            cursor = first
            while cursor <= last:
                reply = await pool.call(node, Read(
                    log_id=log, from_lsn=Lsn(cursor), until_lsn=Lsn(last),
                    release_lsn=Lsn(last), records_max=1000, bytes_max=1 << 24),
                    STORAGE_READ_TIMEOUT_MS)
                if type(reply) is not ReadReply or reply.status is not Status.OK:
                    errors.append(f"{node}: {reply!r}"[:200])
                    break
                for record in reply.records:
                    copies[record[0]] += 1
                for lo, hi, flags, _seal in reply.markers:
                    for lsn in range(lo, min(hi, lo + 100_000) + 1):
                        if flags & RecordFlags.BRIDGE:
                            bridges.add(lsn)
                        elif flags & RecordFlags.HOLE:
                            holes.add(lsn)
                        elif flags & RecordFlags.WRITTEN_BY_RECOVERY:
                            rereplicated[lsn] += 1
                if reply.next_lsn <= cursor or not (reply.records or reply.markers):
                    break
                cursor = reply.next_lsn
    finally:
        await pool.close()
    per_lsn = Counter(copies.values())
    return {
        "records_with_copies": len(copies),
        "copies_per_record": {str(k): v for k, v in sorted(per_lsn.items())},
        "records_rewritten_by_recovery": len(rereplicated),
        "copies_written_by_recovery": sum(rereplicated.values()),
        "hole_plugs": len(holes),
        "bridge_esns": sorted(lsn_to_esn(Lsn(b)) for b in bridges)[:5],
        "errors": errors,
    }


# -- part 1: kill rounds without load ---------------------------------------------------------


async def kill_round(bench: Bench, index: int, victim: NodeId) -> dict[str, Any]:
    log = await bench.log_owned_by(victim)
    sample: dict[str, Any] = {"round": index, "victim": victim, "log": log}
    acked: dict[int, bytes] = {}
    async with bench.probe_client() as client:
        for i in range(bench.args.warm_appends):
            payload = f"r{index}-warm-{i}".encode()
            acked[(await client.append(log, payload)).lsn] = payload
        last = max(acked)
        old_tail = await bench.tail(victim, log)
        if old_tail["sequencer"] != victim:
            raise RuntimeError(f"log {log} is sequenced by {old_tail['sequencer']}, "
                               f"not {victim}")
        await wait_for(lambda: _released(bench, victim, log, last), bench.args.deadline_s,
                       "warm appends released")
        sample["old_epoch"] = lsn_to_epoch(Lsn(last))
        offsets = {n: bench.log_offset(n) for n in bench.sequencers}
        killed_wall = time.time()
        killed_at = await bench.kill9(victim)
        dead = asyncio.create_task(watch_dead(bench, victim, killed_at))
        try:
            probe = await probe_append(bench, client, log, killed_at, f"r{index}")
            acked[probe.lsn] = probe.payload
            sample.update(ack_ms=probe.ack_ms, lsn=format_lsn(probe.lsn))
            release_ms, owner = await wait_released(bench, log, probe.lsn, killed_at)
        except (TimeoutError, LogError) as exc:
            dead.cancel()
            raise failed(bench, sample, exc, log, offsets, killed_wall) from exc
        sample.update(
            ack_ms=probe.ack_ms, release_ms=release_ms, dead_ms=await dead,
            new_owner=owner, lsn=format_lsn(probe.lsn), attempts=probe.attempts,
            failures=dict(probe.failures))
        sample["log_lines"] = recovery_lines(bench, owner, offsets[owner], log, killed_wall)
        back = await read_all(client, log, probe.lsn, bench.args.deadline_s)
    lost = lost_of(acked, back)
    unexpected = [format_lsn(Lsn(lsn)) for lsn, payload in back.records.items()
                  if lsn not in acked and payload not in probe.unknown_payloads]
    sample.update(lost=len(lost), lost_lsns=lost[:20], unexpected=unexpected[:20],
                  gaps=[[t, format_lsn(Lsn(lo)), format_lsn(Lsn(hi))]
                        for t, lo, hi in back.gaps],
                  coverage_errors=back.coverage_errors[:5])
    sample.update(await bench.restart(victim))
    return sample


async def _released(bench: Bench, node: NodeId, log: LogId, lsn: int) -> bool:
    return int((await bench.tail(node, log))["release_lsn"]) >= lsn


# -- part 2: kill with ~1000 appends in flight ------------------------------------------------


@dataclass
class Load:
    acked: dict[int, bytes] = field(default_factory=dict)
    ack_times: dict[int, float] = field(default_factory=dict)
    unknown: set[bytes] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)
    outstanding: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def run_load(client: Client, log: LogId, load: Load, workers: int, size: int,
                   batch: int, tag: str) -> None:
    """``workers`` closed loops of appends (``batch`` > 1: append-batches) until ``stop``."""
    async def worker(w: int) -> None:
        i = 0
        while not load.stop.is_set():
            payloads = [payload_of(f"{tag}-w{w}-{i}-{k}-", size) for k in range(batch)]
            i += 1
            load.outstanding += batch
            try:
                if batch == 1:
                    first = (await client.append(log, payloads[0])).lsn
                else:
                    first = (await client.append_batch(log, payloads)).first_lsn
            except LogError as exc:
                load.errors[exc.status.name] += 1
                if exc.status in UNKNOWN_OUTCOME:
                    load.unknown.update(payloads)
                continue
            finally:
                load.outstanding -= batch
            now = time.monotonic()
            for k, payload in enumerate(payloads):
                load.acked[first + k] = payload
                load.ack_times[first + k] = now

    await asyncio.gather(*(worker(w) for w in range(workers)))


async def inflight_round(bench: Bench, index: int, victim: NodeId) -> dict[str, Any]:
    args = bench.args
    log = await bench.log_owned_by(victim)
    tag = f"f{index}"
    sample: dict[str, Any] = {"round": index, "victim": victim, "log": log}
    load = Load()
    async with (
        Client(bench.urls(), connections_max=args.inflight + 16, timeout_ms=30_000,
               retries_max=5) as loader,
        bench.probe_client() as client,
    ):
        first = await loader.append(log, payload_of(f"{tag}-first", args.size))
        load.acked[first.lsn] = payload_of(f"{tag}-first", args.size)
        if (await bench.tail(victim, log))["sequencer"] != victim:
            raise RuntimeError(f"log {log} is not sequenced by {victim}")
        started = time.monotonic()
        task = asyncio.create_task(run_load(loader, log, load, args.inflight, args.size,
                                            args.load_batch, tag))
        gauges: dict[str, list[float]] = {"client": [], "http": [], "appenders": []}
        sampler = asyncio.create_task(sample_gauges(bench, victim, load, gauges))
        await wait_for(lambda: _true(len(load.acked) >= args.load_acks_before_kill),
                       args.deadline_s, f"{args.load_acks_before_kill} load acks")
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        steady_s = time.monotonic() - started
        sample["load_before_kill"] = {
            "acked": len(load.acked), "appends_per_s": round(len(load.acked) / steady_s, 1),
            "errors": dict(load.errors),
            "client_outstanding": summary(gauges["client"]),
            "owner_http_requests_in_flight": summary(gauges["http"]),
            "owner_appenders_in_flight": summary(gauges["appenders"]),
        }
        outstanding_at_kill = load.outstanding
        offsets = {n: bench.log_offset(n) for n in bench.sequencers}
        killed_wall = time.time()
        # No worker runs between these two lines (kill9 signals before its first await): the
        # requests in flight at the kill are exactly the ones outstanding now.
        load.stop.set()
        killed_at = await bench.kill9(victim)
        sample["load_before_kill"]["client_outstanding_at_kill"] = outstanding_at_kill
        sample["load_before_kill"]["acked_at_kill"] = len(load.acked)
        acked_before_kill = {lsn: p for lsn, p in load.acked.items()
                             if load.ack_times.get(lsn, 0.0) <= killed_at}
        dead = asyncio.create_task(watch_dead(bench, victim, killed_at))
        try:
            probe = await probe_append(bench, client, log, killed_at, tag)
            sample.update(ack_ms=probe.ack_ms, lsn=format_lsn(probe.lsn))
            release_ms, owner = await wait_released(bench, log, probe.lsn, killed_at)
        except (TimeoutError, LogError) as exc:
            dead.cancel()
            load.stop.set()
            raise failed(bench, sample, exc, log, offsets, killed_wall) from exc
        sample.update(ack_ms=probe.ack_ms, release_ms=release_ms, dead_ms=await dead,
                      new_owner=owner, lsn=format_lsn(probe.lsn), attempts=probe.attempts,
                      failures=dict(probe.failures))
        await asyncio.wait_for(task, args.deadline_s)
        sample["log_lines"] = recovery_lines(bench, owner, offsets[owner], log, killed_wall)
        old_epoch = lsn_to_epoch(Lsn(max(acked_before_kill)))
        acked = {**load.acked, probe.lsn: probe.payload}
        until = Lsn(max(acked))
        await wait_for(lambda: _released(bench, owner, log, until), args.deadline_s,
                       f"release of {format_lsn(until)}")
        back = await read_all(client, log, until, args.deadline_s)
    unknown = load.unknown | probe.unknown_payloads
    old = {lsn: p for lsn, p in back.records.items() if lsn_to_epoch(Lsn(lsn)) == old_epoch}
    old_acked_esns = [lsn_to_esn(Lsn(lsn)) for lsn in acked if lsn_to_epoch(Lsn(lsn)) == old_epoch]
    seen: Counter[bytes] = Counter(back.records.values())
    holes = [(lo, hi) for t, lo, hi in back.gaps if t == "HOLE"
             and lsn_to_epoch(Lsn(lo)) == old_epoch]
    lost = lost_of(acked, back)
    sample.update(
        old_epoch=old_epoch,
        acked_total=len(acked), acked_before_kill=len(acked_before_kill),
        # Acks the old sequencer sent before it died that the (busy) client read afterwards.
        old_epoch_acks_read_after_kill=sum(
            1 for lsn in load.acked if lsn not in acked_before_kill
            and lsn_to_epoch(Lsn(lsn)) == old_epoch),
        # Appends that had an LSN when the owner died but whose ack the client had not read:
        # records recovery found, plus plugged holes.
        sequenced_not_acked_at_kill=sum(1 for lsn in old if lsn not in acked_before_kill)
        + sum(hi - lo + 1 for lo, hi in holes),
        lost=len(lost), lost_lsns=lost[:20],
        lost_acked_before_kill=len(lost_of(acked_before_kill, back)),
        load_errors_after_kill=dict(load.errors),
        unknown_outcome_appends=len(unknown),
        old_epoch_records=len(old),
        old_epoch_highest_acked_esn=max(old_acked_esns, default=0),
        old_epoch_highest_record_esn=max((lsn_to_esn(Lsn(lsn)) for lsn in old), default=0),
        recovered_unacknowledged=sum(1 for lsn, p in old.items()
                                     if lsn not in acked and p in unknown),
        unexpected_records=[format_lsn(Lsn(lsn)) for lsn, p in back.records.items()
                            if lsn not in acked and p not in unknown][:20],
        duplicates=sum(1 for c in seen.values() if c > 1),
        hole_lsns=sum(hi - lo + 1 for lo, hi in holes),
        gaps=_gap_summary(back.gaps),
        coverage_errors=back.coverage_errors[:5],
    )
    sample["storage_copies_of_old_epoch"] = await scan_epoch_copies(bench, log, old_epoch)
    sample.update(await bench.restart(victim))
    return sample


async def _true(value: bool) -> bool:
    return value


async def sample_gauges(bench: Bench, node: NodeId, load: Load,
                        gauges: dict[str, list[float]]) -> None:
    """Every 100 ms until cancelled: the client's outstanding records and the owner's
    ``seqlog_http_requests_in_flight`` and ``seqlog_sequencer_appends_in_flight`` (appenders,
    each carrying up to ``append_group_records_max`` appends)."""
    while True:
        gauges["client"].append(load.outstanding)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            http = await bench.metric(node, "seqlog_http_requests_in_flight")
            appenders = await bench.metric(node, "seqlog_sequencer_appends_in_flight")
            if http is not None and appenders is not None:
                gauges["http"].append(http)
                gauges["appenders"].append(appenders)
        await asyncio.sleep(0.1)


def _gap_summary(gaps: list[tuple[str, int, int]]) -> list[list[Any]]:
    """Gaps as [type, lo, hi, LSN count]; long BRIDGE/HOLE runs are shown by their ends."""
    return [[t, format_lsn(Lsn(lo)), format_lsn(Lsn(hi)), hi - lo + 1] for t, lo, hi in gaps
            if t != "BRIDGE" or lsn_to_epoch(Lsn(lo)) == lsn_to_epoch(Lsn(hi))][:50]


# -- main -------------------------------------------------------------------------------------


def gossip_config(args: argparse.Namespace) -> GossipConfig:
    # The integration tests' timing (tests/integration/gossip_cluster.py FAST_GOSSIP).
    return GossipConfig(
        gossip_interval_ms=args.gossip_interval_ms,
        gossip_threshold_intervals=args.gossip_threshold_intervals,
        suspect_duration_ms=args.suspect_duration_ms, min_gossips_for_stable_state=3,
        startup_wait_ms=500, gossip_time_skew_ms=2_000, failover_duration_ms=300)


async def bench_main(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    gossip = gossip_config(args)
    sequencer = SequencerConfig(window_appends_max=args.window_appends_max)
    spec = lc.LocalClusterSpec(
        dir=root, storage_nodes=args.storage_nodes, sequencers=args.sequencers,
        replication=args.replication, fsync=args.fsync, sequencer=sequencer, gossip=gossip,
        base_port=lc.free_base_port(args.storage_nodes + args.sequencers))
    out: dict[str, Any] = {
        "bench": "seqlog_failover",
        "dir": str(root),
        "settings": {
            "storage_nodes": args.storage_nodes, "sequencers": args.sequencers,
            "replication": args.replication, "fsync": args.fsync, "epoch_store": "file",
            "window_appends_max": args.window_appends_max,
            "gossip": {
                "gossip_interval_ms": gossip.gossip_interval_ms,
                "gossip_threshold_intervals": gossip.gossip_threshold_intervals,
                "threshold_ms": gossip.gossip_interval_ms * gossip.gossip_threshold_intervals,
                "suspect_duration_ms": gossip.suspect_duration_ms},
            "recovery": {"recovery_grace_ms": sequencer.recovery_grace_ms,
                         "recovery_retry_ms": sequencer.recovery_retry_ms},
            "probe": {"interval_ms": args.probe_interval_ms, "client_timeout_ms": 5_000,
                      "client_retries_max": 2, "cluster_refresh_ms_min": 100},
            "rounds": args.rounds, "warm_appends": args.warm_appends,
            "inflight_rounds": args.inflight_rounds, "inflight": args.inflight,
            "load_batch": args.load_batch, "size": args.size,
            "load_acks_before_kill": args.load_acks_before_kill,
        },
        "loadavg_start": loadavg(),
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    started = time.monotonic()
    state = await asyncio.to_thread(lc.up, spec, ready_timeout_ms=60_000)
    try:
        async with aiohttp.ClientSession() as session:
            bench = Bench(args=args, root=root, session=session,
                          https={n.node_id: n.http for n in state.nodes},
                          sequencers=[n.node_id for n in state.nodes
                                      if "sequencer" in n.roles])
            await wait_for(bench.all_alive, args.deadline_s, "every node ALIVE")
            kills: list[dict[str, Any]] = []
            loaded: list[dict[str, Any]] = []
            out["kill_rounds"] = _aggregate(kills)
            out["inflight_rounds"] = _aggregate(loaded)
            plan = [(kill_round, kills, i) for i in range(args.rounds)]
            plan += [(inflight_round, loaded, i) for i in range(args.inflight_rounds)]
            for run, samples, i in plan:
                victim = bench.sequencers[i % len(bench.sequencers)]
                try:
                    sample = await run(bench, i, victim)
                except RoundFailed as failure:
                    # The cluster is in an unknown state: stop here, keep the evidence.
                    samples.append(failure.sample)
                    progress(f"{run.__name__} {i}: FAILED: {failure.sample['error']}")
                    break
                samples.append(sample)
                progress(f"{run.__name__} {i}: {victim} log {sample['log']} -> "
                         f"{sample['new_owner']}: ack {sample['ack_ms']} ms, release "
                         f"{sample['release_ms']} ms, dead {sample['dead_ms']} ms, recovery "
                         f"{sample['log_lines'].get('recovery_ms')} ms, lost {sample['lost']}")
            out["kill_rounds"] = _aggregate(kills)
            out["inflight_rounds"] = _aggregate(loaded)
    finally:
        await asyncio.to_thread(lc.down, root)
    out["loadavg_end"] = loadavg()
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    return out


def _aggregate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def col(key: str) -> list[float]:
        return [s[key] for s in samples if s.get(key) is not None]

    def line(key: str) -> list[float]:
        return [s["log_lines"][key] for s in samples if key in s.get("log_lines", {})]

    return {
        "ack_ms": summary(col("ack_ms")),
        "release_ms": summary(col("release_ms")),
        "dead_ms": summary(col("dead_ms")),
        "activated_ms": summary(line("activated_ms")),
        "sealing_ms": summary(line("sealing_ms")),
        "recovery_ms": summary(line("recovery_ms")),
        "lce_ms": summary(line("lce_ms")),
        "restart_ready_ms": summary(col("restart_ready_ms")),
        "restart_alive_ms": summary(col("restart_alive_ms")),
        "recovery_attempts_max": max(
            (s.get("log_lines", {}).get("attempts", 0) for s in samples), default=0),
        "lost_total": sum(s.get("lost", 0) for s in samples),
        "failed_rounds": [s["round"] for s in samples if "error" in s],
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.storage_nodes, args.sequencers, args.replication, args.inflight,
           args.size, args.warm_appends, args.load_batch) < 1 or args.sequencers < 2:
        print(json.dumps({"error": "need >= 2 sequencers and positive counts"}))
        return 2
    root = args.dir or Path(tempfile.mkdtemp(prefix="seqlog-failover-"))
    root = root.resolve()
    if root.exists() and any(root.iterdir()):
        print(json.dumps({"error": f"{root} is not empty"}))
        return 2
    out = asyncio.run(bench_main(args, root))
    print(json.dumps(out), flush=True)
    bad = any(out[part]["lost_total"] or out[part]["failed_rounds"]
              for part in ("kill_rounds", "inflight_rounds"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
