"""Runs rendered Kubernetes manifests as local processes: "pods on one machine".

Every pod of every StatefulSet becomes one process with the container's command and the
environment the kubelet would give it, and each pod gets its own loopback address (its "pod
IP", in a random 127.a.b.0/24), so all pods keep the manifests' container ports. What a
cluster would provide is simulated as follows; nothing else is changed:

- **Environment**: ``envFrom`` ConfigMaps, then ``env`` in order, with ``$(VAR)`` expansion
  and ``$$`` escapes as the kubelet does; ``fieldRef`` gives the pod name, namespace and IP.
- **Volumes**: each volume mount becomes a directory; paths under a mount in the environment
  (and in zoo.cfg) point there. A ConfigMap or Secret volume holds one file per key, an
  ``emptyDir`` is emptied when its pod restarts, a ``volumeClaimTemplates`` claim keeps its
  data across restarts of its pod (a PersistentVolumeClaim) unless ``replace_claims`` gives
  the pod new, empty ones (a deleted claim, a lost volume).
- **DNS and Services**: ``SEQLOG_CONNECT_TO`` maps every name a pod would resolve (pod names
  under a headless Service, ClusterIP Services with their endpoints) to the pods' addresses,
  and ``SEQLOG_LISTEN_HOST`` is the pod IP instead of ``0.0.0.0`` (pods here share one network
  namespace). ``python`` in a command is this interpreter, with the repository on
  ``PYTHONPATH`` (the image has the project installed instead).
- **ZooKeeper**: the official image's entrypoint cannot run here, so each ZooKeeper pod runs
  Debian's ZooKeeper (``epoch_store.zk_server``) on the manifests' zoo.cfg with ``myid`` =
  ordinal + 1 (what the container command does), the server names resolved to pod IPs,
  ``clientPortAddress`` set to the pod IP and ``quorumListenOnAllIPs`` off (shared network
  namespace), and the Prometheus metrics provider removed (Debian does not ship it). Its
  readiness is the manifests' exec probe, run with ``127.0.0.1`` replaced by the pod IP.
- **Probes and termination**: readiness is the ``httpGet`` readiness probe; stopping a pod
  sends SIGTERM and waits ``terminationGracePeriodSeconds`` before SIGKILL, which the
  caller sees (``StopResult.killed``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from k8s_support import REPO_ROOT, Manifest, configmap_by_ref, container, pod_spec

from epoch_store import zk_server

POLL_S = 0.05
PROBE_TIMEOUT_S = 2.0


def secret_files(docs: list[Manifest], name: str) -> dict[str, bytes]:
    """The files of the Secret ``name``: its ``stringData`` and base64 ``data``."""
    found = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    if len(found) != 1:
        raise PodError(f"no Secret named {name}")
    files = {k: base64.b64decode(v) for k, v in (found[0].get("data") or {}).items()}
    files.update({k: v.encode() for k, v in (found[0].get("stringData") or {}).items()})
    return files


class PodError(Exception):
    """A pod could not be started, become ready or be stopped; the message says why."""


@dataclass
class Pod:
    name: str
    ordinal: int
    ip: str
    statefulset: Manifest
    dir: Path
    process: subprocess.Popen[bytes] | None = None
    zookeeper: zk_server.ServerHandle | None = None
    starts: int = 0

    @property
    def spec(self) -> Manifest:
        return pod_spec(self.statefulset)

    @property
    def container(self) -> Manifest:
        return container(self.statefulset)

    @property
    def is_zookeeper(self) -> bool:
        return bool(self.statefulset["metadata"]["labels"].get("app.kubernetes.io/name")
                    == "zookeeper")

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.statefulset["spec"]["template"]["metadata"]["labels"]
        return labels

    @property
    def namespace(self) -> str:
        return str(self.statefulset["metadata"].get("namespace", "default"))

    def port(self, name_or_number: str | int) -> int:
        if isinstance(name_or_number, int):
            return name_or_number
        for port in self.container.get("ports", []):
            if port.get("name") == name_or_number:
                return int(port["containerPort"])
        raise PodError(f"{self.name}: no container port named {name_or_number}")

    @property
    def http(self) -> str:
        return f"{self.ip}:{self.port('http')}"

    def running(self) -> bool:
        if self.zookeeper is not None:
            return zk_server.alive(self.zookeeper)
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        path = self.dir / ("zk/zk.log" if self.is_zookeeper else "container.log")
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return f"(no log at {path})"
        return f"--- {path} ---\n" + "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class StopResult:
    seconds: float
    killed: bool
    exit_code: int | None


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is ``$``,
    anything else stays as written."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i):
            end = value.find(")", i)
            name = value[i + 2:end] if end != -1 else ""
            if end != -1 and name in env:
                out.append(env[name])
                i = end + 1
            else:
                out.append("$(")
                i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


@dataclass
class PodsOnOneMachine:
    docs: list[Manifest]
    root: Path
    pods: list[Pod] = field(default_factory=list)
    network: str = ""
    connect_to: str = ""

    def __post_init__(self) -> None:
        rng = random.Random()
        self.network = f"127.{rng.randrange(64, 250)}.{rng.randrange(0, 256)}"
        statefulsets = [d for d in self.docs if d["kind"] == "StatefulSet"]
        index = 0
        for sts in statefulsets:
            for ordinal in range(int(sts["spec"]["replicas"])):
                index += 1
                name = f"{sts['metadata']['name']}-{ordinal}"
                self.pods.append(Pod(name=name, ordinal=ordinal, ip=f"{self.network}.{index}",
                                     statefulset=sts, dir=self.root / name))
        self.connect_to = self._connect_to()

    def reconfigure(self, docs: list[Manifest]) -> list[Pod]:
        """Adopt re-rendered manifests (what ``kubectl apply`` of an edited overlay does):
        existing pods keep their names, IPs and volumes and take the new templates when they
        next start; pods of new ordinals are added (returned) and not started."""
        existing = {p.name: p for p in self.pods}
        index = len(self.pods)
        pods, added = [], []
        for sts in (d for d in docs if d["kind"] == "StatefulSet"):
            for ordinal in range(int(sts["spec"]["replicas"])):
                name = f"{sts['metadata']['name']}-{ordinal}"
                pod = existing.get(name)
                if pod is None:
                    index += 1
                    pod = Pod(name=name, ordinal=ordinal, ip=f"{self.network}.{index}",
                              statefulset=sts, dir=self.root / name)
                    added.append(pod)
                pod.statefulset = sts
                pods.append(pod)
        if len(pods) < len(self.pods):
            raise PodError("scaling down is not simulated")
        self.docs, self.pods = docs, pods
        self.connect_to = self._connect_to()
        return added

    # -- simulated cluster DNS and Services ------------------------------------------------

    def _dns_names(self) -> dict[str, str]:
        """Pod DNS names under their StatefulSet's headless Service -> pod IP."""
        names = {}
        for pod in self.pods:
            service = pod.statefulset["spec"]["serviceName"]
            names[f"{pod.name}.{service}"] = pod.ip
            names[f"{pod.name}.{service}.{pod.namespace}.svc.cluster.local"] = pod.ip
        return names

    def _connect_to(self) -> str:
        entries: dict[str, list[str]] = {}
        dns = self._dns_names()
        for pod in self.pods:
            ports = [int(p["containerPort"]) for p in pod.container.get("ports", [])]
            for name, ip in dns.items():
                if name.startswith(pod.name + "."):
                    for port in ports:
                        entries[f"{name}:{port}"] = [f"{ip}:{port}"]
        for service in (d for d in self.docs if d["kind"] == "Service"):
            if service["spec"].get("clusterIP") == "None":
                continue
            selector = service["spec"]["selector"]
            backends = [p for p in self.pods
                        if all(p.labels.get(k) == v for k, v in selector.items())]
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                entries[f"{service['metadata']['name']}:{port['port']}"] = [
                    f"{p.ip}:{p.port(target)}" for p in backends]
        return ",".join(f"{k}={'|'.join(v)}" for k, v in entries.items())

    def resolve(self, host: str) -> str:
        ip = self._dns_names().get(host)
        if ip is None:
            raise PodError(f"{host} is not a pod DNS name of these manifests")
        return ip

    def by_component(self, component: str) -> list[Pod]:
        return [p for p in self.pods if p.labels.get("app.kubernetes.io/component") == component]

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def replace_claims(self, pod: Pod) -> list[Path]:
        """What deleting a stopped pod's PersistentVolumeClaims (or losing their volumes)
        does: the StatefulSet controller makes new, empty claims from its
        ``volumeClaimTemplates`` when the pod comes back. Returns the claims' directories."""
        if pod.running():
            raise PodError(f"{pod.name} still runs: a bound claim cannot be replaced")
        replaced = []
        for claim in pod.statefulset["spec"].get("volumeClaimTemplates", []):
            path = self.root / "pvc" / f"{claim['metadata']['name']}-{pod.name}"
            shutil.rmtree(path, ignore_errors=True)
            replaced.append(path)
        return replaced

    # -- volumes and environment -----------------------------------------------------------

    def _mounts(self, pod: Pod, *, fresh: bool) -> dict[str, Path]:
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in
                  pod.statefulset["spec"].get("volumeClaimTemplates", [])}
        mounts: dict[str, Path] = {}
        for mount in pod.container.get("volumeMounts", []):
            name = mount["name"]
            if name in claims:
                path = self.root / "pvc" / f"{name}-{pod.name}"
                path.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volumes[name]:
                path = pod.dir / f"configmap-{name}"
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True)
                data = configmap_by_ref(self.docs, volumes[name]["configMap"]["name"])["data"]
                for key, text in data.items():
                    (path / key).write_text(text)
            elif "secret" in volumes[name]:
                path = pod.dir / f"secret-{name}"
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True)
                for key, data in secret_files(self.docs,
                                              volumes[name]["secret"]["secretName"]).items():
                    (path / key).write_bytes(data)
            elif "emptyDir" in volumes[name]:
                path = pod.dir / f"emptydir-{name}"
                if fresh:
                    shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True, exist_ok=True)
            else:
                raise PodError(f"{pod.name}: volume {name} has a kind this harness lacks")
            mounts[mount["mountPath"]] = path
        return mounts

    @staticmethod
    def _translate(value: str, mounts: dict[str, Path]) -> str:
        for mount_path in sorted(mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(mounts[mount_path]) + value[len(mount_path):]
        return value

    def container_env(self, pod: Pod) -> dict[str, str]:
        """The environment the kubelet would give the pod's container (before volume paths
        are mapped)."""
        env: dict[str, str] = {}
        for source in pod.container.get("envFrom", []):
            env.update(configmap_by_ref(self.docs, source["configMapRef"]["name"])["data"])
        fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace,
                  "status.podIP": pod.ip}
        for item in pod.container.get("env", []):
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
            elif "fieldRef" in item["valueFrom"]:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                ref = item["valueFrom"]["configMapKeyRef"]
                env[item["name"]] = configmap_by_ref(self.docs, ref["name"])["data"][ref["key"]]
        return env

    # -- lifecycle -------------------------------------------------------------------------

    def check_ports_free(self, pods: list[Pod] | None = None) -> None:
        busy = []
        for pod in self.pods if pods is None else pods:
            for port in pod.container.get("ports", []):
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        sock.bind((pod.ip, int(port["containerPort"])))
                    except OSError:
                        busy.append(f"{pod.ip}:{port['containerPort']}")
        if busy:
            raise PodError(f"ports already in use: {busy}")

    def start(self, pod: Pod) -> None:
        pod.dir.mkdir(parents=True, exist_ok=True)
        mounts = self._mounts(pod, fresh=True)
        pod.starts += 1
        if pod.is_zookeeper:
            self._start_zookeeper(pod, mounts)
            return
        env = {k: self._translate(v, mounts) for k, v in self.container_env(pod).items()}
        env["SEQLOG_LISTEN_HOST"] = pod.ip
        env["SEQLOG_CONNECT_TO"] = self.connect_to
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(pod.dir),
                "HOSTNAME": pod.name, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1"}
        command = [*pod.container["command"], *pod.container.get("args", [])]
        if command[0] == "python":
            command[0] = sys.executable
        with open(pod.dir / "container.log", "ab") as log:
            pod.process = subprocess.Popen(
                command, env={**base, **env}, cwd=pod.dir, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _start_zookeeper(self, pod: Pod, mounts: dict[str, Path]) -> None:
        conf = self._translate("/conf/zoo.cfg", mounts)
        lines = []
        client_port = 0
        data_dir = ""
        for line in Path(conf).read_text().splitlines():
            key, _, value = line.partition("=")
            key = key.strip()
            if not key or key.startswith("#") or key.startswith("metricsProvider."):
                continue
            if key in ("dataDir", "dataLogDir"):
                value = self._translate(value.strip(), mounts)
                data_dir = value if key == "dataDir" else data_dir
            elif key.startswith("server."):
                host, _, rest = value.partition(":")
                value = f"{self.resolve(host)}:{rest}"
            elif key == "quorumListenOnAllIPs":
                value = "false"
            elif key == "clientPort":
                client_port = int(value)
            lines.append(f"{key}={value}")
        lines.append(f"clientPortAddress={pod.ip}")
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        myid = Path(data_dir) / "myid"
        if not myid.exists():
            myid.write_text(f"{pod.ordinal + 1}\n")
        directory = pod.dir / "zk"
        directory.mkdir(exist_ok=True)
        (directory / zk_server.CONFIG_FILE).write_text("\n".join(lines) + "\n")
        pod.zookeeper = zk_server.launch(directory, client_port, quorum=True)

    def ready(self, pod: Pod) -> bool:
        probe = pod.container["readinessProbe"]
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{pod.ip}:{pod.port(get['port'])}{get['path']}"
            try:
                with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:
                    return 200 <= int(resp.status) < 400
            except (urllib.error.URLError, OSError, ValueError):
                return False
        command = [part.replace("127.0.0.1", pod.ip) for part in probe["exec"]["command"]]
        try:
            return subprocess.run(command, capture_output=True, check=False,
                                  timeout=float(probe.get("timeoutSeconds", 1))).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def wait_ready(self, pods: list[Pod], *, timeout_s: float) -> None:
        deadline_s = time.monotonic() + timeout_s
        pending = list(pods)
        while pending:
            for pod in list(pending):
                if not pod.running():
                    raise PodError(f"{pod.name} exited\n{pod.log_tail()}")
                if self.ready(pod):
                    pending.remove(pod)
            if pending and time.monotonic() > deadline_s:
                raise PodError(f"not ready after {timeout_s} s: {[p.name for p in pending]}\n"
                               f"{pending[0].log_tail()}")
            if pending:
                time.sleep(POLL_S * 2)

    def terminate(self, pod: Pod) -> float:
        """Send SIGTERM (what the kubelet does first); returns the monotonic send time. A
        ZooKeeper pod is stopped here outright."""
        started_s = time.monotonic()
        if pod.zookeeper is not None:
            grace_ms = int(float(pod.spec.get("terminationGracePeriodSeconds", 30)) * 1000)
            zk_server.stop(pod.zookeeper, timeout_ms=grace_ms)
            pod.zookeeper = None
        elif pod.process is not None and pod.process.poll() is None:
            pod.process.send_signal(signal.SIGTERM)
        return started_s

    def wait_stopped(self, pod: Pod, started_s: float) -> StopResult:
        """Wait until ``terminationGracePeriodSeconds`` after ``started_s``, then SIGKILL."""
        grace_s = float(pod.spec.get("terminationGracePeriodSeconds", 30))
        process = pod.process
        if process is None:
            return StopResult(time.monotonic() - started_s, False, None)
        killed = False
        try:
            process.wait(timeout=max(0.0, started_s + grace_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        return StopResult(time.monotonic() - started_s, killed, process.returncode)

    def stop(self, pod: Pod) -> StopResult:
        """SIGTERM, then SIGKILL after the pod's terminationGracePeriodSeconds."""
        return self.wait_stopped(pod, self.terminate(pod))

    def start_all(self, *, timeout_s: float) -> None:
        self.check_ports_free()
        for pod in self.pods:
            self.start(pod)
        self.wait_ready(self.pods, timeout_s=timeout_s)

    def close(self) -> None:
        for pod in self.pods:
            with contextlib.suppress(Exception):
                self.stop(pod)
        for pod in self.pods:
            if pod.process is not None and pod.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.process.pid, signal.SIGKILL)
                pod.process.wait(timeout=10)
