"""One simulated run per seed (TigerBeetle's VOPR, lite): derive the options from the seed,
issue a random workload while injecting faults, heal, then check liveness and the disks.

Phases: chaos (``[0, chaos_ms)``: appends and faults) -> heal -> quiescent within
``liveness_ms_max`` (L1) -> a few appends per log that must all succeed and, in a releasable
epoch, get released on every storage node (L2) -> final disk checks (C2, C4). Safety checkers
run at every event throughout. Any failure raises ``SimulationFailure`` naming the seed.
"""

from __future__ import annotations

import contextlib
import random
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from sequencer.core.sequencer import SequencerState
from shared.status import Status
from shared.types import LogId, format_lsn
from tests.simulation.checkers import CHECKER_NAMES, CheckFailed, fail
from tests.simulation.sim_client import ClientAppend
from tests.simulation.sim_cluster import SimCluster
from tests.simulation.sim_options import SimOptions

POST_HEAL_ATTEMPTS_MAX = 2
"""A post-heal append may fail once, only because its sequencer was stale and got
preempted (it then reactivates in the newest epoch)."""


class SimulationFailure(AssertionError):
    def __init__(self, seed: int, checker: str, message: str, cluster: SimCluster) -> None:
        super().__init__(message)
        self.seed = seed
        self.checker = checker
        self.cluster = cluster
        """The cluster as it was when the checker fired, for post-mortems."""


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    digest: str
    sim_ms: int
    events_count: int
    outcomes: dict[str, int]
    acked_count: int
    releases_count: int
    activations_count: int
    messages_count: int
    released_logs_count: int
    """Logs whose post-heal appends ended in a releasable epoch (and were released)."""
    stalled_logs_count: int
    """Logs whose current epoch sits over an unclean one, so nothing new is released."""
    stats: dict[str, int]

    def summary(self) -> str:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        stats = " ".join(f"{k}={v}" for k, v in sorted(self.stats.items()))
        return (f"seed {self.seed}: ok, {self.sim_ms}ms simulated, {self.events_count} events, "
                f"{self.messages_count} messages, {self.acked_count} acked, "
                f"{self.activations_count} activations, {self.releases_count} release moves, "
                f"logs released/stalled {self.released_logs_count}/{self.stalled_logs_count}; "
                f"outcomes {outcomes}; {stats}; digest {self.digest[:16]}")


def reproduce_line(seed: int, faults: frozenset[str] = frozenset()) -> str:
    extra = "".join(f" --fault {fault}" for fault in sorted(faults))
    return f"reproduce with: python -m tests.simulation.run --seed {seed}{extra}"


def run_simulation(seed: int, *, options: SimOptions | None = None,
                   faults: frozenset[str] = frozenset(), verbose: bool = False) -> SimResult:
    """The randomized run of ``seed``; ``options`` overrides the ones derived from it;
    ``faults`` adds opt-in fault kinds (``sim_options.OPT_IN_FAULTS``) to the generated ones."""
    rng = random.Random(seed)
    generated = SimOptions.generate(rng, faults=faults)
    options = options or generated
    cluster = SimCluster(seed, options, rng, verbose=verbose)
    try:
        with failure_report(cluster, reproduce_line(seed, faults)):
            schedule_workload(cluster)
            schedule_chaos(cluster)
            cluster.run_for(options.chaos_ms)
            heal_and_check(cluster)
    finally:
        cluster.frontends.close()
    return result_of(cluster)


@contextlib.contextmanager
def failure_report(cluster: SimCluster, reproduce: str) -> Iterator[None]:
    """Turns any assertion inside a run into a ``SimulationFailure`` with the seed, the
    checker, the options, the last trace lines and how to reproduce."""
    try:
        yield
    except SimulationFailure:
        raise
    except CheckFailed as error:
        raise _failure(cluster, error.checker, str(error), reproduce) from error
    except AssertionError as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        checker = "TEST" if "/tests/" in frame.filename else "CORE"
        detail = (f"checker {checker} ({CHECKER_NAMES[checker]}): {error!r} at "
                  f"{frame.filename}:{frame.lineno} ({frame.line})")
        raise _failure(cluster, checker, detail, reproduce) from error


def _failure(cluster: SimCluster, checker: str, detail: str,
             reproduce: str) -> SimulationFailure:
    message = (
        f"simulation of seed {cluster.seed} failed at t={cluster.now_ms}ms: {detail}\n"
        f"options: {cluster.options.describe()}\n"
        f"last events:\n{cluster.trace.tail()}\n{reproduce}"
    )
    return SimulationFailure(cluster.seed, checker, message, cluster)


# ---- workload and chaos --------------------------------------------------------------------

