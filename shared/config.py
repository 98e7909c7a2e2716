"""Configuration dataclasses: one cluster-wide config that must match on every node, and one
per role. Every field has its unit last in its name, a default and a range check.

Parsing from a mapping (JSON file, environment) is pure and lives here; only ``services``
decides where the mapping comes from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.limits import COPYSET_SIZE_MAX, PAYLOAD_BYTES_MAX_LIMIT
from shared.types import (
    CLIENT_ID_PREFIX,
    LOG_ID_MAX,
    LOG_ID_MIN,
    NodeId,
    is_client_id,
    node_id_valid,
)

Role = Literal["sequencer", "storage"]
FsyncMode = Literal["always", "interval", "never"]
ROLES: tuple[Role, ...] = ("sequencer", "storage")
FSYNC_MODES: tuple[FsyncMode, ...] = ("always", "interval", "never")


def _in_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name}={value!r} is outside [{low}, {high}]")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """One node of the cluster as every other node sees it."""

    node_id: NodeId
    """Stable, unique node id (letters, digits, `_.-`; at most 63 characters)."""
    roles: tuple[Role, ...]
    """`sequencer`, `storage` or both."""
    host: str = "127.0.0.1"
    """Address the node listens on and peers connect to."""
    http_port: int = 0
    """Port of the HTTP API."""
    data_port: int = 0
    """Port of the node-to-node transport (STORE, RELEASE, READ, forwarded APPEND)."""
    sequencer_weight: float = 1.0
    """Share of logs this node sequences (weighted rendezvous hashing); 0: none."""
    storage_capacity: float = 1.0
    """Relative weight of this node when copysets are drawn."""

    def __post_init__(self) -> None:
        if not node_id_valid(self.node_id):
            raise ValueError(f"bad node id {self.node_id!r}")
        if is_client_id(self.node_id):
            raise ValueError(f"node id {self.node_id!r}: the prefix {CLIENT_ID_PREFIX!r} is "
                             "reserved for client readers")
        if not self.roles or any(r not in ROLES for r in self.roles):
            raise ValueError(f"node {self.node_id}: roles must be among {ROLES}")
        _in_range("http_port", self.http_port, 0, 65535)
        _in_range("data_port", self.data_port, 0, 65535)
        _in_range("sequencer_weight", self.sequencer_weight, 0.0, 1e6)
        _in_range("storage_capacity", self.storage_capacity, 0.0, 1e6)

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"


BACKLOG_MS_MAX = 100 * 365 * 86_400_000
"""A century: longer backlogs are surely a unit mistake."""
LOG_BACKLOGS_MAX = 10_000
"""Most per-range backlog overrides in one cluster config."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogBacklog:
    """The retention of the logs ``first_log_id..last_log_id`` (inclusive)."""

    first_log_id: int
    last_log_id: int
    backlog_ms: int
    """Records older than this are trimmed by the storage nodes; 0 keeps them forever."""

    def __post_init__(self) -> None:
        for name in ("first_log_id", "last_log_id", "backlog_ms"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"log_backlogs: {name}={getattr(self, name)!r} is not an "
                                 "integer")
        _in_range("log_backlogs first_log_id", self.first_log_id, LOG_ID_MIN, LOG_ID_MAX)
        _in_range("log_backlogs last_log_id", self.last_log_id, self.first_log_id, LOG_ID_MAX)
        _in_range("log_backlogs backlog_ms", self.backlog_ms, 0, BACKLOG_MS_MAX)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """Cluster-wide settings; nodes refuse peers whose fingerprint differs."""

    cluster_name: str = "seqlog"
    """Name reported by GET /v1/cluster; part of the config fingerprint."""
    nodes: tuple[NodeConfig, ...] = ()
    """Every node of the cluster (see `nodes[]`)."""
    replication_factor: int = 3
    """R for logs provisioned on first append."""
    nodeset_size: int = 0
    """Storage nodes in a log's nodeset; 0 means every storage node. New logs start with
    it; existing ones grow to it (with storage nodes added since) at their next epoch."""
    log_backlog_ms: int = 0
    """Retention of every log not in `log_backlogs`: each storage node trims records older
    than this (by their append timestamp) and deletes them from disk; 0 keeps them forever."""
    log_backlogs: tuple[LogBacklog, ...] = ()
    """Per log-id range retention overriding `log_backlog_ms`: a list of
    `{"first_log_id", "last_log_id", "backlog_ms"}` objects whose ranges must not overlap."""

    def __post_init__(self) -> None:
        ids = [n.node_id for n in self.nodes]
        if len(ids) != len(set(ids)):
            raise ValueError("node ids must be unique")
        if type(self.log_backlog_ms) is not int:
            raise ValueError(f"log_backlog_ms={self.log_backlog_ms!r} is not an integer")
        _in_range("log_backlog_ms", self.log_backlog_ms, 0, BACKLOG_MS_MAX)
        if len(self.log_backlogs) > LOG_BACKLOGS_MAX:
            raise ValueError(f"log_backlogs has {len(self.log_backlogs)} ranges; at most "
                             f"{LOG_BACKLOGS_MAX}")
        ranges = sorted(self.log_backlogs, key=lambda b: b.first_log_id)
        for before, after in itertools.pairwise(ranges):
            if after.first_log_id <= before.last_log_id:
                raise ValueError(
                    f"log_backlogs: log ids {before.first_log_id}..{before.last_log_id} and "
                    f"{after.first_log_id}..{after.last_log_id} overlap")
        _in_range("replication_factor", self.replication_factor, 1, COPYSET_SIZE_MAX)
        _in_range("nodeset_size", self.nodeset_size, 0, COPYSET_SIZE_MAX)
        storage = self.storage_node_ids
        if storage and self.replication_factor > len(storage):
            raise ValueError(
                f"replication_factor={self.replication_factor} exceeds the "
                f"{len(storage)} storage nodes"
            )

    @property
    def storage_node_ids(self) -> tuple[NodeId, ...]:
        return tuple(n.node_id for n in self.nodes if "storage" in n.roles)

    @property
    def sequencer_nodes(self) -> tuple[NodeConfig, ...]:
        return tuple(n for n in self.nodes if "sequencer" in n.roles)

    def node(self, node_id: NodeId) -> NodeConfig | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None

    def default_nodeset(self) -> tuple[NodeId, ...]:
        storage = self.storage_node_ids
        size = self.nodeset_size or len(storage)
        return storage[: max(size, self.replication_factor)]

    def fingerprint(self) -> str:
        """Identifies the cluster and the settings every node must share. The node list is
        left out: membership changes reach nodes one at a time (see services.membership),
        and a node ignores peers it does not know (no address, gossip dropped)."""
        settings = dataclasses.asdict(self)
        del settings["nodes"]
        text = json.dumps(settings, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class SequencerConfig:
    """Settings of the sequencer role (LogDevice defaults where LogDevice has one)."""

    window_appends_max: int = 1000
    """In-flight appends (appenders) per log; a full window answers SEQNOBUFS."""
    store_timeout_ms_min: int = 10
    """Least store timeout of the first wave (which follows the STOREs' round trips, see
    sequencer/core/store_timeout.py); it doubles per wave."""
    store_timeout_ms_max: int = 60_000
    """Upper bound of the store timeout."""
    graylist_nodeset_fraction_max: float = 0.25
    """The gray list is cleared once it holds more than this fraction of the nodeset."""
    graylist_duration_ms: int = 600_000
    """How long a node that timed out stays graylisted."""
    blacklist_nospc_ms: int = 60_000
    """How long a node that answered NOSPC is not used."""
    blacklist_disabled_ms: int = 30_000
    """How long a node that answered DISABLED is not used."""
    blacklist_overloaded_ms: int = 1_000
    """How long a node that answered OVERLOADED is not used."""
    blacklist_error_ms: int = 1_000
    """Blacklist time for other error replies (connection failure, shutdown, bad checksum)."""
    release_broadcast_interval_ms: int = 500
    """How often every node of the nodeset of each log whose release pointer moved (in the
    last few broadcasts) is sent the pointer; idle logs are not visited."""
    idle_deactivate_ms: int = 600_000
    """A log's sequencer that got no append for this long and has nothing in flight is
    deactivated: its epoch is marked clean in the epoch store and it leaves memory. The next
    append activates a new epoch with no recovery (LogDevice keeps idle sequencers; at many
    logs their periodic work is what costs)."""
    release_delay_ms: int = 2
    """Above 0: a copyset node learns the new release pointer from the next STORE sent to it
    (which carries it), and only one that gets no STORE within this time is sent a RELEASE.
    Under load every STORE carries it, so no RELEASE is sent at all; at one append in flight
    this spares three messages per append (p50 -6%, sequencer CPU -6% on the 2-core
    benchmark machine), and readers that long-poll the storage nodes (tailing) see a record
    at most this much later. HTTP reads and ``Client.reader`` do not wait for it: they start
    from the sequencer's own pointer. 0: tell the copyset at once, right after the client's
    answer (both leave in the same loop turn)."""
    epoch_drain_timeout_ms: int = 2_000
    """When an epoch runs out of ESNs, how long its in-flight appends may take to finish
    before the next epoch starts (LogDevice's epoch-draining-timeout); new appends wait."""
    recovery_grace_ms: int = 100
    """Once an f-majority of the nodeset has sealed, how long epoch recovery waits for the
    other nodes before it goes on without them."""
    recovery_retry_ms: int = 500
    """Epoch recovery resends a SEAL, digest, mutation or CLEAN that failed after this long
    (LogDevice's mutation timeout)."""
    recovery_timeout_ms: int = 30_000
    """An epoch recovery not done after this long starts over with a new SEAL round."""
    recovery_request_timeout_ms: int = 2_000
    """How long one request of epoch recovery or purging (SEAL, digest page, mutation STORE,
    CLEAN, log state) may go unanswered before it fails as TIMEDOUT: a member that sealed
    and then hangs (stopped, a stalled disk) is then dropped from the recovery set while an
    f-majority that can hold R copies remains, instead of stalling recovery for
    ``recovery_timeout_ms``."""
    activation_timeout_ms: int = 10_000
    """How long taking an epoch from the epoch store may take before the waiting appends are
    answered NOSEQUENCER (nothing written) and the next append tries again."""
    activation_appends_queued_max: int = 10_000
    """Appends that may wait for a log's sequencer to activate; more get SEQNOBUFS."""
    append_timeout_ms: int = 10_000
    """After this the client is told TIMEDOUT (outcome unknown); the appender keeps trying."""
    append_group_records_max: int = 256
    """Most records that concurrent appends to one log may share in one appender (one STORE
    per copyset node). 1 turns grouping off."""
    append_group_bytes_max: int = 1024 * 1024
    """Most payload bytes of one appender built from grouped appends."""
    store_batch_stores_max: int = 1024
    """Most STOREs of different logs (and, apart, RELEASEs) that go to one storage node in one
    frame per loop iteration (STORE_BATCH, RELEASE_BATCH: docs/PROTOCOL.md). 1 sends each in
    a frame of its own, as builds before STORE_BATCH did: set it while storage nodes of such
    builds remain in the cluster (they close a connection that carries one)."""
    shared_waves: bool = True
    """Appenders of different logs started in one loop iteration send their first wave
    together: one copyset, one store timer and one count of answers for all of them
    (``sequencer.core.shared_wave``; needs ``store_batch_stores_max`` above 1). False: each
    appender picks, times and counts its own first wave."""
    producers_per_log_max: int = 10_000
    """Producers of idempotent appends a log's sequencer keeps in memory; one it drops is
    looked up on the storage nodes again when it comes back."""
    producer_lookup_timeout_ms: int = 10_000
    """How long looking a producer up may take (it waits for earlier epochs' recovery, asks
    the nodeset, reads its candidate appends back) before its waiting appends are answered
    NOTREADY (nothing written)."""

    def __post_init__(self) -> None:
        _in_range("window_appends_max", self.window_appends_max, 2, 1_000_000)
        _in_range("store_timeout_ms_min", self.store_timeout_ms_min, 1, 60_000)
        _in_range("store_timeout_ms_max", self.store_timeout_ms_max, self.store_timeout_ms_min,
                  3_600_000)
        _in_range("graylist_nodeset_fraction_max", self.graylist_nodeset_fraction_max, 0.0, 1.0)
        for name in ("graylist_duration_ms", "blacklist_nospc_ms", "blacklist_disabled_ms",
                     "blacklist_overloaded_ms", "blacklist_error_ms"):
            _in_range(name, getattr(self, name), 0, 86_400_000)
        _in_range("release_broadcast_interval_ms", self.release_broadcast_interval_ms, 10,
                  3_600_000)
        _in_range("release_delay_ms", self.release_delay_ms, 0, 60_000)
        _in_range("idle_deactivate_ms", self.idle_deactivate_ms, 10, 86_400_000)
        _in_range("epoch_drain_timeout_ms", self.epoch_drain_timeout_ms, 0, 600_000)
        _in_range("recovery_grace_ms", self.recovery_grace_ms, 0, 600_000)
        _in_range("recovery_retry_ms", self.recovery_retry_ms, 1, 600_000)
        _in_range("recovery_timeout_ms", self.recovery_timeout_ms, 1, 3_600_000)
        _in_range("recovery_request_timeout_ms", self.recovery_request_timeout_ms, 1,
                  600_000)
        _in_range("activation_timeout_ms", self.activation_timeout_ms, 1, 600_000)
        _in_range("activation_appends_queued_max", self.activation_appends_queued_max, 1,
                  1_000_000)
        _in_range("append_timeout_ms", self.append_timeout_ms, 1, 3_600_000)
        _in_range("append_group_records_max", self.append_group_records_max, 1, 100_000)
        _in_range("append_group_bytes_max", self.append_group_bytes_max, 1, 2**30)
        _in_range("store_batch_stores_max", self.store_batch_stores_max, 1, 4096)
        _in_range("producers_per_log_max", self.producers_per_log_max, 1, 10_000_000)
        _in_range("producer_lookup_timeout_ms", self.producer_lookup_timeout_ms, 1, 600_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageConfig:
    """Settings of the storage role."""

    fsync: FsyncMode = "always"
    """`always`: fsync before STORED; `interval`: every `fsync_interval_ms`; `never`: the
    kernel decides."""
    fsync_interval_ms: int = 100
    """With ``fsync="interval"``: how often dirty segments are synced."""
    segment_bytes_max: int = 64 * 1024 * 1024
    """Size at which a segment file is closed and a new one started."""
    store_queue_records_max: int = 20_000
    """STOREs waiting for the writer; more get OVERLOADED."""
    index_cache_bytes_max: int = 32 * 1024 * 1024
    """Index blocks of closed segments kept in memory (``record_index.BlockCache``): the
    rest of the index stays in the per-segment index files."""
    index_checkpoint_bytes: int = 2 * 1024 * 1024
    """The segment being written gets its index file rewritten every this many bytes, so a
    restart scans at most this much of it; further apart once the store holds many logs and
    pieces (``storage_node.record_store.CHECKPOINT_BYTES_PER_UNIT`` per each: a restart scans
    at most that in proportion to the index and state it loads)."""
    index_memory_entries_max: int = 50_000
    """The segment being written (the only one indexed in memory, about 0.45 KiB per entry)
    is closed once it holds this many entries, also when it is smaller than
    ``segment_bytes_max``: memory stays bounded whatever the entry size."""
    commit_batch_bytes_max: int = 8 * 1024 * 1024
    """Most bytes one group commit (one write, one fsync) may carry."""
    disk_free_bytes_min: int = 64 * 1024 * 1024
    """Below this much free disk, STOREs get NOSPC."""
    accept_writes: bool = True
    """False makes every STORE answer DISABLED (for draining a node)."""
    retention_interval_ms: int = 10_000
    """How often the node trims logs with a backlog (`cluster.log_backlog_ms`) by age and
    reclaims disk: deletes segments holding only trimmed records, compacts mixed ones."""
    compaction_live_fraction_max: float = 0.5
    """A closed segment whose live (untrimmed, not superseded) record bytes are below this
    fraction of its size is rewritten with only those; 0 turns compaction off."""
    reclaim_bytes_per_pass_max: int = 64 * 1024 * 1024
    """Most live bytes one reclaim pass copies while compacting, so that writes keep their
    latency (a segment bigger than this is still compacted, alone)."""
    producer_ids_per_log_max: int = 10_000
    """Producers per log whose latest appends the node remembers for idempotent appends
    (``PRODUCER_SEQS_KEPT`` each); past it the least recently written producer is forgotten,
    and a retry of its appends would be written again."""
    rebuild_rate_bytes_per_s: int = 32 * 1024 * 1024
    """Rate limit of each donor of a rebuild (bytes of copies sent per second; 0: none), so
    that appends keep their latency while a lost disk is rebuilt."""
    rebuild_poll_interval_ms: int = 1_000
    """How often the node reads the cluster's shard state (rebuilds to donate to, its own
    rebuild finished)."""
    rebuild_by_copyset: bool = False
    """Donors send only copies whose copyset names the lost shard (less traffic; exact only
    for records whose copies all came from their last wave, see docs/RELIABILITY.md)."""

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}")
        _in_range("fsync_interval_ms", self.fsync_interval_ms, 1, 60_000)
        _in_range("segment_bytes_max", self.segment_bytes_max, 1024 * 1024, 2**40)
        _in_range("store_queue_records_max", self.store_queue_records_max, 1, 10_000_000)
        _in_range("index_cache_bytes_max", self.index_cache_bytes_max, 64 * 1024, 2**40)
        _in_range("index_checkpoint_bytes", self.index_checkpoint_bytes, 64 * 1024, 2**40)
        _in_range("index_memory_entries_max", self.index_memory_entries_max, 16, 2**31)
        _in_range("commit_batch_bytes_max", self.commit_batch_bytes_max, 64 * 1024, 2**31)
        _in_range("disk_free_bytes_min", self.disk_free_bytes_min, 0, 2**50)
        _in_range("retention_interval_ms", self.retention_interval_ms, 10, 86_400_000)
        _in_range("compaction_live_fraction_max", self.compaction_live_fraction_max, 0.0, 1.0)
        _in_range("reclaim_bytes_per_pass_max", self.reclaim_bytes_per_pass_max, 64 * 1024,
                  2**40)
        _in_range("producer_ids_per_log_max", self.producer_ids_per_log_max, 1, 10_000_000)
        _in_range("rebuild_rate_bytes_per_s", self.rebuild_rate_bytes_per_s, 0, 2**40)
        _in_range("rebuild_poll_interval_ms", self.rebuild_poll_interval_ms, 10, 600_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiConfig:
    """Limits of the HTTP API."""

    payload_bytes_max: int = 1024 * 1024
    """Largest record payload (TOOBIG above)."""
    request_bytes_max: int = 32 * 1024 * 1024
    """Largest HTTP request body (TOOBIG above)."""
    batch_records_max: int = 10_000
    """Most records in one append-batch."""
    read_records_max: int = 10_000
    """Most records one read returns (larger limits are clamped)."""
    read_bytes_max: int = 16 * 1024 * 1024
    """Most payload bytes one read returns."""
    long_poll_ms_max: int = 60_000
    """Longest `wait_ms` a read may ask for (larger values are clamped)."""
    read_speculative_delay_ms: int = 20
    """Once an f-majority of a log's storage nodes answered a read, how long to wait for the
    rest before merging without them (so a slow node costs readers this, not its latency)."""
    provision_on_append: bool = True
    """Create a log on its first append (else NOTFOUND)."""
    retry_after_s: int = 1
    """Retry-After sent with 429/503 answers."""

    def __post_init__(self) -> None:
        _in_range("payload_bytes_max", self.payload_bytes_max, 1, PAYLOAD_BYTES_MAX_LIMIT)
        _in_range("request_bytes_max", self.request_bytes_max, self.payload_bytes_max,
                  PAYLOAD_BYTES_MAX_LIMIT * 2)
        _in_range("batch_records_max", self.batch_records_max, 1, 100_000)
        _in_range("read_records_max", self.read_records_max, 1, 100_000)
        _in_range("read_bytes_max", self.read_bytes_max, 1024, 2**31)
        _in_range("long_poll_ms_max", self.long_poll_ms_max, 0, 3_600_000)
        _in_range("read_speculative_delay_ms", self.read_speculative_delay_ms, 0, 60_000)
        _in_range("retry_after_s", self.retry_after_s, 0, 3600)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """Node-to-node connections."""

    peer_requests_inflight_max: int = 8192
    """Requests in flight to one peer; more get OVERLOADED."""
    connect_timeout_ms: int = 1_000
    """Connect plus HELLO deadline."""
    request_timeout_ms: int = 5_000
    """Default deadline of a node-to-node request."""
    reconnect_backoff_ms_max: int = 1_000
    """Longest wait before reconnecting to a peer that failed."""
    client_appends_inflight_max: int = 1024
    """Appends one binary client connection may have in flight on this node; past it the node
    answers OVERLOADED at once and writes nothing (docs/PROTOCOL.md). Its other requests
    (reads, long polls) are bounded by the same number, separately."""
    peer_addresses: dict[str, str] = field(default_factory=dict)
    """Per peer node id, a `host:port` to connect to instead of the peer's `host` and
    `data_port` in the cluster config: a proxy, sidecar or NAT in between (the fault-injection
    tests route every link through a proxy this way). Only this node's outgoing connections
    change; not part of the cluster fingerprint."""

    def __post_init__(self) -> None:
        _in_range("peer_requests_inflight_max", self.peer_requests_inflight_max, 1, 1_000_000)
        _in_range("connect_timeout_ms", self.connect_timeout_ms, 1, 600_000)
        _in_range("request_timeout_ms", self.request_timeout_ms, 1, 600_000)
        _in_range("reconnect_backoff_ms_max", self.reconnect_backoff_ms_max, 1, 600_000)
        _in_range("client_appends_inflight_max", self.client_appends_inflight_max, 1, 1_000_000)
        if not isinstance(self.peer_addresses, dict):
            raise ValueError("peer_addresses must map node ids to 'host:port'")
        for node_id, address in self.peer_addresses.items():
            if not node_id_valid(node_id):
                raise ValueError(f"peer_addresses: bad node id {node_id!r}")
            _parse_host_port(f"peer_addresses[{node_id}]", address)

    def peer_address(self, node_id: str) -> tuple[str, int] | None:
        """The overridden address of ``node_id``, or None to use the cluster config's."""
        address = self.peer_addresses.get(node_id)
        return None if address is None else _parse_host_port("peer_addresses", address)


def _parse_host_port(name: str, address: object) -> tuple[str, int]:
    if not isinstance(address, str):
        raise ValueError(f"{name}={address!r} is not a 'host:port' string")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{name}={address!r} is not 'host:port'")
    port = int(port_text)
    _in_range(f"{name} port", port, 1, 65535)
    return host, port


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """TLS on every listener and node authentication (docs/SECURITY.md). Empty files: off,
    and the node is open to anyone who reaches its ports (``seqlog local up`` on loopback).
    Files are re-read on SIGHUP; new connections use them, open ones keep theirs."""

    cert_file: str = ""
    """PEM certificate chain of this node: served on the HTTP API and the data port, and
    shown to peers on node-to-node links. A node certificate has the subject OU
    ``seqlog-node``; that is what lets a peer send node-only messages."""
    key_file: str = ""
    """PEM private key of `cert_file`."""
    ca_file: str = ""
    """PEM bundle of the cluster CA: verifies peers' node certificates (mutual TLS)."""
    cluster_secret_file: str = ""
    """File of cluster secrets, one per line (at least 16 bytes each): without TLS a peer
    claiming to be a node must answer an HMAC challenge over one of them; it proves itself
    with the first line (rotation: add a line, SIGHUP everywhere, move it first, SIGHUP,
    drop the old one)."""
    zookeeper: bool = False
    """Talk TLS to ZooKeeper (its secure client port), verifying it with `ca_file` and
    showing `cert_file` as the client certificate."""

    def __post_init__(self) -> None:
        files = (self.cert_file, self.key_file, self.ca_file)
        if any(files) and not all(files):
            raise ValueError("tls: cert_file, key_file and ca_file go together")
        if self.zookeeper and not self.ca_file:
            raise ValueError("tls.zookeeper needs ca_file")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipConfig:
    """The gossip failure detector (LogDevice's defaults; tests shorten them)."""

    gossip_interval_ms: int = 100
    """How often a node sends its view (heartbeat counters) to one random peer."""
    gossip_threshold_intervals: int = 30
    """A node not heard of for this many intervals is DEAD."""
    suspect_duration_ms: int = 10_000
    """How long a node seen again stays SUSPECT before it is ALIVE; 0: straight to ALIVE."""
    min_gossips_for_stable_state: int = 3
    """Gossips a starting node must receive before it changes any node's state, so that it
    does not declare the world dead."""
    startup_wait_ms: int = 1_000
    """A node that has received no gossip this long after starting (say, the only one up)
    becomes stable anyway."""
    gossip_time_skew_ms: int = 10_000
    """A gossip whose send time differs from the receiver's clock by more than this is
    dropped (delayed in a queue, or from a badly skewed clock)."""
    failover_duration_ms: int = 3_000
    """On graceful shutdown the node tells every peer at once that it is going away (they
    treat it as DEAD), then keeps gossiping that flag while its roles drain, for at most
    this long."""

    def __post_init__(self) -> None:
        _in_range("gossip_interval_ms", self.gossip_interval_ms, 1, 60_000)
        _in_range("gossip_threshold_intervals", self.gossip_threshold_intervals, 2, 10_000)
        _in_range("suspect_duration_ms", self.suspect_duration_ms, 0, 3_600_000)
        _in_range("min_gossips_for_stable_state", self.min_gossips_for_stable_state, 0, 1_000)
        _in_range("startup_wait_ms", self.startup_wait_ms, 0, 600_000)
        _in_range("gossip_time_skew_ms", self.gossip_time_skew_ms, 1, 3_600_000)
        _in_range("failover_duration_ms", self.failover_duration_ms, 0, 600_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    """Client authentication, permissions and append quotas (docs/SECURITY.md). Off by
    default: a cluster on loopback is open for a first try."""

    enabled: bool = False
    """Require a bearer token on every client request (HTTP and the binary protocol)."""
    key_file: str = ""
    """Token signing keys, one per line: the first signs, all verify (rotation)."""
    permissions_file: str = ""
    """JSON: principals with their grants and quotas, and revoked token ids; re-read when it
    changes and on SIGHUP."""
    reload_interval_ms: int = 1_000
    """How often the key and permissions files are checked for changes."""
    append_records_per_s: int = 0
    """Default per-principal append rate in records/s (0: unlimited); the permissions file
    may set each principal's own."""
    append_bytes_per_s: int = 0
    """Default per-principal append rate in payload bytes/s (0: unlimited)."""
    connections_per_principal_max: int = 1_000
    """Client connections one principal may hold on this node (HTTP and binary each)."""
    open_paths: tuple[str, ...] = ("/healthz", "/readyz")
    """HTTP paths served without a token (probes)."""

    def __post_init__(self) -> None:
        _in_range("reload_interval_ms", self.reload_interval_ms, 10, 3_600_000)
        _in_range("append_records_per_s", self.append_records_per_s, 0, 10**12)
        _in_range("append_bytes_per_s", self.append_bytes_per_s, 0, 10**15)
        _in_range("connections_per_principal_max", self.connections_per_principal_max, 1,
                  1_000_000)
        object.__setattr__(self, "open_paths", tuple(self.open_paths))
        if self.enabled and not self.key_file:
            raise ValueError("auth.enabled needs auth.key_file")


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsConfig:
    """Bounds that keep one client from holding a node's sockets (docs/SECURITY.md)."""

    http_connections_max: int = 10_000
    """Open HTTP connections per node; past it a new connection first evicts the oldest one
    that has not completed a request, else it is closed."""
    data_connections_max: int = 10_000
    """Open connections to the data port (nodes and binary clients), evicting the same way."""
    http_connections_per_ip_max: int = 1_000
    """Open HTTP connections from one client address; past it a new one is answered 503
    OVERLOADED and closed, so one flooding host cannot take the node's connections."""
    data_connections_per_ip_max: int = 1_000
    """Open data-port connections from one client address, and as many TLS handshakes under
    way; past it a new one is closed before HELLO. A peer that proves it is a node (TLS or the
    cluster secret) does not count."""
    request_head_timeout_ms: int = 10_000
    """A new connection's first request line and headers must arrive within this."""

    def __post_init__(self) -> None:
        _in_range("http_connections_max", self.http_connections_max, 1, 1_000_000)
        _in_range("data_connections_max", self.data_connections_max, 1, 1_000_000)
        _in_range("http_connections_per_ip_max", self.http_connections_per_ip_max, 1,
                  1_000_000)
        _in_range("data_connections_per_ip_max", self.data_connections_per_ip_max, 1,
                  1_000_000)
        _in_range("request_head_timeout_ms", self.request_head_timeout_ms, 10, 600_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessConfig:
    """Everything one node process needs: who it is, where its data lives, and each role's
    settings."""

    node_id: NodeId
    cluster: ClusterConfig
    data_dir: str
    epoch_store: str = "file"
    """``file`` (a directory shared by the nodes of one machine) or ``zk://host:port[,...]/root``."""
    epoch_store_dir: str = ""
    sequencer: SequencerConfig = field(default_factory=SequencerConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)

    def __post_init__(self) -> None:
        if self.cluster.node(self.node_id) is None:
            raise ValueError(f"node {self.node_id} is not in the cluster config")
        unknown = sorted(n for n in self.transport.peer_addresses
                         if self.cluster.node(NodeId(n)) is None)
        if unknown:
            raise ValueError(f"transport.peer_addresses names nodes not in the cluster: {unknown}")

    @property
    def me(self) -> NodeConfig:
        node = self.cluster.node(self.node_id)
        assert node is not None
        return node


def _build(cls: type[Any], data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown settings {sorted(unknown)}")
    return cls(**data)


def cluster_from_dict(data: dict[str, Any]) -> ClusterConfig:
    nodes = tuple(
        _build(NodeConfig, {**n, "roles": tuple(n.get("roles", ()))}) for n in data.get("nodes", ())
    )
    backlogs = data.get("log_backlogs", ())
    if not isinstance(backlogs, list | tuple) or not all(isinstance(b, dict) for b in backlogs):
        raise ValueError("log_backlogs must be a list of "
                         '{"first_log_id", "last_log_id", "backlog_ms"} objects')
    built = {**data, "nodes": nodes,
             "log_backlogs": tuple(_build(LogBacklog, b) for b in backlogs)}
    cluster: ClusterConfig = _build(ClusterConfig, built)
    return cluster


def process_from_dict(data: dict[str, Any]) -> ProcessConfig:
    """Build a ``ProcessConfig`` from plain JSON-like data; raises ValueError on bad input."""
    sections = {
        "sequencer": SequencerConfig,
        "storage": StorageConfig,
        "api": ApiConfig,
        "transport": TransportConfig,
        "gossip": GossipConfig,
        "tls": TlsConfig,
        "auth": AuthConfig,
        "limits": LimitsConfig,
    }
    built: dict[str, Any] = {k: v for k, v in data.items() if k not in sections and k != "cluster"}
    built["cluster"] = cluster_from_dict(data.get("cluster", {}))
    for name, cls in sections.items():
        built[name] = _build(cls, data.get(name, {}))
    process: ProcessConfig = _build(ProcessConfig, built)
    return process


def to_dict(config: Any) -> dict[str, Any]:
    result: dict[str, Any] = dataclasses.asdict(config)
    return result
