"""A node's configuration from its environment, for ``python -m services.node --from-env``:
the way a Kubernetes pod (or any container) configures the same node runner that
``seqlog local up`` starts with a JSON file.

Membership is static (every node lists every node, and nodes refuse peers whose cluster
fingerprint differs), so each node derives the whole node list from the same few variables:
node ``N`` of a set ``S`` of ``R`` replicas is ``S-N`` (a StatefulSet's pod names) and is
reached at ``S-N.<SEQLOG_PEER_DOMAIN>`` (its DNS name under the headless Service). The
cluster-wide and per-role settings come from a JSON file (a ConfigMap).

Variables (``SEQLOG_`` prefix):

========================  ==============================================================
``NODE_ID``               required; this node's id, the pod name (``seqlog-storage-2``)
``DATA_DIR``              required; the node's data directory (the pod's volume)
``STORAGE_SET``           name of the storage node set (``seqlog-storage``)
``STORAGE_REPLICAS``      how many storage nodes (the StatefulSet's replicas)
``SEQUENCER_SET``         name of the sequencer node set (``seqlog-sequencer``)
``SEQUENCER_REPLICAS``    how many sequencer nodes
``PEER_DOMAIN``           DNS suffix of the nodes' names (``seqlog-nodes.NS.svc.cluster.local``);
                          empty: the bare node ids are host names
``HTTP_PORT``             HTTP API port of every node (default 7400)
``DATA_PORT``             node-to-node port of every node (default 7401)
``LISTEN_HOST``           address to bind (default: the node's own DNS name; ``0.0.0.0`` in
                          a pod, so that probes and port-forwards reach it)
``EPOCH_STORE``           ``zk://host:port[,host:port]/root`` or ``file`` (default ``file``)
``EPOCH_STORE_DIR``       directory of the ``file`` epoch store
``SETTINGS_FILE``         JSON with the sections ``cluster`` (without ``nodes``),
                          ``sequencer``, ``storage``, ``api``, ``transport``, ``gossip``,
                          ``auth``, ``limits``
``AUTH_KEY_FILE``         token signing keys (``auth.key_file``; a mounted Secret): set, it
                          turns client authentication on (docs/SECURITY.md)
``AUTH_PERMISSIONS_FILE`` principals and revoked tokens (``auth.permissions_file``)
``CONNECT_TO``            ``host:port=addr:port[|addr:port],...``: connect to ``addr:port``
                          whenever a peer or ZooKeeper server is named ``host:port`` (for
                          running without cluster DNS; empty in Kubernetes)
``SHUTDOWN_TIMEOUT_MS``   bound on the graceful shutdown after SIGTERM (default 20000; keep
                          it below the pod's ``terminationGracePeriodSeconds``)
``TLS_CERT_FILE``         the node's PEM certificate (a mounted Secret); with ``TLS_KEY_FILE``
                          and ``TLS_CA_FILE`` turns TLS on (``tls`` settings,
                          docs/SECURITY.md)
``TLS_KEY_FILE``          its private key
``TLS_CA_FILE``           the cluster CA
``CLUSTER_SECRET_FILE``   the cluster secret file (node authentication without TLS)
``ZK_TLS``                ``true``: TLS to ZooKeeper too (``tls.zookeeper``)
========================  ==============================================================

Every problem is a ``EnvConfigError`` naming the variable, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.config import ProcessConfig, process_from_dict
from shared.types import node_id_valid

PREFIX = "SEQLOG_"
DEFAULT_HTTP_PORT = 7400
DEFAULT_DATA_PORT = 7401
DEFAULT_SHUTDOWN_TIMEOUT_MS = 20_000
SHUTDOWN_TIMEOUT_MS_MIN = 1_000
SHUTDOWN_TIMEOUT_MS_MAX = 600_000
REPLICAS_MAX = 1_000
SETTINGS_FILE_BYTES_MAX = 1024 * 1024
SETTINGS_SECTIONS = ("cluster", "sequencer", "storage", "api", "transport", "gossip", "tls",
                     "auth", "limits")
TLS_VARIABLES = {"TLS_CERT_FILE": "cert_file", "TLS_KEY_FILE": "key_file",
                 "TLS_CA_FILE": "ca_file", "CLUSTER_SECRET_FILE": "cluster_secret_file"}
# Set by the node's environment, never by the shared settings file: one file serves all nodes.
_PER_NODE_KEYS = ("node_id", "data_dir", "epoch_store", "epoch_store_dir")


class EnvConfigError(ValueError):
    """The environment does not describe a valid node; the message names the variable."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvNodeConfig:
    """What the node runner needs beyond ``ProcessConfig``."""

    config: ProcessConfig
    listen_host: str
    """Address the HTTP API and the node-to-node server bind to."""
    shutdown_timeout_ms: int
    """After SIGTERM the node must be gone within this long."""