def schedule_workload(cluster: SimCluster) -> None:
    """``appends_count`` appends at random times, some of them in bursts."""
    rng, options = cluster.rng, cluster.options
    index = 0
    while index < options.appends_count:
        at_ms = rng.randrange(options.chaos_ms)
        burst_count = 1
        if options.burst_ratio and rng.random() < options.burst_ratio:
            burst_count = rng.randint(2, options.burst_appends_max)
        for _ in range(min(burst_count, options.appends_count - index)):
            log_id = rng.choice(cluster.log_ids)
            count = 1
            if options.batch_payloads_max > 1 and rng.random() < options.batch_ratio:
                count = rng.randint(2, options.batch_payloads_max)
            payloads = tuple(f"{cluster.seed}:{index}:{j}".encode() for j in range(count))
            _append_at(cluster, at_ms, log_id, payloads)
            index += 1


def _append_at(cluster: SimCluster, at_ms: int, log_id: LogId,
               payloads: tuple[bytes, ...]) -> None:
    def issue() -> None:
        cluster.append(log_id, payloads)

    cluster.queue.at(at_ms, issue)


def schedule_chaos(cluster: SimCluster) -> None:
    options = cluster.options
    for tick_ms in range(options.chaos_tick_ms, options.chaos_ms, options.chaos_tick_ms):
        cluster.queue.at(tick_ms, lambda: chaos_tick(cluster))
    schedule_checks(cluster)


def schedule_checks(cluster: SimCluster) -> None:
    """R2 and T1 every ``reader_check_interval_ms``, from the start to the end of the run."""
    interval_ms = cluster.options.reader_check_interval_ms
    if not interval_ms:
        return

    def check() -> None:
        if cluster.finished:
            return
        cluster.check_now()
        cluster.queue.after(interval_ms, check)

    cluster.queue.after(interval_ms, check)


def chaos_tick(cluster: SimCluster) -> None:
    rng, o = cluster.rng, cluster.options
    if o.storage_crash_ratio and rng.random() < o.storage_crash_ratio:
        up = [n for n, s in cluster.storage.items() if s.up]
        if up:
            cluster.crash_storage(rng.choice(up), down_ms=rng.randint(50, o.storage_down_ms_max))
    if o.partition_ratio and rng.random() < o.partition_ratio:
        storage = rng.sample(list(cluster.storage), rng.randint(1, len(cluster.storage)))
        sequencers = rng.sample(list(cluster.sequencers), rng.randint(1, len(cluster.sequencers)))
        cluster.partition(sequencers, storage, rng.randint(50, o.partition_ms_max))
    if o.sequencer_crash_ratio and rng.random() < o.sequencer_crash_ratio:
        up = [n for n, s in cluster.sequencers.items() if s.up]
        if up:
            cluster.crash_sequencer(rng.choice(up),
                                    down_ms=rng.randint(20, o.sequencer_down_ms_max))
    if o.failover_ratio and rng.random() < o.failover_ratio:
        log_id = rng.choice(cluster.log_ids)
        others = [n for n, s in cluster.sequencers.items()
                  if s.accepts_appends() and n != cluster.route.get(log_id)]
        if others:
            cluster.failover(log_id, rng.choice(others))
    if o.stall_ratio and rng.random() < o.stall_ratio:
        up = [n for n, s in cluster.storage.items() if s.up]
        if up:
            cluster.stall_storage(rng.choice(up), rng.randint(20, o.stall_ms_max))
    disk_rng = cluster.disk_rng
    if o.disk_replace_ratio and disk_rng.random() < o.disk_replace_ratio:
        node_id = disk_rng.choice(list(cluster.storage))
        if cluster.may_replace_disk(node_id):
            cluster.replace_disk(node_id, down_ms=disk_rng.randint(50, o.storage_down_ms_max))
    if o.drain_ratio and rng.random() < o.drain_ratio:
        usable = [n for n, s in cluster.sequencers.items() if s.accepts_appends()]
        if usable:
            cluster.drain_sequencer(rng.choice(usable),
                                    down_ms=rng.randint(10, o.sequencer_down_ms_max))


# ---- after healing ---------------------------------------------------------------------------

def heal_and_check(cluster: SimCluster) -> None:
    """Heal, then check liveness (L1, L2) and the disks (C2, C4)."""
    cluster.heal()
    if not cluster.run_until(cluster.quiescent, timeout_ms=cluster.options.liveness_ms_max):
        fail("L1", f"not quiescent {cluster.options.liveness_ms_max}ms after healing: "
             f"{describe_unquiet(cluster)}")
    for log_id in cluster.log_ids:
        check_post_heal_appends(cluster, log_id)
    cluster.checker.check_final(cluster.storage.values())
    if cluster.stats["disk_replaced"] or cluster.stats["storage_damaged_repaired"]:
        cluster.checker.check_rereplicated_all()
    if cluster.options.reader_check_interval_ms:
        cluster.check_now()
    cluster.finished = True
    for log_id in cluster.log_ids:
        metadata = cluster.epoch_store.metadata.get(log_id)
        if metadata is not None:
            release = max(cluster.release_lsn_of(log_id).values())
            cluster.checker.check_readers_agree(log_id, cluster.storage, metadata.nodeset,
                                                metadata.replication_factor, release)


