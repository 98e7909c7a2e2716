"""One chaos run: a local cluster of real node processes (``services.local_cluster``) whose
every node-to-node link goes through the proxy process (``tests/chaos/proxy.py``), the
workload (``workload.py``), the seeded fault schedule (``faults.py``) carried out against the
processes and the links, then healing, a settle phase, a scan of every copy on every storage
node, and the offline checkers (``checkers.py``) over the recorded history.

Phases: start (proxy, then nodes with ``transport.peer_addresses`` naming the proxy's
listeners) -> warm-up (workload only) -> faults -> heal (every link passes, every node runs,
clean) -> the writers go on briefly, then stop -> settle (wait, bounded, for the release
pointers to reach the last acknowledged LSNs and the readers to catch up; with no epoch
recovery a failed-over log never gets there, which is a figure, not a violation) -> scan ->
stop -> check.

The run directory keeps ``history.jsonl``, ``summary.json`` and every node's data and log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from services import local_cluster as lc
from services import token_cli
from shared import failpoints
from shared.config import AuthConfig, GossipConfig, SequencerConfig, TransportConfig
from shared.net.pool import PeerPool
from shared.status import Status
from shared.types import EPOCH_MAX, ESN_MAX, Epoch, Esn, LogId, NodeId, compose_lsn, lsn_to_epoch
from shared.wire.read import GetLogState, LogState
from shared.wire.recovery import Digest, GetDigest
from shared.wire.store import RecordFlags
from tests.chaos import checkers
from tests.chaos.faults import WIPE_REBUILD_S_MAX, Fault, links_of, schedule
from tests.chaos.history import History, payload_text
from tests.chaos.proxy import PASS, LinkMode, Mode, ProxyProcess
from tests.chaos.reader_check import compare_readers
from tests.chaos.workload import APPEND_TIMEOUT_S, Workload, WorkloadSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST_GOSSIP = GossipConfig(
    gossip_interval_ms=50, gossip_threshold_intervals=10, suspect_duration_ms=1_000,
    min_gossips_for_stable_state=3, startup_wait_ms=500, gossip_time_skew_ms=2_000,
    failover_duration_ms=300)
"""Threshold 500 ms, SUSPECT 1 s (as tests/integration/test_gossip.py): failovers happen
within the short faults of a run."""
SEQUENCER = SequencerConfig(append_timeout_ms=5_000)
READY_TIMEOUT_MS = 60_000
RESTART_READY_TIMEOUT_MS = 30_000
STOP_TIMEOUT_MS = 10_000
GONE_TIMEOUT_S = 10.0
POLL_S = 0.05
SCAN_CALL_TIMEOUT_MS = 5_000
SCAN_RECORDS_MAX = 1_000
READERS_STOP_TIMEOUT_S = 10.0
VIOLATIONS_SHOWN_MAX = 20


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    seed: int
    duration_s: float = 75.0
    """Length of the fault phase."""
    sequencers: int = 2
    storage_nodes: int = 3
    replication: int = 2
    warmup_s: float = 3.0
    after_heal_s: float = 3.0
    """How long the writers go on after healing, before they stop."""
    settle_timeout_s: float = 15.0
    """Bound on waiting for release pointers to reach the acks, and again for the readers."""
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    disk_faults: bool = False
    """Also replace storage nodes' disks (``wipe``), one at a time, each rebuilt first."""
    auth: bool = False
    """Client authentication on (docs/SECURITY.md): every request of the workload and the
    reader check carries the cluster's admin token."""


@dataclass(slots=True)
class ChaosResult:
    seed: int
    run_dir: Path
    history_path: Path
    figures: dict[str, Any]
    violations: list[checkers.Violation]

    def summary(self) -> dict[str, Any]:
        return {"seed": self.seed, "figures": self.figures,
                "violations": [v.as_dict() for v in self.violations[:VIOLATIONS_SHOWN_MAX]],
                "history": str(self.history_path), "dir": str(self.run_dir),
                "replay": f"python -m tests.chaos.run --seed {self.seed}"}

    def failure_message(self) -> str:
        lines = [f"chaos seed {self.seed}: {len(self.violations)} violations "
                 f"(replay: python -m tests.chaos.run --seed {self.seed}; "
                 f"history: {self.history_path})"]
        lines += [f"  [{v.check}] log {v.log}: {v.detail}"
                  for v in self.violations[:VIOLATIONS_SHOWN_MAX]]
        return "\n".join(lines)


