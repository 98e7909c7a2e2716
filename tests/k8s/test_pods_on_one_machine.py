"""The rendered manifests, run as "pods on one machine" (see pods_on_one_machine.py for what
is simulated and how): the cluster forms, gossip elects each log's sequencer, appends and
reads work through the client Service, and a rolling restart of every pod, one at a time
(ZooKeeper, then storage, then sequencers, each StatefulSet from its highest ordinal down, as
Kubernetes rolls them), under append load loses no acknowledged record. Each stopped Seqlog
pod must exit cleanly within its own shutdown bound, long before the kubelet's SIGKILL, and
its peers must learn at once that it is going away.

The dev overlay runs in the default suite (about 35 s on an idle machine); the prod overlay
(3 ZooKeeper servers, 5 storage nodes, 3 sequencers) runs with ``--run-slow``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import itertools
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from k8s_support import render
from pods_on_one_machine import Pod, PodError, PodsOnOneMachine

from epoch_store import read_log_state
from shared.routing import routable_sequencers, sequencer_for
from shared.security.tokens import mint, new_key
from shared.status import Status
from shared.types import LogId, NodeId

READY_TIMEOUT_S = 90.0
VIEW_TIMEOUT_S = 30.0
PROGRESS_TIMEOUT_S = 30.0
ANNOUNCE_DEADLINE_S = 2.5
"""A peer must see a SIGTERMed node DEAD this soon. Without the shutdown announcement the
failure detector would need gossip_threshold_intervals x gossip_interval_ms = 3 s of silence."""
HTTP_TIMEOUT_S = 10.0
LOGS = 6
WRITERS = 4
WRITER_PAUSE_S = 0.01
"""Pacing between one writer's appends, so the load leaves CPU for 6-11 processes."""
APPENDS_MAX = 200_000
ACKS_PER_STEP = 20
"""Appends that must be acknowledged after each pod's restart before the next one starts."""
READ_PAGE = 1000


