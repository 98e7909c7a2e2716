"""The composition root of one node: ``create_app(config)`` builds the node's roles (storage,
sequencer), the node-to-node transport and the HTTP API, and starts and stops them through the
aiohttp application's ``cleanup_ctx``: one step per resource, so that a failing stop of one
(the sequencer's drain, the gossip farewell) still stops the others. ``create_runner(app)``
serves it: the lean HTTP edge (``services.http_edge``) in front of aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from epoch_store import open_epoch_store
from epoch_store.cluster_state import open_cluster_state
from frontend.service import FrontEnd
from gossip.core.failure_detector import NodeState
from gossip.runtime import GossipRuntime
from sequencer.core.recovery import Phase
from sequencer.runtime import SequencerRuntime
from services.console_api import add_console
from services.http_api import SHARDS_KEY, create_api_app
from services.http_edge import HTTPS_KEY, EdgeRunner
from services.log_stats import logs_source
from services.membership import ClusterChange, Membership
from services.node_security import NodeSecurityCollector, node_security
from services.ops_metrics import OpsCollector
from services.shard_watch import ShardWatch
from shared import cluster_state as cs
from shared.clock import SystemClock
from shared.config import ClusterConfig, ProcessConfig
from shared.net.node_auth import NodeSecurity
from shared.net.pool import PeerPool
from shared.net.server import start_server
from shared.net.types import Counters, ReplyFn
from shared.security.auth import Authenticator
from shared.status import Status
from shared.types import NodeId
from shared.wire.append import Append, GetSequencerState
from shared.wire.codec import Message
from shared.wire.gossip import Gossip
from storage_node.core.retention import BacklogTable
from storage_node.rebuild_runtime import RebuildConfig, RebuildRuntime
from storage_node.runtime import StorageNode

log = logging.getLogger(__name__)
MEMBERSHIP_KEY = web.AppKey("membership", Membership)
"""The node's live cluster configuration; ``services.node`` reloads it on SIGHUP."""
SECURITY_KEY = web.AppKey("security", NodeSecurity)
"""The node's TLS contexts and cluster secrets; ``services.node`` reloads them on SIGHUP."""
AUTH_KEY = web.AppKey("auth", Authenticator)
"""The node's credentials (docs/SECURITY.md); ``services.node`` reloads them on SIGHUP."""

SHARDS_READ_WAIT_MS = 250
"""How long /v1/cluster waits for a fresh read of the shards' state before it answers with
the last one read (the epoch store may be reconnecting)."""
DRAIN_TIMEOUT_S = 5.0


class _Dispatcher:
    """Routes the data port's messages (from nodes and binary clients) to the role that
    handles them."""

    def __init__(self, service: FrontEnd, storage: StorageNode | None,
                 gossip: GossipRuntime) -> None:
        self.service = service
        self.storage = storage
        self.gossip = gossip

    def on_message(self, peer: NodeId, message: Message, reply: ReplyFn) -> None:
        if type(message) is Gossip:
            self.gossip.on_message(message)
        elif type(message) is Append:
            self.service.on_append_message(message, reply)
        elif type(message) is GetSequencerState:
            reply(self.service.sequencer_state(message.log_id, activate=message.activate,
                                               all_logs=message.all_logs))
        elif self.storage is not None:
            self.storage.on_message(peer, message, reply)