def _say(seed: int, text: str) -> None:
    print(f"[chaos seed {seed}] {text}", file=sys.stderr, flush=True)


class ChaosCluster:
    """The node processes and the proxy of one run, and the faults that act on them."""

    def __init__(self, root: Path, config: ChaosConfig) -> None:
        self.root = root.resolve()
        self.config = config
        self.proxy: ProxyProcess | None = None
        self.incarnations: dict[str, int] = {}
        self.http: dict[str, str] = {}
        self.nodes: list[str] = []
        self.sequencers: list[str] = []
        self.storage: list[str] = []
        self.data_ports: dict[str, int] = {}
        self.fingerprint = ""
        self.paused: set[str] = set()
        self.token: str | None = None

    async def start(self) -> None:
        count = self.config.sequencers + self.config.storage_nodes
        links_count = count * (count - 1)
        # One free range for the nodes' ports and, above them, the proxy's listeners: an
        # ephemeral port picked for a listener could be one a node is about to bind.
        base_port = lc.free_base_port(count + (links_count + 1) // 2)
        spec = lc.LocalClusterSpec(
            dir=self.root, storage_nodes=self.config.storage_nodes,
            sequencers=self.config.sequencers, replication=self.config.replication,
            base_port=base_port, fsync="always", sequencer=SEQUENCER, gossip=FAST_GOSSIP,
            auth=token_cli.write_local_auth(self.root) if self.config.auth else AuthConfig())
        self.token = token_cli.local_admin_token(self.root) if self.config.auth else None
        configs = lc.plan(spec)
        cluster = configs[0].cluster
        self.fingerprint = cluster.fingerprint()
        self.nodes = [c.node_id for c in configs]
        self.sequencers = [n.node_id for n in cluster.sequencer_nodes]
        self.storage = list(cluster.storage_node_ids)
        self.data_ports = {c.node_id: c.me.data_port for c in configs}
        self.http = {c.node_id: c.me.http_address for c in configs}
        self.proxy = await ProxyProcess.start(str(REPO_ROOT))
        targets = {f"{a}>{b}": (spec.host, self.data_ports[b])
                   for a in self.nodes for b in self.nodes if a != b}
        listen = {name: base_port + 2 * count + i for i, name in enumerate(targets)}
        ports = await self.proxy.add_links(targets, listen)
        peer_addresses = {a: {b: f"{spec.host}:{ports[f'{a}>{b}']}"
                              for b in self.nodes if b != a} for a in self.nodes}
        spec = replace(spec, peer_addresses=peer_addresses)
        await asyncio.to_thread(lc.up, spec, ready_timeout_ms=READY_TIMEOUT_MS)
        self.incarnations = dict.fromkeys(self.nodes, 1)

    def incarnation(self, node: str) -> int:
        return self.incarnations[node]

    def _entry(self, node: str) -> lc.NodeEntry:
        state = lc.load_state(self.root)
        assert state is not None
        return next(n for n in state.nodes if n.node_id == node)

    def alive(self, node: str) -> bool:
        return lc.node_alive(self.root, self._entry(node))

    def signal(self, node: str, signum: signal.Signals) -> None:
        entry = self._entry(node)
        if lc.node_alive(self.root, entry):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry.pid, signum)
        if signum == signal.SIGSTOP:
            self.paused.add(node)
        elif signum == signal.SIGCONT:
            self.paused.discard(node)

    async def kill9(self, node: str) -> None:
        self.signal(node, signal.SIGKILL)
        self.paused.discard(node)
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while self.alive(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} survived SIGKILL for {GONE_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S)

    async def restart(self, node: str, env: dict[str, str] | None = None) -> None:
        """Start ``node`` again (it must be down) and wait until it is ready."""
        self.incarnations[node] += 1
        await asyncio.to_thread(lc.restart, self.root, node, extra_env=env,
                                ready_timeout_ms=RESTART_READY_TIMEOUT_MS)

    async def restart_all(self, nodes: list[str]) -> None:
        """Start every node of ``nodes`` (all down) at once and wait until all are ready:
        one after another, the first ones would run alone for a while, which is not a
        full restart."""
        for node in nodes:
            self.incarnations[node] += 1
        await asyncio.to_thread(lc.restart_many, self.root, nodes,
                                ready_timeout_ms=RESTART_READY_TIMEOUT_MS)

    async def set_links(self, links: list[str], mode: LinkMode) -> None:
        assert self.proxy is not None
        if links:
            await self.proxy.set_mode(links, mode)

    async def heal(self) -> None:
        await self.set_links([f"{a}>{b}" for a in self.nodes for b in self.nodes if a != b],
                             PASS)
        for node in self.nodes:
            self.signal(node, signal.SIGCONT)
        for node in self.nodes:
            if not self.alive(node):
                await self.restart(node)

    async def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.signal(node, signal.SIGCONT)
        try:
            if lc.load_state(self.root) is not None:
                await asyncio.to_thread(lc.down, self.root, stop_timeout_ms=STOP_TIMEOUT_MS)
        finally:
            if self.proxy is not None:
                await self.proxy.close()

    async def scan_copies(self, history: History, logs: tuple[int, ...]) -> list[str]:
        """Every copy on every storage node (released or not), over the node protocol as a
        peer reads it, into ``copies`` events; returns the nodes that could not be scanned."""
        pool = PeerPool(node_id=NodeId(self.sequencers[0]),
                        cluster_fingerprint=self.fingerprint, config=TransportConfig(),
                        addresses=lambda n: ("127.0.0.1", self.data_ports[n])
                        if n in self.data_ports else None)
        failed = []
        try:
            for node in self.storage:
                for log in logs:
                    scanned = await self._scan(pool, node, log)
                    if scanned is None:
                        failed.append(f"{node}/log {log}")
                        continue
                    records, markers = scanned
                    history.add("copies", node=node, log=log, records=records,
                                markers=markers)
        finally:
            await pool.close()
        return failed

    async def _scan(self, pool: PeerPool, node: str, log: int
                    ) -> tuple[list[list[Any]], list[list[int]]] | None:
        """Every copy ``node`` holds of ``log``, released or not, as recovery's digest reads
        them (a READ serves nothing above the node's release pointer): records, and the
        copies recovery wrote as ``[first, last, flags, wave]`` markers."""
        state = await pool.call(NodeId(node), GetLogState(log_id=LogId(log)),
                                SCAN_CALL_TIMEOUT_MS)
        if type(state) is not LogState or state.status is not Status.OK:
            return None
        records: list[list[Any]] = []
        markers: list[list[int]] = []
        for epoch in range(1, lsn_to_epoch(state.last_lsn) + 1):
            esn = 0
            while esn <= ESN_MAX:
                reply = await pool.call(NodeId(node), GetDigest(
                    log_id=LogId(log), epoch=Epoch(epoch), from_esn=Esn(esn),
                    seal_epoch=EPOCH_MAX, records_max=SCAN_RECORDS_MAX, bytes_max=1 << 24),
                    SCAN_CALL_TIMEOUT_MS)
                if type(reply) is not Digest or reply.status is not Status.OK:
                    return None
                for entry_esn, flags, wave, _, _, payload, _ in reply.entries:
                    lsn = compose_lsn(Epoch(epoch), Esn(entry_esn))
                    if not flags & RecordFlags.HOLE:
                        records.append([int(lsn), payload_text(payload)])
                    if flags:
                        markers.append([int(lsn), int(lsn), int(flags), int(wave)])
                if reply.next_esn <= esn:
                    break
                esn = reply.next_esn
        return records, markers