def config_from_env(env: Mapping[str, str]) -> EnvNodeConfig:
    """Build the node's configuration from ``env`` (normally ``os.environ``)."""
    node_id = _required(env, "NODE_ID")
    if not node_id_valid(node_id):
        raise EnvConfigError(f"{PREFIX}NODE_ID={node_id!r} is not a valid node id "
                             "(letters, digits, '_.-', at most 63 characters)")
    http_port = _int(env, "HTTP_PORT", DEFAULT_HTTP_PORT, 1, 65535)
    data_port = _int(env, "DATA_PORT", DEFAULT_DATA_PORT, 1, 65535)
    if http_port == data_port:
        raise EnvConfigError(f"{PREFIX}HTTP_PORT and {PREFIX}DATA_PORT must differ")
    domain = env.get(PREFIX + "PEER_DOMAIN", "").strip().strip(".")
    members = _members(env)
    if node_id not in {m for m, _ in members}:
        raise EnvConfigError(
            f"{PREFIX}NODE_ID={node_id!r} is not one of the configured nodes "
            f"({', '.join(m for m, _ in members)}): do the *_REPLICAS settings match the "
            "StatefulSets' replicas?")
    settings = _settings(env)
    connect_to = parse_connect_to(env.get(PREFIX + "CONNECT_TO", ""))
    nodes = [
        {"node_id": member, "roles": [role], "host": f"{member}.{domain}" if domain else member,
         "http_port": http_port, "data_port": data_port}
        for member, role in members
    ]
    transport = dict(settings.get("transport", {}))
    peer_addresses = dict(transport.get("peer_addresses", {}))
    for node in nodes:
        targets = connect_to.get(f"{node['host']}:{data_port}")
        if targets:
            peer_addresses[str(node["node_id"])] = targets[0]
    transport["peer_addresses"] = peer_addresses
    epoch_store = env.get(PREFIX + "EPOCH_STORE", "file").strip() or "file"
    if epoch_store != "file":
        epoch_store = rewrite_zk_url(epoch_store, connect_to)
    elif not env.get(PREFIX + "EPOCH_STORE_DIR", "").strip():
        raise EnvConfigError(f"{PREFIX}EPOCH_STORE=file needs {PREFIX}EPOCH_STORE_DIR "
                             "(in Kubernetes use zk://...)")
    auth = dict(settings.get("auth", {}))
    for variable, key in (("AUTH_KEY_FILE", "key_file"),
                          ("AUTH_PERMISSIONS_FILE", "permissions_file")):
        path = env.get(PREFIX + variable, "").strip()
        if path:
            auth[key] = path
            auth.setdefault("enabled", True)
    data: dict[str, Any] = {
        **{k: v for k, v in settings.items() if k != "cluster"},
        "auth": auth,
        "node_id": node_id,
        "data_dir": _required(env, "DATA_DIR"),
        "epoch_store": epoch_store,
        "epoch_store_dir": env.get(PREFIX + "EPOCH_STORE_DIR", "").strip(),
        "cluster": {**settings.get("cluster", {}), "nodes": nodes},
        "transport": transport,
        "tls": _tls(env, settings.get("tls", {})),
    }
    try:
        config = process_from_dict(data)
    except (ValueError, TypeError) as exc:
        raise EnvConfigError(f"invalid node configuration: {exc}") from None
    listen_host = env.get(PREFIX + "LISTEN_HOST", "").strip() or config.me.host
    shutdown_timeout_ms = _int(env, "SHUTDOWN_TIMEOUT_MS", DEFAULT_SHUTDOWN_TIMEOUT_MS,
                               SHUTDOWN_TIMEOUT_MS_MIN, SHUTDOWN_TIMEOUT_MS_MAX)
    return EnvNodeConfig(config=config, listen_host=listen_host,
                         shutdown_timeout_ms=shutdown_timeout_ms)


