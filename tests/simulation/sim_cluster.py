"""A whole simulated Seqlog cluster: storage nodes, sequencer nodes, the epoch store, the
network and clients, all driven by one seeded event queue, with the checkers attached.

Scenarios script it (``append``, ``crash_storage``, ``partition``, ``run_until``...); the
randomized run (``tests.simulation.runner``) adds a seeded workload and chaos on top.
Routing stands in for LogDevice's sequencer placement: each log goes to one sequencer node
until that node fails, drains, or a failover moves the log (leaving a zombie behind).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from sequencer.core.effects import AppendReply
from sequencer.core.sequencer import SequencerState
from shared.epoch_metadata import ProvisionSpec
from shared.read_merge import f_majority
from shared.status import Status
from shared.types import LogId, Lsn, NodeId, format_lsn
from tests.simulation.checkers import SafetyChecker
from tests.simulation.sim_client import NOTHING_WRITTEN, ClientAppend
from tests.simulation.sim_clock import EventQueue, SimClock
from tests.simulation.sim_epoch_store import SimEpochStore
from tests.simulation.sim_frontend import SimFrontends, tail_from_storage
from tests.simulation.sim_network import SimNetwork
from tests.simulation.sim_options import SimOptions
from tests.simulation.sim_rebuild import SimRebuildConfig, SimRebuilding
from tests.simulation.sim_sequencer import Core, SequencerEnv, SimSequencerNode
from tests.simulation.sim_storage import SimStorageNode
from tests.simulation.sim_trace import Trace


class SimCluster:
    tail_from_storage_while_recovering = False
    """T1's frontends answer GET tail from the storage nodes' (and a recovering owner's)
    release pointers while no owner is releasable, as ``FrontEnd.tail`` did when issue 16
    item 4 was filed: T1 must catch that (``test_broken_cores``)."""

    def __init__(self, seed: int, options: SimOptions, rng: random.Random, *,
                 verbose: bool = False) -> None:
        self.seed = seed
        self.options = options
        self.rng = rng
        self.clock = SimClock()
        self.queue = EventQueue(self.clock)
        self.trace = Trace(verbose=verbose)
        self.network = SimNetwork(self.queue, rng, options, self.trace)
        self.epoch_store = SimEpochStore()
        self.checker = SafetyChecker(replication_of=self.epoch_store.replication,
                                     clean_epoch_of=self.epoch_store.clean_epoch)
        self.storage = {
            node_id: SimStorageNode(
                node_id, network=self.network, queue=self.queue, rng=rng,
                disk_delay_ms_max=options.disk_delay_ms_max, trace=self.trace,
                on_disk_write=self.checker.on_disk_write, on_release=self.checker.on_release,
                on_damage=self.checker.on_damage)
            for node_id in (NodeId(f"n{i}") for i in range(1, options.storage_nodes_count + 1))
        }
        self.provision = ProvisionSpec(nodeset=tuple(self.storage),
                                       replication_factor=options.replication)
        self.sequencer_env = SequencerEnv(
            options=options, network=self.network, queue=self.queue, rng=rng,
            epoch_store=self.epoch_store, checker=self.checker, trace=self.trace,
            provision=self.provision, on_core_reply=self._on_core_reply,
            epoch_store_failure_ratio=options.epoch_store_failure_ratio)
        self.stats = self.sequencer_env.stats
        self.sequencers = {
            node_id: SimSequencerNode(node_id, self.sequencer_env)
            for node_id in (NodeId(f"s{i}") for i in range(1, options.sequencer_nodes_count + 1))
        }
        self.log_ids = [LogId(i) for i in range(1, options.logs_count + 1)]
        names = list(self.sequencers)
        self.route: dict[LogId, NodeId] = {
            log_id: names[index % len(names)] for index, log_id in enumerate(self.log_ids)}
        self.appends: list[ClientAppend] = []
        self._first_unanswered = 0
        """Every append before this index has its client answer (``quiescent``)."""
        self._next_request_id = 1
        self.healed = False
        self.finished = False
        """Set once the final checks ran: the periodic ones stop."""
        self.released_logs_count = 0
        self.stalled_logs_count = 0
        self.damaged_nodes: set[NodeId] = set()
        self.check_rng = random.Random(seed ^ 0x5EED)
        """Samples the checkers' f-majorities; apart from ``rng``, so that checking does not
        change a seed's schedule."""
        self.repair_rng = random.Random(seed ^ 0x4E9A)
        """Draws whether a damage is ranged and repaired (a mini-rebuild); apart from
        ``rng``, so that a seed's schedule stays what it was."""
        self.disk_rng = random.Random(seed ^ 0xD15C)
        """Draws the disk replacements; apart from ``rng``, so that a seed's schedule is what
        it was without them until the first replacement."""
        self.frontends = SimFrontends(self, seed, self.stats)
        """The sequencer nodes' frontends, which T1 asks for tails."""
        self.rebuilding = SimRebuilding(self, SimRebuildConfig(
            rate_bytes_per_s=options.rebuild_rate_bytes_per_s,
            chunk_bytes_max=options.rebuild_chunk_bytes_max))
        """Disk replacements and their rebuilds (``sim_rebuild``)."""

    @property
    def now_ms(self) -> int:
        return self.clock.now_ms()

    def log(self, text: str) -> None:
        self.trace.log(self.now_ms, text)

    # ---- clients --------------------------------------------------------------------------

    def append(self, log_id: LogId, payloads: tuple[bytes, ...], *, via: NodeId | None = None,
               post_heal: bool = False) -> ClientAppend:
        """Issue one append now; it reaches its sequencer node after the client delay."""
        append = ClientAppend(request_id=self._next_request_id, log_id=log_id,
                              payloads=payloads, issued_ms=self.now_ms, post_heal=post_heal)
        self._next_request_id += 1
        self.appends.append(append)
        node_id = via if via is not None else self.routed_node(log_id)
        if node_id is None:
            self._refuse(append, Status.NOSEQUENCER)
            return append
        append.node = node_id
        node = self.sequencers[node_id]

        def deliver() -> None:
            if not node.submit(append):
                self._refuse(append, Status.CONNFAILED if not node.up else Status.SHUTDOWN)

        self.queue.after(self.rng.randint(0, self.options.client_delay_ms_max), deliver)
        self.queue.after(self.options.append_timeout_ms,
                         lambda: append.answer(Status.TIMEDOUT, self.now_ms))
        return append

    def _refuse(self, append: ClientAppend, status: Status) -> None:
        append.refused = True
        append.answer(status, self.now_ms)
        self.checker.on_nothing_written(append)

    def _on_core_reply(self, append: ClientAppend, reply: AppendReply) -> None:
        append.core_reply = reply
        if reply.status == Status.OK:
            self.checker.on_ack(append, reply)
            self.log(f"ack #{append.request_id} log {append.log_id} "
                     f"{format_lsn(reply.first_lsn)}..{format_lsn(reply.last_lsn)}")
        else:
            self.log(f"answer #{append.request_id} log {append.log_id} {reply.status.name}")
        if reply.status in NOTHING_WRITTEN:
            self.checker.on_nothing_written(append)
        append.answer(reply.status, self.now_ms)

    def routed_node(self, log_id: LogId) -> NodeId | None:
        """The log's sequencer node; moves the log if that node cannot take appends."""
        current = self.route.get(log_id)
        if current is not None and self.sequencers[current].accepts_appends():
            return current
        usable = [n for n, node in self.sequencers.items() if node.accepts_appends()]
        if not usable:
            return None
        self.route[log_id] = self.rng.choice(usable)
        return self.route[log_id]

    # ---- faults ---------------------------------------------------------------------------

    def crash_storage(self, node_id: NodeId, *, down_ms: int | None = None) -> None:
        self.stats["storage_crash"] += 1
        self.storage[node_id].crash()
        if down_ms is not None:
            self.queue.after(down_ms, lambda: self.restart_storage(node_id))

    def restart_storage(self, node_id: NodeId) -> None:
        node = self.storage[node_id]
        if node.up:
            return
        options, lose_entries, repair = self.options, 0, False
        if (options.damage_ratio and not self.healed
                and node_id not in self.rebuilding.rebuilding()
                and len(self.damaged_nodes | {node_id}
                        | set(self.rebuilding.rebuilding())) <= options.replication - 1
                and self.rng.random() < options.damage_ratio):
            # At most R - 1 distinct damaged nodes, counting one whose disk was replaced and
            # is not rebuilt yet, or whose damage is being repaired: every acknowledged
            # record keeps a copy.
            lose_entries = self.rng.randint(1, options.damage_entries_max)
            repair = (options.damage_repair_ratio > 0
                      and self.repair_rng.random() < options.damage_repair_ratio)
        self.restart_damaged(node_id, lose_entries=lose_entries, repair=repair)

    def restart_damaged(self, node_id: NodeId, *, lose_entries: int, repair: bool) -> None:
        """The (down) node comes back; ``lose_entries`` > 0: without its last that many
        writes, and ``repair``: that damage is ranged and mini-rebuilt (``sim_rebuild``),
        else it stays unrepaired (the node counts among the damaged for the run)."""
        node = self.storage[node_id]
        if lose_entries:
            if repair:
                # Counted among those being rebuilt until it is repaired.
                self.rebuilding.repair_pending.add(node_id)
                self.rebuilding.start_polling()
                self.stats["storage_damaged_repaired"] += 1
            else:
                self.damaged_nodes.add(node_id)
            self.stats["storage_damaged"] += 1
        node.restart(lose_entries=lose_entries, repair=repair)
        self.rebuilding.on_restart(node_id)

    def may_replace_disk(self, node_id: NodeId) -> bool:
        """At most R - 1 copies lost between rebuilds: one disk replaced at a time, after the
        previous rebuild finished, and never so that damaged nodes plus this one reach R."""
        return (not self.healed and not self.rebuilding.rebuilding()
                and len(self.damaged_nodes | {node_id}) <= self.options.replication - 1)

    def replace_disk(self, node_id: NodeId, *, down_ms: int | None = None) -> None:
        """The node goes down (if up) and comes back, after ``down_ms``, on a new empty disk;
        it is then rebuilt (``sim_rebuild``)."""
        self.stats["disk_replaced"] += 1
        node = self.storage[node_id]
        if node.up:
            self.crash_storage(node_id)
        lost = node.replace_disk()
        self.checker.on_wiped(node_id, lost)
        self.rebuilding.replaced_pending.add(node_id)
        self.rebuilding.start_polling()
        if down_ms is not None:
            self.queue.after(down_ms, lambda: self.restart_storage(node_id))

    def stall_storage(self, node_id: NodeId, duration_ms: int) -> None:
        """The node stops handling and answering for ``duration_ms`` but keeps its
        connections (SIGSTOP)."""
        self.stats["storage_stall"] += 1
        self.log(f"stall storage {node_id} for {duration_ms}ms")
        self.network.stall(node_id, self.now_ms + duration_ms)

    def crash_sequencer(self, node_id: NodeId, *, down_ms: int | None = None) -> None:
        self.sequencers[node_id].crash()
        if down_ms is not None:
            self.queue.after(down_ms, lambda: self.restart_sequencer(node_id))

    def restart_sequencer(self, node_id: NodeId) -> None:
        node = self.sequencers[node_id]
        if not node.up:
            node.restart()

    def drain_sequencer(self, node_id: NodeId, *, down_ms: int = 0) -> None:
        """Graceful restart: drain, mark drained epochs clean, go down, come back."""
        def closed() -> None:
            self.queue.after(0 if self.healed else down_ms,
                             lambda: self.restart_sequencer(node_id))

        self.sequencers[node_id].drain(closed)

    def failover(self, log_id: LogId, node_id: NodeId) -> None:
        """Route the log elsewhere; the old node keeps its core running (a zombie)."""
        self.stats["failover"] += 1
        self.log(f"failover log {log_id}: {self.route.get(log_id)} -> {node_id}")
        self.route[log_id] = node_id

    def partition(self, sequencer_nodes: list[NodeId], storage_nodes: list[NodeId],
                  duration_ms: int) -> None:
        self.stats["partition"] += 1
        self.log(f"partition {sorted(sequencer_nodes)} | {sorted(storage_nodes)} "
                 f"for {duration_ms}ms")
        self.network.partition(frozenset(sequencer_nodes), frozenset(storage_nodes),
                               self.now_ms + duration_ms)

    def heal(self) -> None:
        """All nodes up, no loss, no partitions, no epoch-store failures from now on."""
        self.healed = True
        self.network.heal()
        self.sequencer_env.epoch_store_failure_ratio = 0.0
        for node_id, storage in self.storage.items():
            if not storage.up:
                self.restart_storage(node_id)
        for node_id, sequencer in self.sequencers.items():
            if not sequencer.up:
                self.restart_sequencer(node_id)
        self.log("HEAL")

    # ---- running --------------------------------------------------------------------------

    def run_until(self, predicate: Callable[[], bool], *, timeout_ms: int) -> bool:
        """Run events until ``predicate`` holds (True) or ``timeout_ms`` of simulated time
        passed (False)."""
        deadline_ms = self.now_ms + timeout_ms
        while not predicate():
            next_ms = self.queue.next_time_ms()
            if next_ms is None or next_ms > deadline_ms:
                self.clock.advance_to(max(deadline_ms, self.now_ms))
                return predicate()
            self.queue.run_next()
        return True

    def run_for(self, duration_ms: int) -> None:
        self.run_until(lambda: False, timeout_ms=duration_ms)

    def live_cores(self) -> list[Core]:
        return [core for node in self.sequencers.values() if node.up
                for core in node.cores.values()]

    def quiescent(self) -> bool:
        """Every append answered by the client and by its core (unless its sequencer died),
        no appender in flight, no activation or drain under way, every node up."""
        appends, first = self.appends, self._first_unanswered
        while first < len(appends) and appends[first].outcome is not None:
            first += 1  # appends are mostly answered in order: each is passed over once
        self._first_unanswered = first
        if any(a.outcome is None for a in itertools.islice(appends, first, None)):
            return False
        if any(node.inflight or node.draining or not node.up
               for node in self.sequencers.values()):
            return False
        if not all(storage.up for storage in self.storage.values()):
            return False
        if self.rebuilding.rebuilding():
            return False
        return not any(core.sequencer.appenders
                       or core.sequencer.state is SequencerState.ACTIVATING
                       or core.sequencer.recovery is not None
                       for core in self.live_cores())

    # ---- periodic checkers (R2, T1) -------------------------------------------------------

    def check_now(self) -> None:
        """R2 and T1 for every log, now."""
        for log_id in self.log_ids:
            metadata = self.epoch_store.metadata.get(log_id)
            if metadata is None:
                continue
            nodeset = tuple(sorted(metadata.nodeset))
            size = f_majority(len(nodeset), metadata.replication_factor)
            subsets = list(itertools.combinations(nodeset, size))
            if len(subsets) > self.options.reader_subsets_max:
                subsets = self.check_rng.sample(subsets, self.options.reader_subsets_max)
            self.checker.check_readers_now(log_id, self.storage, nodeset,
                                           metadata.replication_factor, subsets)
            self.check_tails(log_id, nodeset)

    def check_tails(self, log_id: LogId, nodeset: tuple[NodeId, ...]) -> None:
        """T1: every up sequencer node's ``FrontEnd.tail`` (the shipped code, through the
        simulated transport: ``sim_frontend``) is asked for the log's tail; each OK answer
        must be at least the highest tail any frontend reported before it was asked. With
        ``tail_from_storage_while_recovering`` a frontend answers NOTREADY with the storage
        nodes' release pointers instead, as ``FrontEnd.tail`` did when issue 16 item 4 was
        filed (after a restart that went backwards)."""
        if self.tail_from_storage_while_recovering:
            self.frontends.broken_tail = tail_from_storage
        self.frontends.ask_tails(log_id, nodeset)

    def release_lsn_of(self, log_id: LogId) -> dict[str, Lsn]:
        return {node_id: node.release_lsn(log_id) for node_id, node in self.storage.items()}