class FaultRunner:
    """Carries out a schedule, one fault at a time, recording each in the history."""

    def __init__(self, cluster: ChaosCluster, history: History, say: Callable[[str], None]):
        self.cluster = cluster
        self.history = history
        self.say = say
        self.failpoints_fired: list[str] = []

    async def run(self, faults: list[Fault], phase_start_s: float) -> None:
        loop = asyncio.get_running_loop()
        for fault in faults:
            wait_s = phase_start_s + fault.at_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self.history.add("fault", phase="start", **fault.as_dict())
            self.say(f"t={self.history.now():.1f} {fault.action} {','.join(fault.nodes)} "
                     f"{fault.mode or fault.failpoint} {fault.duration_s}s")
            result = await self.apply(fault)
            self.history.add("fault", phase="end", action=fault.action, nodes=fault.nodes,
                             **result)

    async def apply(self, fault: Fault) -> dict[str, Any]:
        cluster = self.cluster
        node = fault.nodes[0]
        if fault.action == "kill":
            await cluster.kill9(node)
            await asyncio.sleep(fault.duration_s)
            await cluster.restart(node)
        elif fault.action == "killall":
            # All at once, as a power cut would: no node sees the others go one by one.
            for each in fault.nodes:
                cluster.signal(each, signal.SIGKILL)
            await asyncio.gather(*(cluster.kill9(each) for each in fault.nodes))
            await asyncio.sleep(fault.duration_s)
            await cluster.restart_all(list(fault.nodes))
        elif fault.action == "pause":
            cluster.signal(node, signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.duration_s)
            finally:
                cluster.signal(node, signal.SIGCONT)
        elif fault.action in ("isolate", "split", "oneway", "delay"):
            links = links_of(cluster.nodes, fault)
            await cluster.set_links(links, LinkMode(cast(Mode, fault.mode), fault.delay_ms))
            try:
                await asyncio.sleep(fault.duration_s)
            finally:
                await cluster.set_links(links, PASS)
        elif fault.action == "failpoint":
            return await self._failpoint(fault)
        elif fault.action == "wipe":
            return await self._wipe(fault)
        else:
            raise ValueError(f"unknown fault {fault.action!r}")
        return {}

    async def _wipe(self, fault: Fault) -> dict[str, Any]:
        """A replaced disk: kill -9, delete the data directory's contents but the config and
        the log, restart, then wait (up to ``WIPE_REBUILD_S_MAX``) until the cluster state says the
        node's shard is AUTHORITATIVE again, rebuilt."""
        cluster = self.cluster
        node = fault.nodes[0]
        http = cluster.http[node]
        before = await asyncio.to_thread(_rebuilds, http, node)
        await cluster.kill9(node)
        data_dir = lc.config_path(cluster.root, node).parent
        for path in await asyncio.to_thread(lambda: list(data_dir.iterdir())):
            if path.name in ("config.json", "node.log"):
                continue
            if path.is_dir():
                await asyncio.to_thread(shutil.rmtree, path)
            else:
                await asyncio.to_thread(path.unlink)
        started = time.monotonic()
        await cluster.restart(node)
        rebuilt = False
        while time.monotonic() - started < WIPE_REBUILD_S_MAX:
            count = await asyncio.to_thread(_rebuilds, http, node)
            if count is not None and before is not None and count > before:
                rebuilt = True
                break
            await asyncio.sleep(0.5)
        return {"rebuilt": rebuilt, "rebuild_s": round(time.monotonic() - started, 1)}

    async def _failpoint(self, fault: Fault) -> dict[str, Any]:
        cluster = self.cluster
        node = fault.nodes[0]
        failpoints.parse(fault.failpoint)  # a bad spec is the harness's bug: fail here
        await cluster.kill9(node)
        fired = False
        try:
            await cluster.restart(node, {failpoints.ENV_VAR: fault.failpoint})
        except lc.LocalClusterError:
            fired = True  # it died before it was ready
        deadline = time.monotonic() + fault.duration_s
        while not fired and time.monotonic() < deadline:
            if not cluster.alive(node):
                fired = True
                break
            await asyncio.sleep(POLL_S)
        evidence = ""
        if fired:
            evidence = next((line for line in reversed(lc.log_tail(cluster.root, node, 50)
                                                       .splitlines())
                             if line.startswith("failpoint ")), "")
            self.failpoints_fired.append(f"{node}: {evidence or fault.failpoint}")
        else:
            await cluster.kill9(node)
        await cluster.restart(node)
        return {"fired": fired, "evidence": evidence}