class _RoleCollector(Collector):
    """Exposes the roles' counters to Prometheus at scrape time."""

    def __init__(self, storage: StorageNode | None, sequencer: SequencerRuntime | None,
                 pool: PeerPool, gossip: GossipRuntime,
                 rebuild: RebuildRuntime | None = None,
                 data_port: Counters | None = None) -> None:
        self.storage, self.sequencer, self.pool = storage, sequencer, pool
        self.data_port = data_port if data_port is not None else Counters()
        """The data port server's counters (its refusals)."""
        self.gossip = gossip
        self.rebuild = rebuild

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self.storage is not None:
            for name, value in self.storage.stats().items():
                yield GaugeMetricFamily(f"seqlog_storage_{name}", f"storage node {name}",
                                        value=value)
        if self.rebuild is not None:
            for name, value in self.rebuild.metrics().items():
                yield GaugeMetricFamily(f"seqlog_storage_{name}", f"rebuilding: {name}",
                                        value=value)
        if self.sequencer is not None:
            sequencers = self.sequencer.sequencers.values()
            yield GaugeMetricFamily("seqlog_sequencer_logs", "logs with a sequencer here",
                                    value=len(sequencers))
            yield GaugeMetricFamily("seqlog_sequencer_idle_deactivations",
                                    "sequencers deactivated after idle_deactivate_ms without "
                                    "appends (epoch marked clean, dropped from memory)",
                                    value=self.sequencer.deactivations_count)
            waves = GaugeMetricFamily(
                "seqlog_sequencer_shared_waves", "first waves shared by appenders of "
                "different logs, by how they ended (sent: all of them)", labels=["result"])
            for result, count in zip(("sent", "completed", "dissolved"),
                                     self.sequencer.shared_wave_counts, strict=True):
                waves.add_metric([result], count)
            yield waves
            yield GaugeMetricFamily("seqlog_sequencer_appends_in_flight",
                                    "appends waiting for their copies",
                                    value=sum(len(s.appenders) for s in sequencers))
            yield GaugeMetricFamily("seqlog_sequencer_logs_recovering",
                                    "logs whose earlier epochs are being recovered here",
                                    value=sum(s.recovery is not None for s in sequencers))
            phases = GaugeMetricFamily(
                "seqlog_sequencer_recovery_phases", "log recoveries that entered each phase "
                "(SEALING: attempts; DONE, PREEMPTED: ends)", labels=["phase"])
            for phase in Phase:
                phases.add_metric([phase.value],
                                  self.sequencer.recovery_phases_count[phase.value])
            yield phases
            lookups = GaugeMetricFamily(
                "seqlog_sequencer_producer_lookups", "producers of idempotent appends looked "
                "up on the storage nodes after an activation", labels=["result"])
            for ok, result in ((True, "ok"), (False, "failed")):
                lookups.add_metric([result], self.sequencer.producer_lookups_count[ok])
            yield lookups
        view = self.gossip.view()
        for state in NodeState:
            yield GaugeMetricFamily(f"seqlog_gossip_nodes_{state.value.lower()}",
                                    f"nodes this node's failure detector sees {state.value}",
                                    value=sum(1 for s in view.values() if s is state))
        yield GaugeMetricFamily("seqlog_gossip_dropped", "gossip messages dropped (malformed, "
                                "skewed, old instance, unknown sender)",
                                value=self.gossip.gossips_dropped)
        counters = self.pool.counters
        for name in ("frames_sent", "writes", "bytes_sent", "frames_received", "bytes_received",
                     "connect_failures"):
            yield GaugeMetricFamily(f"seqlog_transport_{name}", f"node-to-node {name}",
                                    value=getattr(counters, name))
        for name in ("frames_sent", "writes", "bytes_sent", "frames_received",
                     "bytes_received"):
            yield GaugeMetricFamily(f"seqlog_data_port_{name}", f"data port (connections "
                                    f"accepted from clients and nodes): {name}",
                                    value=getattr(self.data_port, name))
        refused = CounterMetricFamily(
            "seqlog_data_connections_refused", "data-port sockets closed before HELLO: their "
            "address held data_connections_per_ip_max connections or TLS handshakes "
            "(per_address), or the node held data_connections_max (full)", labels=["reason"])
        refused.add_metric(["per_address"], self.data_port.refused_per_address)
        refused.add_metric(["full"], self.data_port.refused_full)
        yield refused