def check_post_heal_appends(cluster: SimCluster, log_id: LogId) -> None:
    options = cluster.options
    acked: list[ClientAppend] = []
    for index in range(options.post_heal_appends_per_log):
        for attempt in range(POST_HEAL_ATTEMPTS_MAX):
            payload = f"{cluster.seed}:heal:{log_id}:{index}:{attempt}".encode()
            append = cluster.append(log_id, (payload,), post_heal=True)
            wait_for_answer(cluster, append, options.append_timeout_ms + 1)
            if append.outcome == Status.OK:
                acked.append(append)
                break
            node = cluster.sequencers[append.node] if append.node else None
            core = node.cores.get(append.log_id) if node else None
            stale = (attempt == 0 and append.outcome == Status.TIMEDOUT and core is not None
                     and core.sequencer.state is SequencerState.PREEMPTED)
            if not stale:
                state = f"{core.sequencer.state.name} epoch {core.sequencer.epoch}" if core else "-"
                fail("L2", f"append #{append.request_id} to log {log_id} after healing "
                     f"(attempt {attempt + 1}) ended {append.outcome}: "
                     f"{append.core_reply.message if append.core_reply else ''} "
                     f"(sequencer {append.node}: {state})")
    check_post_heal_release(cluster, acked)


def wait_for_answer(cluster: SimCluster, append: ClientAppend, timeout_ms: int) -> bool:
    return cluster.run_until(lambda: append.outcome is not None, timeout_ms=timeout_ms)


def check_post_heal_release(cluster: SimCluster, acked: list[ClientAppend]) -> None:
    if not cluster.run_until(cluster.quiescent, timeout_ms=cluster.options.liveness_ms_max):
        fail("L1", f"not quiescent after the post-heal appends: {describe_unquiet(cluster)}")
    if not acked:
        return
    last = acked[-1]
    assert last.node is not None
    core = cluster.sequencers[last.node].cores[last.log_id]
    sequencer = core.sequencer
    if not sequencer.releasable:
        # Epoch recovery must have finished: quiescence waits for it.
        fail("L2", f"{core.name} epoch {sequencer.epoch} is quiescent but not releasable "
             f"(last clean epoch {cluster.epoch_store.clean_epoch(last.log_id)})")
    if sequencer.release_lsn < last.last_lsn:
        fail("L2", f"{core.name} in releasable epoch {sequencer.epoch} acked "
             f"{format_lsn(last.last_lsn)} but released only {format_lsn(sequencer.release_lsn)}")
    target = sequencer.release_lsn
    nodes = sequencer.metadata.nodeset if sequencer.metadata else ()
    wait_ms = 3 * cluster.options.release_broadcast_interval_ms + 4 * cluster.options.delay_ms_max
    if not cluster.run_until(
            lambda: all(cluster.storage[n].release_lsn(last.log_id) >= target for n in nodes),
            timeout_ms=wait_ms):
        behind = {n: format_lsn(cluster.storage[n].release_lsn(last.log_id)) for n in nodes}
        fail("L2", f"log {last.log_id}: storage release pointers {behind} did not reach "
             f"{format_lsn(target)} within {wait_ms}ms")
    cluster.released_logs_count += 1


def describe_unquiet(cluster: SimCluster) -> str:
    parts = [f"{sum(a.outcome is None for a in cluster.appends)} appends unanswered"]
    for node_id, node in cluster.sequencers.items():
        parts.append(f"{node_id}: up={node.up} draining={node.draining} "
                     f"inflight={sorted(node.inflight)[:8]}")
        for core in node.cores.values():
            seq = core.sequencer
            waves = [(a.lsn, a.wave, dict(a.recipients)) for a in seq.appenders.values()][:3]
            parts.append(f"  {core.name} log {seq.log_id}: {seq.state.name} epoch {seq.epoch} "
                         f"appenders={len(seq.appenders)} {waves}")
    down = [n for n, s in cluster.storage.items() if not s.up]
    parts.append(f"storage down: {down}")
    return "\n".join(parts)


def result_of(cluster: SimCluster) -> SimResult:
    outcomes = Counter(a.outcome.name if a.outcome is not None else "NONE"
                       for a in cluster.appends)
    return SimResult(
        seed=cluster.seed, digest=cluster.trace.digest(), sim_ms=cluster.now_ms,
        events_count=cluster.queue.events_run_count, outcomes=dict(outcomes),
        acked_count=len(cluster.checker.acked), releases_count=cluster.checker.releases_count,
        activations_count=cluster.epoch_store.activations_count,
        messages_count=cluster.network.messages_sent_count,
        released_logs_count=cluster.released_logs_count,
        stalled_logs_count=cluster.stalled_logs_count,
        stats={**cluster.stats, **{f"lost_{kind.lower()}": count for kind, count
                                   in cluster.network.lost_by_type.items()},
               "reader_checks": cluster.checker.reads_checked_count},
    )