async def _wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S * 4)
    return True


def _max_acked(history: History) -> dict[int, int]:
    ops = checkers.ops(history.events)
    found: dict[int, int] = {}
    for op in ops.values():
        if op.outcome == "ok" and op.lsns:
            found[op.log] = max(found.get(op.log, 0), max(op.lsns))
    return found


def _rebuilds(http: str, node: str) -> int | None:
    """How many rebuilds of ``node`` finished and left it AUTHORITATIVE (None: unknown)."""
    try:
        with urllib.request.urlopen(f"http://{http}/v1/cluster", timeout=5) as answer:
            shards = json.loads(answer.read()).get("shards") or []
    except (OSError, ValueError):
        return None
    for shard in shards:
        if shard.get("node_id") == node:
            if shard.get("status") != "AUTHORITATIVE":
                return -1
            return int(shard.get("rebuilds_count", 0))
    return 0


class HarnessError(Exception):
    """The run itself failed (a node that cannot start, the proxy gone); names the seed."""


async def run(config: ChaosConfig, run_dir: Path) -> ChaosResult:
    """One chaos run in ``run_dir`` (created). Violations are in the result; only a failure
    of the harness itself raises, as ``HarnessError`` naming the seed and the run directory."""
    try:
        return await _run(config, run_dir)
    except Exception as exc:
        raise HarnessError(f"chaos seed {config.seed}: the harness failed: "
                           f"{type(exc).__name__}: {exc} (run dir {run_dir}; replay: python -m "
                           f"tests.chaos.run --seed {config.seed})") from exc


