"""Running real ZooKeeper servers on this machine, for the local cluster and the tests.

Uses Debian's ``zookeeper`` package (``apt-get install -y zookeeper``, done by
``scripts/bootstrap.sh``) through ``java`` directly, as tested in
``ecosystem-on-this-machine.md`` §1: ``zkServer.sh`` hard-codes ``/etc`` and ``/var/log`` paths.
A server lives in one directory: ``zoo.cfg``, ``data/`` (with ``myid`` for an ensemble member)
and ``zk.log``. It runs in its own session, so a Ctrl-C of whoever started it does not stop it.
Readiness is the ``srvr`` four-letter word reporting a ``Mode:`` (``ruok`` answers before the
server serves).

Everything here blocks (subprocess, sockets, sleeps while polling): callers on an event loop
use ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from shared.net.local_ports import free_port_block

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
SLF4J_JAR = "/usr/share/java/slf4j-simple.jar"
HEAP_MB_DEFAULT = 256
"""The local server's Java heap: enough for about 100,000 logs (three znodes each); past
about 145,000, provisioning timed out (docs/ZOOKEEPER.md)."""
HEAP_ENV_VAR = "SEQLOG_ZK_HEAP_MB"
"""Overrides ``HEAP_MB_DEFAULT``."""
STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
CONFIG_FILE = "zoo.cfg"
LOG_FILE = "zk.log"
HOST = "127.0.0.1"
_POLL_S = 0.05
_LOG_TAIL_LINES = 25
# Popen objects of servers started by this process, so their exit is reaped.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ZooKeeperServerError(Exception):
    """A server could not be started, reached or stopped; the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """One member of an ensemble on this machine."""

    server_id: int
    client_port: int
    quorum_port: int
    election_port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerHandle:
    dir: Path
    client_port: int
    pid: int

    @property
    def address(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def config_path(self) -> Path:
        return self.dir / CONFIG_FILE


def check_installed() -> None:
    """Raise with the fix if Java or Debian's ZooKeeper jars are missing."""
    if shutil.which("java") is None or not os.path.exists(ZOOKEEPER_JAR):
        raise ZooKeeperServerError(
            f"ZooKeeper is not installed ({ZOOKEEPER_JAR} or java missing): run "
            "`apt-get install -y zookeeper` (scripts/bootstrap.sh does it)")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that are free on the loopback right now (outside the
    ephemeral range, so that a restarted server can bind them again)."""
    base = free_port_block(count, host=HOST)
    return list(range(base, base + count))


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def write_config(
    directory: Path, client_port: int, *, tick_ms: int = 500, me: int | None = None,
    peers: tuple[Peer, ...] = (),
) -> Path:
    """``zoo.cfg`` (and ``data/myid`` for ensemble member ``me``) in ``directory``. Session
    timeouts may range over 2..20 ticks."""
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    lines = [
        f"tickTime={tick_ms}", "initLimit=20", "syncLimit=10", f"dataDir={data}",
        f"clientPort={client_port}", f"clientPortAddress={HOST}", "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,ruok,mntr,stat", "maxClientCnxns=0",
    ]
    if me is not None:
        (data / "myid").write_text(f"{me}\n")
        lines += [f"server.{p.server_id}={HOST}:{p.quorum_port}:{p.election_port}"
                  for p in peers]
    path = directory / CONFIG_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


NETTY_JARS_DIR = Path("/usr/share/java")
"""Netty (the Debian package's jars): ZooKeeper serves TLS only with its Netty connection
factory, which the plain classpath leaves out."""


def enable_tls(directory: Path, secure_port: int, *, key_and_cert_pem: Path, ca_pem: Path,
               client_auth: str = "need") -> None:
    """Add a TLS client port to ``directory``'s ``zoo.cfg`` (from ``write_config``): PEM key
    and certificate in one file, the CA that clients' certificates must chain to; start the
    server with ``launch(..., tls=True)``. The plain port stays, on loopback, for the
    readiness probe."""
    path = directory / CONFIG_FILE
    lines = [
        *path.read_text().splitlines(),
        f"secureClientPort={secure_port}", f"secureClientPortAddress={HOST}",
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
        f"ssl.keyStore.location={key_and_cert_pem}", "ssl.keyStore.type=PEM",
        f"ssl.trustStore.location={ca_pem}", "ssl.trustStore.type=PEM",
        f"ssl.clientAuth={client_auth}",
    ]
    path.write_text("\n".join(lines) + "\n")


def _netty_classpath() -> str:
    return ":".join(str(p) for p in sorted(NETTY_JARS_DIR.glob("netty-*.jar"))
                    if "Final" not in p.name)


def configured_port(directory: Path) -> int | None:
    """The client port in ``directory/zoo.cfg``, if there is one."""
    try:
        text = (directory / CONFIG_FILE).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "clientPort" and value.strip().isdigit():
            return int(value)
    return None


def launch(directory: Path, client_port: int, *, quorum: bool = False,
           tls: bool = False) -> ServerHandle:
    """Start the server configured in ``directory`` (see ``write_config``; ``tls``: with
    ``enable_tls``'s port); returns at once."""
    check_installed()
    main_class = QUORUM_MAIN if quorum else STANDALONE_MAIN
    heap_mb = int(os.environ.get(HEAP_ENV_VAR, "") or HEAP_MB_DEFAULT)
    classpath = f"{ZOOKEEPER_JAR}:{SLF4J_JAR}" + (f":{_netty_classpath()}" if tls else "")
    command = ["java", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-cp", classpath,
               main_class, str(directory.resolve() / CONFIG_FILE)]
    with open(directory / LOG_FILE, "ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    _children[process.pid] = process
    return ServerHandle(dir=directory.resolve(), client_port=client_port, pid=process.pid)


def server_mode(port: int, *, timeout_s: float = 1.0) -> str | None:
    """``standalone``, ``leader`` or ``follower`` while the server serves, else None."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            sock.sendall(b"srvr")
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return None
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def alive(handle: ServerHandle) -> bool:
    """True while ``handle.pid`` is that server (not a zombie, not a reused pid)."""
    child = _children.get(handle.pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[handle.pid]
        return False
    try:
        cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(handle.config_path).encode() in cmdline


def wait_serving(handle: ServerHandle, *, timeout_ms: int) -> str:
    """Poll until the server serves; returns its mode. Raises with the log tail if it exits
    or the deadline passes."""
    deadline_s = time.monotonic() + timeout_ms / 1000
    while True:
        mode = server_mode(handle.client_port)
        if mode is not None:
            return mode
        if not alive(handle):
            raise ZooKeeperServerError(f"ZooKeeper in {handle.dir} exited\n{log_tail(handle)}")
        if time.monotonic() >= deadline_s:
            raise ZooKeeperServerError(
                f"ZooKeeper on port {handle.client_port} not serving after {timeout_ms} ms\n"
                f"{log_tail(handle)}")
        time.sleep(_POLL_S)


def start_standalone(
    directory: Path, *, client_port: int | None = None, avoid_ports: tuple[int, ...] = (),
    tick_ms: int = 500, ready_timeout_ms: int = 30_000,
) -> ServerHandle:
    """Write the config, start a standalone server and wait until it serves. Without
    ``client_port``, reuses the port of an earlier config in ``directory`` when it is free, so
    that a restarted server keeps its address, else takes a free port; never one of
    ``avoid_ports``."""
    check_installed()
    directory.mkdir(parents=True, exist_ok=True)
    if client_port is None:
        previous = configured_port(directory)
        if previous is not None and previous not in avoid_ports and port_free(previous):
            client_port = previous
        else:
            candidates = free_ports(len(avoid_ports) + 1)
            client_port = next(p for p in candidates if p not in avoid_ports)
    write_config(directory, client_port, tick_ms=tick_ms)
    handle = launch(directory, client_port)
    try:
        wait_serving(handle, timeout_ms=ready_timeout_ms)
    except BaseException:
        stop(handle, kill=True)
        raise
    return handle


def stop(handle: ServerHandle, *, kill: bool = False, timeout_ms: int = 10_000) -> None:
    """SIGTERM (SIGKILL if ``kill``), wait up to ``timeout_ms``, then SIGKILL."""
    for signum in (signal.SIGKILL if kill else signal.SIGTERM, signal.SIGKILL):
        if not alive(handle):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle.pid, signum)
        deadline_s = time.monotonic() + timeout_ms / 1000
        while alive(handle) and time.monotonic() < deadline_s:
            time.sleep(_POLL_S)
    if alive(handle):
        raise ZooKeeperServerError(f"could not stop ZooKeeper pid {handle.pid}")


def log_tail(handle: ServerHandle, lines: int = _LOG_TAIL_LINES) -> str:
    path = handle.dir / LOG_FILE
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])