def _tls(env: Mapping[str, str], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tls`` section: the settings file's, with the ``TLS_*`` variables over it."""
    tls = dict(settings)
    for name, key in TLS_VARIABLES.items():
        value = env.get(PREFIX + name, "").strip()
        if value:
            tls[key] = value
    zk = env.get(PREFIX + "ZK_TLS", "").strip().lower()
    if zk:
        if zk not in ("true", "false", "1", "0"):
            raise EnvConfigError(f"{PREFIX}ZK_TLS={zk!r} is not true or false")
        tls["zookeeper"] = zk in ("true", "1")
    return tls


def _members(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(node id, role) of every node: the sequencer set's, then the storage set's."""
    members: list[tuple[str, str]] = []
    for role in ("sequencer", "storage"):
        key = role.upper()
        name = _required(env, f"{key}_SET")
        replicas = _int(env, f"{key}_REPLICAS", None, 1, REPLICAS_MAX)
        members += [(f"{name}-{ordinal}", role) for ordinal in range(replicas)]
    ids = [m for m, _ in members]
    if len(set(ids)) != len(ids):
        raise EnvConfigError(f"{PREFIX}SEQUENCER_SET and {PREFIX}STORAGE_SET give the same "
                             "node names")
    bad = [m for m in ids if not node_id_valid(m)]
    if bad:
        raise EnvConfigError(f"node names {bad[:3]} are not valid node ids (at most 63 "
                             "letters, digits, '_.-')")
    return members


def _settings(env: Mapping[str, str]) -> dict[str, Any]:
    path = env.get(PREFIX + "SETTINGS_FILE", "").strip()
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            raw = f.read(SETTINGS_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path}: {exc.strerror or exc}") from None
    if len(raw) > SETTINGS_FILE_BYTES_MAX:
        raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path} is larger than "
                             f"{SETTINGS_FILE_BYTES_MAX} bytes")
    try:
        settings = json.loads(raw)
    except ValueError as exc:
        raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path} is not JSON: {exc}") from None
    if not isinstance(settings, dict):
        raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path} must hold a JSON object")
    unknown = sorted(set(settings) - set(SETTINGS_SECTIONS))
    if unknown:
        hint = (" (node-specific settings come from the environment)"
                if set(unknown) & set(_PER_NODE_KEYS) else "")
        raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path}: unknown sections {unknown}; "
                             f"allowed: {list(SETTINGS_SECTIONS)}{hint}")
    for name, section in settings.items():
        if not isinstance(section, dict):
            raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path}: {name} must be an object")
    if "nodes" in settings.get("cluster", {}):
        raise EnvConfigError(f"{PREFIX}SETTINGS_FILE={path}: cluster.nodes is derived from "
                             f"{PREFIX}*_SET and {PREFIX}*_REPLICAS, do not list it")
    return settings


def parse_connect_to(text: str) -> dict[str, list[str]]:
    """``"a:1=127.0.0.5:1|127.0.0.6:1,b:2=127.0.0.7:2"`` -> ``{"a:1": [...], "b:2": [...]}``."""
    result: dict[str, list[str]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, targets = entry.partition("=")
        if not sep:
            raise EnvConfigError(f"{PREFIX}CONNECT_TO entry {entry!r} is not "
                                 "'host:port=addr:port'")
        _host_port(name.strip(), entry)
        addresses = [t.strip() for t in targets.split("|") if t.strip()]
        if not addresses:
            raise EnvConfigError(f"{PREFIX}CONNECT_TO entry {entry!r} has no address")
        for address in addresses:
            _host_port(address, entry)
        result[name.strip()] = addresses
    return result


def rewrite_zk_url(url: str, connect_to: Mapping[str, list[str]]) -> str:
    """``zk://h1:p1,h2:p2/root`` with every ``host:port`` found in ``connect_to`` replaced by
    its addresses."""
    scheme, sep, rest = url.partition("://")
    if scheme != "zk" or not sep:
        raise EnvConfigError(f"{PREFIX}EPOCH_STORE={url!r} is neither 'file' nor "
                             "'zk://host:port[,host:port]/root'")
    hosts, slash, root = rest.partition("/")
    if not hosts or not slash or not root:
        raise EnvConfigError(f"{PREFIX}EPOCH_STORE={url!r} needs hosts and a root path, "
                             "like zk://zk:2181/seqlog")
    rewritten: list[str] = []
    for host in hosts.split(","):
        _host_port(host, url)
        rewritten += connect_to.get(host, [host])
    return f"zk://{','.join(dict.fromkeys(rewritten))}/{root}"


def _host_port(text: str, context: str) -> None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise EnvConfigError(f"{context!r}: {text!r} is not 'host:port'")


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(PREFIX + name, "").strip()
    if not value:
        raise EnvConfigError(f"{PREFIX}{name} is not set")
    return value


def _int(env: Mapping[str, str], name: str, default: int | None, low: int, high: int) -> int:
    text = env.get(PREFIX + name, "").strip()
    if not text:
        if default is None:
            raise EnvConfigError(f"{PREFIX}{name} is not set")
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise EnvConfigError(f"{PREFIX}{name}={text!r} is not an integer in [{low}, {high}]")
    return int(text)