async def _run(config: ChaosConfig, run_dir: Path) -> ChaosResult:
    await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)

    def say(text: str) -> None:
        _say(config.seed, text)

    say(f"run in {run_dir}")
    history = History(run_dir / "history.jsonl")
    cluster = ChaosCluster(run_dir / "cluster", config)
    workload: Workload | None = None
    runner: FaultRunner | None = None
    try:
        await cluster.start()
        faults = schedule(config.seed, config.duration_s, cluster.sequencers, cluster.storage,
                          config.replication, disk_faults=config.disk_faults)
        history.add("meta", seed=config.seed, replication=config.replication,
                    logs=list(config.workload.logs), nodes=cluster.nodes,
                    storage_nodes=cluster.storage, sequencers=cluster.sequencers,
                    duration_s=config.duration_s, faults=[f.as_dict() for f in faults])
        say(f"cluster up: {cluster.nodes}, R={config.replication}, {len(faults)} faults")
        workload = Workload(history, cluster.http, entry_nodes=cluster.nodes,
                            read_nodes=cluster.nodes, incarnation=cluster.incarnation,
                            settings=config.workload, seed=config.seed, token=cluster.token)
        await workload.start()
        await asyncio.sleep(config.warmup_s)
        runner = FaultRunner(cluster, history, say)
        await runner.run(faults, asyncio.get_running_loop().time())
        say("healing")
        await cluster.heal()
        await asyncio.sleep(config.after_heal_s)
        await workload.stop_writers(APPEND_TIMEOUT_S + 5)
        history.add("end")
        acked = _max_acked(history)
        seen = workload.release_seen
        released = await _wait_until(
            lambda: all(seen.get(log, 0) >= lsn for log, lsn in acked.items()),
            config.settle_timeout_s)
        release = dict(seen)
        caught_up = await _wait_until(
            lambda: all(workload.reader_cursors[name] > release.get(log, 0)
                        for name, log in workload.reader_logs.items()),
            config.settle_timeout_s)
        await workload.stop_readers(READERS_STOP_TIMEOUT_S)
        say(f"settled: release reached the acks: {released}, readers caught up: {caught_up}")
        unscanned = await cluster.scan_copies(history, config.workload.logs)
        readers = await compare_readers([f"http://{h}" for h in cluster.http.values()],
                                        config.workload.logs, token=cluster.token)
        say(f"direct reader vs HTTP: {readers}")
        assert cluster.proxy is not None
        links = await cluster.proxy.stats()
        extra = {
            "read_errors": workload.read_errors, "tail_errors": workload.tail_errors,
            "failpoints_fired": runner.failpoints_fired, "release_reached_acks": released,
            "faults": dict(Counter(f.action for f in faults)),
            "readers_caught_up": caught_up, "unscanned": unscanned,
            "links": len(links),
            "links_carrying_traffic": sum(1 for s in links.values() if s["bytes_forwarded"]),
            **readers,
        }
        history.add("settle", **extra)
    finally:
        if workload is not None:
            await workload.close()
        await cluster.stop()
        history.close()
    violations = checkers.check(history.events)
    figures = checkers.figures(history.events, violations)
    figures.update(extra)
    result = ChaosResult(config.seed, run_dir, history.path, figures, violations)
    await asyncio.to_thread((run_dir / "summary.json").write_text,
                            json.dumps(result.summary(), indent=2) + "\n")
    return result