def _auth_headers() -> dict[str, str]:
    """The prod overlay runs with auth on: requests carry the token the fixture set."""
    token = os.environ.get("SEQLOG_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _provision_auth_secret(docs: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """What an operator does before deploying prod (k8s/overlays/prod/auth-secret.yaml):
    a real key and admin token in the seqlog-auth Secret; clients get the token."""
    secrets = [d for d in docs if d["kind"] == "Secret" and
               d["metadata"]["name"] == "seqlog-auth"]
    if not secrets:
        return
    key = new_key()
    token = mint(key.encode(), "admin", ttl_s=3600)
    secrets[0]["stringData"] = {
        "keys.txt": key + "\n", "admin.token": token + "\n",
        "permissions.json": json.dumps({"principals": {"admin": {"grants": ["admin"]}}})}
    monkeypatch.setenv("SEQLOG_TOKEN", token)


@pytest.fixture(params=["dev", pytest.param("prod", marks=pytest.mark.slow)])
def pods(request: pytest.FixtureRequest, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[PodsOnOneMachine]:
    docs = render(f"overlays/{request.param}")
    _provision_auth_secret(docs, monkeypatch)
    cluster = PodsOnOneMachine(docs, tmp_path)
    try:
        cluster.start_all(timeout_s=READY_TIMEOUT_S)
    except PodError as exc:
        cluster.close()
        pytest.fail(f"pods did not start:\n{exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


def _seqlog_pods(pods: PodsOnOneMachine) -> list[Pod]:
    return pods.by_component("sequencer") + pods.by_component("storage")


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
        assert resp.status == 200, f"GET {url}: {resp.status} {await resp.text()}"
        return await resp.json()


async def _views(session: aiohttp.ClientSession, pods: list[Pod]) -> dict[str, dict[str, str]]:
    views = {}
    for pod in pods:
        cluster = await _get(session, f"http://{pod.http}/v1/cluster")
        views[pod.name] = {n["node_id"]: n["state"] for n in cluster["nodes"]}
    return views


async def _wait_views(session: aiohttp.ClientSession, pods: list[Pod], node: str,
                      states: set[str]) -> float:
    """Poll until every pod in ``pods`` sees ``node`` in one of ``states``; returns seconds."""
    started_s = time.monotonic()
    while True:
        views = await _views(session, pods)
        if all(v[node] in states for v in views.values()):
            return time.monotonic() - started_s
        if time.monotonic() - started_s > VIEW_TIMEOUT_S:
            raise AssertionError(f"{node} not {states} in every view: {views}")
        await asyncio.sleep(0.02)


async def _append(session: aiohttp.ClientSession, http: str, log: int, payload: bytes
                  ) -> tuple[int, Any, str | None]:
    async with session.post(
            f"http://{http}/v1/logs/{log}/append",
            json={"payload": base64.b64encode(payload).decode()},
            timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
        return resp.status, await resp.json(), resp.headers.get("X-Seqlog-Sequencer")


async def test_cluster_forms_elects_sequencers_and_serves_appends(
        pods: PodsOnOneMachine) -> None:
    seqlog = _seqlog_pods(pods)
    sequencers = pods.by_component("sequencer")
    names = {p.name for p in seqlog}
    async with aiohttp.ClientSession(headers=_auth_headers()) as session:
        for pod in seqlog:
            await _wait_views(session, seqlog, pod.name, {"ALIVE"})
        views = await _views(session, seqlog)
        assert all(set(v) == names for v in views.values())
        # Every node's view routes each log to the same sequencer pod, and the log's appends
        # are sequenced there, whichever sequencer pod the Service picked.
        cluster = await _get(session, f"http://{sequencers[0].http}/v1/cluster")
        weights = [(NodeId(n["node_id"]), float(n["sequencer_weight"]))
                   for n in cluster["nodes"] if "sequencer" in n["roles"]]
        states = {NodeId(n["node_id"]): n["state"] for n in cluster["nodes"]}
        owners = {}
        for log in range(1, 4 * len(sequencers) + 1):
            expected = sequencer_for(LogId(log), routable_sequencers(weights, states))
            entry = random.choice(sequencers)
            status, body, sequencer = await _append(session, entry.http, log, b"x%d" % log)
            assert status == 200, body
            assert sequencer == expected
            owners[log] = (sequencer, body["lsn"])
            tail = await _get(session, f"http://{sequencers[-1].http}/v1/logs/{log}/tail")
            assert tail["sequencer"] == expected
        assert {o for o, _ in owners.values()} == {p.name for p in sequencers}
        for log, (_, lsn) in owners.items():
            for reader in sequencers:
                page = await _get(session, f"http://{reader.http}/v1/logs/{log}/records"
                                           f"?from=1&wait_ms=5000")
                assert [(r["lsn"], base64.b64decode(r["payload"])) for r in page["records"]] == [
                    (lsn, b"x%d" % log)]
        # The epochs live in the ZooKeeper pod(s).
        zookeeper = pods.by_component("epoch-store")
        url = "zk://" + ",".join(f"{p.ip}:{p.port('client')}" for p in zookeeper) + "/seqlog"
        state = await asyncio.to_thread(read_log_state, url, LogId(1))
        assert state.status is Status.OK and state.metadata is not None
        # Prometheus finds every Seqlog pod's metrics where the annotations say.
        for pod in seqlog:
            annotations = pod.statefulset["spec"]["template"]["metadata"]["annotations"]
            url = f"http://{pod.ip}:{annotations['prometheus.io/port']}" \
                  f"{annotations['prometheus.io/path']}"
            async with session.get(url) as resp:
                text = await resp.text()
            assert resp.status == 200
            assert f"seqlog_gossip_nodes_alive {float(len(seqlog))}" in text


@dataclass
class AppendLoad:
    """Writers appending through the client Service: each request goes to a random ready
    sequencer pod (kube-proxy's choice), which forwards it to the log's sequencer."""

    endpoints: list[str]
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)
    ack_times_s: list[float] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    refused: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, session: aiohttp.ClientSession, writer: int) -> None:
        count = 0
        while not self.stop.is_set() and len(self.acked) < APPENDS_MAX:
            log = 1 + (writer + count) % LOGS
            payload = f"w{writer}-{count}".encode()
            try:
                status, body, _ = await _append(session, random.choice(self.endpoints), log,
                                                payload)
            except aiohttp.ClientConnectorError:
                status, body = 0, None  # nothing was sent: try the same append again
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, body = -1, repr(exc)
            if status == 200:
                self.acked.append((log, body["lsn"], payload))
                self.ack_times_s.append(time.monotonic())
                count += 1
            elif status in (0, 429, 503):
                self.refused += 1  # nothing written (API contract); the same payload again
            else:
                # Outcome unknown (504, 500, connection lost after sending): never counted
                # as acknowledged.
                self.unknown.append(f"{status} {body}")
                count += 1
            await asyncio.sleep(WRITER_PAUSE_S)

    async def wait_acked(self, count: int) -> None:
        deadline_s = time.monotonic() + PROGRESS_TIMEOUT_S
        while len(self.acked) < count:
            if time.monotonic() > deadline_s:
                raise AssertionError(f"appends stalled: {len(self.acked)} acknowledged, "
                                     f"{self.refused} refused, {len(self.unknown)} unknown")
            await asyncio.sleep(0.05)

    def longest_stall_s(self) -> float:
        times = sorted(self.ack_times_s)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def _read_log(session: aiohttp.ClientSession, http: str, log: int, upto_lsn: int
                    ) -> tuple[dict[int, bytes], list[dict[str, Any]]]:
    """Every record and gap of ``log`` from LSN 1 through ``upto_lsn`` (waiting for the
    release point to get there)."""
    records: dict[int, bytes] = {}
    gaps: list[dict[str, Any]] = []
    next_lsn = 1
    deadline_s = time.monotonic() + PROGRESS_TIMEOUT_S
    while next_lsn <= upto_lsn:
        assert time.monotonic() < deadline_s, f"log {log} not readable up to {upto_lsn}"
        page = await _get(session, f"http://{http}/v1/logs/{log}/records"
                                   f"?from={next_lsn}&limit={READ_PAGE}&wait_ms=1000")
        for record in page["records"]:
            records[record["lsn"]] = base64.b64decode(record["payload"])
        gaps += page["gaps"]
        next_lsn = page["next_lsn"]
    return records, gaps


async def test_rolling_restart_under_load_loses_no_acknowledged_record(
        pods: PodsOnOneMachine) -> None:
    seqlog = _seqlog_pods(pods)
    sequencers = pods.by_component("sequencer")
    load = AppendLoad(endpoints=[p.http for p in sequencers])
    steps = []
    async with aiohttp.ClientSession(headers=_auth_headers()) as session:
        writers = [asyncio.create_task(load.run(session, w)) for w in range(WRITERS)]
        try:
            await load.wait_acked(ACKS_PER_STEP)
            order = [*reversed(pods.by_component("epoch-store")),
                     *reversed(pods.by_component("storage")), *reversed(sequencers)]
            for pod in order:
                steps.append(await _restart(pods, pod, session, load, seqlog))
                await load.wait_acked(len(load.acked) + ACKS_PER_STEP)
        finally:
            load.stop.set()
            await asyncio.gather(*writers, return_exceptions=True)
        last_lsn: dict[int, int] = {}
        for log, lsn, _ in load.acked:
            last_lsn[log] = max(last_lsn.get(log, 0), lsn)
        lost = []
        for log, upto in last_lsn.items():
            records, gaps = await _read_log(session, random.choice(sequencers).http, log, upto)
            assert not [g for g in gaps if g["type"] == "DATALOSS"], gaps
            lost += [(log, lsn, payload) for lg, lsn, payload in load.acked
                     if lg == log and records.get(lsn) != payload]
    print(f"rolling restart: {len(load.acked)} appends acknowledged, {load.refused} refused "
          f"(retried), {len(load.unknown)} unknown outcome {load.unknown[:3]}; longest stall "
          f"between acks {load.longest_stall_s():.2f} s; steps: {steps}")
    assert lost == [], f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"


async def _restart(pods: PodsOnOneMachine, pod: Pod, session: aiohttp.ClientSession,
                   load: AppendLoad, seqlog: list[Pod]) -> dict[str, Any]:
    """One step of a rolling update: the pod leaves the Service's endpoints and gets SIGTERM;
    a new pod with the same name and volume claim starts; the step ends when it is ready and
    every peer sees it again (Kubernetes waits minReadySeconds for that)."""
    step: dict[str, Any] = {"pod": pod.name}
    if not pod.is_zookeeper and pod.http in load.endpoints and len(load.endpoints) > 1:
        load.endpoints.remove(pod.http)
    peers = [p for p in seqlog if p is not pod]
    started_s = await asyncio.to_thread(pods.terminate, pod)
    if not pod.is_zookeeper:
        step["dead_after_s"] = round(await _wait_views(session, peers, pod.name, {"DEAD"}), 3)
        assert step["dead_after_s"] < ANNOUNCE_DEADLINE_S, step
        result = await asyncio.to_thread(pods.wait_stopped, pod, started_s)
        env = pods.container_env(pod)
        bound_s = int(env["SEQLOG_SHUTDOWN_TIMEOUT_MS"]) / 1000
        step["stopped_after_s"] = round(result.seconds, 3)
        assert not result.killed and result.exit_code == 0, (step, pod.log_tail())
        assert result.seconds < bound_s, step
    await asyncio.to_thread(pods.start, pod)
    await asyncio.to_thread(pods.wait_ready, [pod], timeout_s=READY_TIMEOUT_S)
    if not pod.is_zookeeper:
        await _wait_views(session, peers, pod.name, {"ALIVE", "SUSPECT"})
        if pod.http not in load.endpoints:
            load.endpoints.append(pod.http)
    step["acked_so_far"] = len(load.acked)
    return step


async def test_adding_a_storage_node_by_config_change_and_full_restart(
        pods: PodsOnOneMachine) -> None:
    """The scale-out procedure of docs/DEPLOY.md as the code supports it today: the storage
    StatefulSet and SEQLOG_STORAGE_REPLICAS grow together, and since nodes with different
    cluster configs refuse each other, every Seqlog pod restarts at once. Existing logs keep
    all their records and take the new node into their nodeset at their next epoch (the
    earlier epochs stay on the old nodeset); logs provisioned after the change use it too."""
    sequencers = pods.by_component("sequencer")
    storage_before = [p.name for p in pods.by_component("storage")]
    async with aiohttp.ClientSession(headers=_auth_headers()) as session:
        acked = []
        for log in (1, 2, 3):
            status, body, _ = await _append(session, sequencers[0].http, log, b"before")
            assert status == 200, body
            acked.append((log, body["lsn"]))
        docs = copy.deepcopy(pods.docs)
        storage = next(d for d in docs if d["kind"] == "StatefulSet"
                       and d["metadata"]["name"] == "seqlog-storage")
        storage["spec"]["replicas"] += 1
        for configmap in (d for d in docs if d["kind"] == "ConfigMap"
                          and "SEQLOG_STORAGE_REPLICAS" in d.get("data", {})):
            configmap["data"]["SEQLOG_STORAGE_REPLICAS"] = str(storage["spec"]["replicas"])
        running = _seqlog_pods(pods)
        started = [await asyncio.to_thread(pods.terminate, p) for p in running]
        for pod, started_s in zip(running, started, strict=True):
            result = await asyncio.to_thread(pods.wait_stopped, pod, started_s)
            assert not result.killed and result.exit_code == 0
        added = pods.reconfigure(docs)
        assert [p.name for p in added] == [f"seqlog-storage-{len(storage_before)}"]
        await asyncio.to_thread(pods.check_ports_free, added)
        seqlog = _seqlog_pods(pods)
        for pod in seqlog:
            await asyncio.to_thread(pods.start, pod)
        await asyncio.to_thread(pods.wait_ready, seqlog, timeout_s=READY_TIMEOUT_S)
        for pod in seqlog:
            await _wait_views(session, seqlog, pod.name, {"ALIVE"})
        zookeeper = pods.by_component("epoch-store")
        url = "zk://" + ",".join(f"{p.ip}:{p.port('client')}" for p in zookeeper) + "/seqlog"
        for log, lsn in acked:
            status, body, _ = await _append(session, sequencers[-1].http, log, b"after")
            assert status == 200, body
            assert body["lsn"] >> 32 > lsn >> 32  # a new epoch
            records, _ = await _read_log(session, sequencers[0].http, log, body["lsn"])
            assert records[lsn] == b"before" and records[body["lsn"]] == b"after"
            state = await asyncio.to_thread(read_log_state, url, LogId(log))
            assert state.metadata is not None
            assert list(state.metadata.nodeset) == [*storage_before, added[0].name]
            assert list(state.metadata.nodeset_ranges()[0].nodeset) == storage_before
        status, body, _ = await _append(session, sequencers[0].http, 100, b"new log")
        assert status == 200, body
        state = await asyncio.to_thread(read_log_state, url, LogId(100))
        assert state.metadata is not None
        assert list(state.metadata.nodeset) == [*storage_before, added[0].name]


STUCK_SHUTDOWN_TIMEOUT_MS = 3_000
EXIT_SLACK_S = 1.0
"""Interpreter teardown after the shutdown bound has cut the graceful shutdown short."""


async def test_a_stuck_node_still_exits_within_its_shutdown_bound(tmp_path: Path) -> None:
    """SIGTERM while appends cannot complete (every storage pod frozen with SIGSTOP): the
    sequencer's graceful shutdown cannot finish its drain, yet the process is gone within
    SEQLOG_SHUTDOWN_TIMEOUT_MS (set to 3 s here), never reaching the kubelet's SIGKILL."""
    docs = copy.deepcopy(render("overlays/dev"))
    for configmap in (d for d in docs if d["kind"] == "ConfigMap"
                      and "SEQLOG_SHUTDOWN_TIMEOUT_MS" in d.get("data", {})):
        configmap["data"]["SEQLOG_SHUTDOWN_TIMEOUT_MS"] = str(STUCK_SHUTDOWN_TIMEOUT_MS)
    pods = PodsOnOneMachine(docs, tmp_path)
    frozen: list[int] = []
    try:
        await asyncio.to_thread(pods.start_all, timeout_s=READY_TIMEOUT_S)
        sequencer = pods.by_component("sequencer")[0]
        async with aiohttp.ClientSession(headers=_auth_headers()) as session:
            status, body, _ = await _append(session, sequencer.http, 1, b"warm")
            assert status == 200, body
            for pod in pods.by_component("storage"):
                assert pod.process is not None
                os.kill(pod.process.pid, signal.SIGSTOP)
                frozen.append(pod.process.pid)
            stuck = [asyncio.create_task(_append(session, sequencer.http, log, b"stuck"))
                     for log in (1, 2, 3)]
            deadline_s = time.monotonic() + VIEW_TIMEOUT_S
            while True:
                async with session.get(f"http://{sequencer.http}/metrics") as resp:
                    metrics = await resp.text()
                if "seqlog_sequencer_appends_in_flight 0.0" not in metrics:
                    break
                assert time.monotonic() < deadline_s, "the appends never got in flight"
                await asyncio.sleep(0.05)
            started_s = await asyncio.to_thread(pods.terminate, sequencer)
            result = await asyncio.to_thread(pods.wait_stopped, sequencer, started_s)
            await asyncio.gather(*stuck, return_exceptions=True)
        print(f"stuck shutdown: {result}")
        assert not result.killed
        assert result.seconds < STUCK_SHUTDOWN_TIMEOUT_MS / 1000 + EXIT_SLACK_S, result
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await asyncio.to_thread(pods.close)