class _AuthCollector(Collector):
    """Refused requests and credential reloads (docs/SECURITY.md), at scrape time."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        helps = {"auth_unauthenticated": "client requests refused: missing or bad credentials",
                 "auth_denied": "client requests refused: no permission (ACCESS)",
                 "auth_rate_limited": "client requests or connections refused by a quota",
                 "auth_reloads": "credential file loads", "auth_reload_failures":
                 "credential file reloads refused (bad file; the previous one stays)"}
        for name, value in self.auth.stats().items():
            yield GaugeMetricFamily(f"seqlog_{name}", helps[name], value=value)


def create_app(config: ProcessConfig, *, listen_host: str | None = None,
               drain_timeout_s: float = DRAIN_TIMEOUT_S) -> web.Application:
    """``listen_host``: where the node-to-node server binds, when not the node's advertised
    ``host`` (a pod binds 0.0.0.0 and is reached at its DNS name). ``drain_timeout_s``: how
    long a stopping sequencer lets in-flight appends finish (the runner shortens it to fit
    its shutdown bound)."""
    me = config.me
    cluster = config.cluster
    fingerprint = cluster.fingerprint()
    epoch_store = open_epoch_store(_epoch_store_url(config),
                                   zk_tls=config.tls if config.tls.zookeeper else None)

    membership = Membership(config)
    security = node_security(config.tls)
    auth = Authenticator(config.auth)
    # A node with auth on and unreadable key or permissions files does not start open.
    auth.load()

    def address(node_id: NodeId) -> tuple[str, int] | None:
        node = membership.cluster.node(node_id)
        if node is None:
            return None
        # A proxy or NAT in front of the peer (transport.peer_addresses), else its own port.
        return config.transport.peer_address(node_id) or (node.host, node.data_port)

    pool = PeerPool(node_id=config.node_id, cluster_fingerprint=fingerprint,
                    config=config.transport, addresses=address, security=security)
    storage = None
    if "storage" in me.roles:
        storage = StorageNode(node_id=config.node_id, data_dir=config.data_dir,
                              config=config.storage, backlogs=BacklogTable.of(cluster))
    rebuild = None
    cluster_state = open_cluster_state(_epoch_store_url(config))
    if storage is not None:
        def storage_nodes() -> tuple[str, ...]:
            return tuple(n.node_id for n in membership.cluster.nodes if "storage" in n.roles)

        def request(node: NodeId, message: Message, callback: Any, timeout_ms: int) -> None:
            pool.request(node, message, callback, timeout_ms=timeout_ms)

        rebuild = RebuildRuntime(
            node=storage, data_dir=config.data_dir, cluster_name=cluster.cluster_name,
            state_store=cluster_state, storage_nodes=storage_nodes, request=request,
            sequencer_tail=lambda log_id: service.inflight_tail(log_id),
            active_tails=lambda: service.active_tails(),
            config=RebuildConfig(rate_bytes_per_s=config.storage.rebuild_rate_bytes_per_s,
                                 poll_interval_ms=config.storage.rebuild_poll_interval_ms,
                                 by_copyset=config.storage.rebuild_by_copyset))
    sequencer = None
    if "sequencer" in me.roles:
        sequencer = SequencerRuntime(
            node_id=config.node_id, config=config.sequencer, cluster=cluster, transport=pool,
            epoch_store=epoch_store, clock=SystemClock(), rng=random.Random(),
            provision_on_append=config.api.provision_on_append)
    gossip = GossipRuntime(node_id=config.node_id,
                           nodes=tuple(n.node_id for n in cluster.nodes), config=config.gossip,
                           transport=pool, clock=SystemClock(), rng=random.Random())
    if sequencer is not None:
        seq = sequencer
        gossip.subscribe(lambda view: seq.set_unavailable_nodes(
            frozenset(n for n, s in view.items() if s is NodeState.DEAD)))
    service = FrontEnd(config=config, pool=pool, sequencer=sequencer,
                       epoch_store=epoch_store, gossip=gossip)

    def on_cluster_change(new: ClusterConfig, change: ClusterChange) -> None:
        gossip.add_nodes(tuple(n.node_id for n in change.added))
        if sequencer is not None:
            sequencer.update_cluster(new)
        service.update_cluster(new)

    membership.subscribe(on_cluster_change)
    registry = CollectorRegistry()
    data_port_counters = Counters()
    registry.register(_RoleCollector(storage, sequencer, pool, gossip, rebuild,
                                     data_port_counters))
    registry.register(NodeSecurityCollector(security))
    registry.register(_AuthCollector(auth))
    registry.register(OpsCollector(epoch_store, sequencer,
                                   str(config.data_dir) if storage is not None else None))
    app = create_api_app(service, config.api, registry,
                         logs=logs_source(sequencer, SystemClock(), config.node_id),
                         auth=auth, limits=config.limits)
    app[MEMBERSHIP_KEY] = membership
    app[SECURITY_KEY] = security
    app[HTTPS_KEY] = security.tls is not None
    app[AUTH_KEY] = auth

    # /v1/cluster is what clients discover the cluster with: it must not wait on the epoch
    # store (a ZooKeeper reconnect held it for seconds). One read at a time, waited for up
    # to SHARDS_READ_WAIT_MS; past that the last state read answers, and the read finishes
    # in the background to refresh it.
    shards_known: list[dict[str, Any]] | None = None
    shards_read: asyncio.Task[None] | None = None

    async def read_shards() -> None:
        nonlocal shards_known
        status, state, _ = await cluster_state.read()
        if status is Status.OK:
            shards_known = cs.as_json(state)

    async def shards() -> list[dict[str, Any]] | None:
        nonlocal shards_read
        if shards_read is None or shards_read.done():
            shards_read = asyncio.get_running_loop().create_task(read_shards())
            # Retrieved here: a read that fails after the request stopped waiting for it
            # must not be logged as a never-retrieved exception.
            shards_read.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.wait((shards_read,), timeout=SHARDS_READ_WAIT_MS / 1000)
        return shards_known

    app[SHARDS_KEY] = shards
    tls = security.tls
    add_console(app, service, registry,
                peer_ssl=None if tls is None else lambda: tls.node_client)

    # One cleanup step per resource (aiohttp runs them in reverse order and runs every one
    # even when an earlier one raised): an exception in the sequencer's drain or the gossip
    # farewell must not skip ``storage.close()``, which drains the writer and fsyncs.
    async def epoch_store_step(_: web.Application) -> AsyncIterator[None]:
        yield
        await epoch_store.close()
        await cluster_state.close()

    async def storage_step(_: web.Application) -> AsyncIterator[None]:
        if storage is None:
            yield
            return
        assert rebuild is not None
        await rebuild.before_start()
        await storage.start()
        await rebuild.after_start()
        yield
        await rebuild.close()
        await storage.close()

    async def pool_step(_: web.Application) -> AsyncIterator[None]:
        yield
        await pool.close()

    async def server_step(_: web.Application) -> AsyncIterator[None]:
        server = await start_server(listen_host or me.host, me.data_port, node_id=config.node_id,
                                    cluster_fingerprint=fingerprint,
                                    handler=_Dispatcher(service, storage, gossip),
                                    config=config.transport, security=security, auth=auth,
                                    connections_max=config.limits.data_connections_max,
                                    addresses_max=config.limits.data_connections_per_ip_max,
                                    counters=data_port_counters)
        yield
        await server.close()

    async def auth_step(_: web.Application) -> AsyncIterator[None]:
        if not auth.enabled:
            yield
            return
        watcher = asyncio.get_running_loop().create_task(auth.watch())
        yield
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

    async def gossip_step(_: web.Application) -> AsyncIterator[None]:
        await gossip.start()
        yield
        try:
            await gossip.farewell()
        finally:
            await gossip.close()

    async def front_end_step(_: web.Application) -> AsyncIterator[None]:
        yield
        await service.close()

    def on_shards(retired: frozenset[NodeId], moved: frozenset[NodeId]) -> None:
        service.set_moved_nodes(moved)
        if sequencer is not None:
            sequencer.set_shard_states(retired, moved, membership.cluster.storage_node_ids)

    shard_watch = ShardWatch(cluster_state, on_shards)

    async def shard_watch_step(_: web.Application) -> AsyncIterator[None]:
        await shard_watch.poll_once()  # before the first activation (best effort)
        shard_watch.start()
        yield
        await shard_watch.close()

    async def sequencer_step(_: web.Application) -> AsyncIterator[None]:
        if sequencer is None:
            yield
            return
        await sequencer.start()
        yield
        try:
            await sequencer.drain(drain_timeout_s)
        finally:
            await sequencer.close()

    async def ready_step(_: web.Application) -> AsyncIterator[None]:
        service.started = True
        log.info("node %s ready: roles %s, http %s, data port %d", config.node_id,
                 ",".join(me.roles), me.http_address, me.data_port)
        yield
        service.started = False
        gossip.begin_failover()

    async def announce_shutdown(_: web.Application) -> None:
        # aiohttp runs on_shutdown as soon as the listeners are closed, before it waits up to
        # its shutdown timeout for in-flight HTTP requests (a long poll, a slow client): peers
        # must learn at once that this node is going away, not after that wait (a rolling
        # restart saw DEAD 4.2 s after SIGTERM, the whole HTTP drain bound).
        gossip.begin_failover()

    app.on_shutdown.append(announce_shutdown)
    # Started in this order, stopped in the reverse one.
    app.cleanup_ctx.extend((epoch_store_step, auth_step, storage_step, pool_step, server_step,
                            gossip_step, front_end_step, shard_watch_step, sequencer_step,
                            ready_step))
    return app


def create_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner that serves ``app`` on its sites: the lean HTTP edge for the hot routes in
    front of aiohttp for the rest (``services.http_edge``)."""
    return EdgeRunner(app, **kwargs)


def _epoch_store_url(config: ProcessConfig) -> str:
    if config.epoch_store == "file":
        return f"file://{config.epoch_store_dir}"
    return config.epoch_store

