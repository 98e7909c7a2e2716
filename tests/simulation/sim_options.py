"""Everything a simulated run may vary, derived from the seed (``SimOptions.generate``) or set
by hand for a targeted scenario (``SimOptions.calm`` plus overrides).

Fault kinds are switched on per seed with a coin flip ("swarm testing"): a seed that never
crashes storage nodes but loses many messages finds different bugs from one that does both.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from shared.types import ESN_MAX

OPT_IN_FAULTS: frozenset[str] = frozenset()
"""Fault kinds generated runs have only when asked for (``--fault``): one that finds a known
open defect waits here until it is fixed. (``damage`` did, for issue 16 item 3, until storage
nodes reported what they can vouch for.)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    # ---- cluster shape ----
    storage_nodes_count: int = 3
    sequencer_nodes_count: int = 1
    replication: int = 2
    logs_count: int = 1
    # ---- workload ----
    appends_count: int = 50
    batch_payloads_max: int = 1
    """Each append carries 1..this many payloads (an atomic batch)."""
    batch_ratio: float = 0.0
    """Share of appends that are batches of 2..``batch_payloads_max``."""
    burst_ratio: float = 0.0
    """Share of workload slots that issue a burst of 2..``burst_appends_max`` appends at once
    (concurrent appends that the sequencer may group into one appender)."""
    burst_appends_max: int = 6
    # ---- sequencer ----
    window_appends_max: int = 64
    esn_max: int = ESN_MAX
    store_timeout_ms_min: int = 10
    store_timeout_ms_max: int = 2_000
    release_broadcast_interval_ms: int = 200
    append_timeout_ms: int = 10_000
    append_group_records_max: int = 256
    idle_deactivate_ms: int = 0
    """Above 0: a core idle this long with nothing in flight is deactivated (epoch marked
    clean, core dropped), as ``SequencerRuntime`` does; 0 keeps every core."""
    # ---- network (sequencer <-> storage nodes) ----
    loss_ratio: float = 0.0
    duplicate_ratio: float = 0.0
    reorder: bool = False
    delay_ms_min: int = 1
    delay_ms_max: int = 5
    connfail_delay_ms: int = 2
    """How long a request to a down or cut-off node takes to fail with CONNFAILED."""
    partition_connfail_ratio: float = 0.5
    """Share of requests across a partition that fail at once rather than vanish."""
    client_delay_ms_max: int = 2
    # ---- storage ----
    disk_delay_ms_max: int = 2
    """Time between a STORE's arrival and its record being durable (then STORED goes out)."""
    # ---- epoch store ----
    epoch_store_delay_ms_max: int = 5
    epoch_store_failure_ratio: float = 0.0
    # ---- chaos (only while appends are being issued) ----
    chaos_ms: int = 2_000
    """Appends are issued, and faults injected, during ``[0, chaos_ms)``."""
    chaos_tick_ms: int = 25
    storage_crash_ratio: float = 0.0
    """Per chaos tick: odds that an up storage node crashes."""
    storage_down_ms_max: int = 1_000
    partition_ratio: float = 0.0
    partition_ms_max: int = 800
    sequencer_crash_ratio: float = 0.0
    sequencer_down_ms_max: int = 500
    failover_ratio: float = 0.0
    """Per chaos tick: odds that a log is routed to another sequencer node while the old one
    keeps running (a zombie that only storage-node seals stop)."""
    drain_ratio: float = 0.0
    """Per chaos tick: odds that a sequencer node drains gracefully and restarts."""
    drain_timeout_ms: int = 2_000
    clean_loss_ratio: float = 0.0
    """Odds that a CLEAN, or its CLEANED, is lost without a word (the other messages keep
    ``loss_ratio``): recovery's members then hang on it, others keep stray copies until the
    sequencer's next broadcast sends the CLEAN again."""
    stall_ratio: float = 0.0
    """Per chaos tick: odds that an up storage node stalls for up to ``stall_ms_max``: it
    keeps its connections but handles nothing and answers nothing until it resumes, then
    handles what queued up, in order (SIGSTOP, a stuck disk)."""
    stall_ms_max: int = 800
    damage_ratio: float = 0.0
    """Odds that a crashed storage node comes back damaged: it lost the last
    1..``damage_entries_max`` durable entries it wrote (records, holes, seals), as a corrupt or
    torn suffix of its segment would, and its restart's scan says so (authoritative status).
    At most R - 1 distinct nodes are damaged per run, so that every acknowledged record keeps
    a copy."""
    damage_entries_max: int = 8
    damage_repair_ratio: float = 0.0
    """Odds that such a damage's scope is known (its LSN ranges, as a damaged segment's
    index file says) and a mini-rebuild repairs it (``sim_rebuild``); the node then no
    longer counts among the damaged once it is repaired. Otherwise it stays unrepaired."""
    disk_replace_ratio: float = 0.0
    """Per chaos tick: odds that a storage node's disk is replaced (down, back after up to
    ``storage_down_ms_max`` on a new empty disk, then rebuilt: ``sim_rebuild``). One at a
    time, each after the previous rebuild finished, and with the damaged nodes at most R - 1
    nodes missing copies (``SimCluster.may_replace_disk``)."""
    rebuild_rate_bytes_per_s: int = 0
    """Each rebuild donor's rate limit (0: none)."""
    rebuild_chunk_bytes_max: int = 4096
    recovery_timeout_ms: int = 5_000
    """The sequencers' ``recovery_timeout_ms``: an attempt not done by then starts over."""
    # ---- checkers ----
    reader_check_interval_ms: int = 200
    """Every this often (0: never) the readers-agree checker (R2) reads every log up to its
    release pointer through ``reader_subsets_max`` f-majorities of its nodeset, and the tail
    checker (T1) looks at every frontend's tail."""
    reader_subsets_max: int = 6
    # ---- after healing ----
    post_heal_appends_per_log: int = 3
    liveness_ms_max: int = 60_000
    """Simulated time allowed to become quiescent after healing."""

    def __post_init__(self) -> None:
        assert 1 <= self.replication <= self.storage_nodes_count, self
        assert self.sequencer_nodes_count >= 1 and self.logs_count >= 1, self
        assert 1 <= self.batch_payloads_max <= self.esn_max, self
        assert 0 < self.delay_ms_min <= self.delay_ms_max, self

    @classmethod
    def calm(cls, **overrides: Any) -> SimOptions:
        """No faults at all; scenarios add the ones they script."""
        return cls(**overrides)

    @classmethod
    def generate(cls, rng: random.Random, *, faults: frozenset[str] = frozenset()) -> SimOptions:
        """``faults``: opt-in fault kinds beyond the default mix (``OPT_IN_FAULTS``)."""
        assert faults <= OPT_IN_FAULTS, faults - OPT_IN_FAULTS
        storage_nodes_count = rng.randint(3, 6)

        def maybe(low: float, high: float) -> float:
            # Swarm testing: each fault kind is present in about half of the seeds.
            return rng.uniform(low, high) if rng.random() < 0.5 else 0.0

        batch_payloads_max = rng.randint(1, 5)
        delay_ms_min = rng.randint(1, 5)
        return cls(
            storage_nodes_count=storage_nodes_count,
            sequencer_nodes_count=rng.randint(1, 2),
            replication=rng.randint(1, min(3, storage_nodes_count)),
            logs_count=rng.randint(1, 3),
            appends_count=rng.randint(50, 300),
            batch_payloads_max=batch_payloads_max,
            batch_ratio=rng.uniform(0.0, 0.5) if batch_payloads_max > 1 else 0.0,
            burst_ratio=maybe(0.05, 0.4),
            window_appends_max=rng.choice((2, 3, 4, 8, 16)),
            append_group_records_max=rng.choice((1, 4, 256)),
            esn_max=rng.randint(12, 40) if rng.random() < 0.25 else ESN_MAX,
            store_timeout_ms_min=rng.choice((5, 10, 20, 50)),
            store_timeout_ms_max=rng.choice((500, 1_000, 2_000)),
            release_broadcast_interval_ms=rng.choice((50, 100, 300)),
            append_timeout_ms=rng.choice((2_000, 5_000, 10_000)),
            loss_ratio=maybe(0.001, 0.1),
            duplicate_ratio=maybe(0.001, 0.05),
            reorder=rng.random() < 0.3,
            delay_ms_min=delay_ms_min,
            delay_ms_max=delay_ms_min + rng.choice((0, 2, 10, 40)),
            partition_connfail_ratio=rng.random(),
            disk_delay_ms_max=rng.choice((0, 1, 5)),
            epoch_store_failure_ratio=maybe(0.05, 0.3),
            chaos_ms=rng.randint(1_000, 4_000),
            storage_crash_ratio=maybe(0.005, 0.04),
            storage_down_ms_max=rng.choice((200, 1_000, 3_000)),
            partition_ratio=maybe(0.005, 0.03),
            sequencer_crash_ratio=maybe(0.002, 0.02),
            failover_ratio=maybe(0.002, 0.02),
            drain_ratio=maybe(0.002, 0.02),
            # Short enough that cores go idle between the workload's appends and come back.
            idle_deactivate_ms=rng.choice((0, 0, 50, 200, 600)),
            # Drawn after the older options, so that those stay what they were per seed.
            **cls._generate_recovery_faults(rng, maybe, faults),
            **cls._generate_disk_faults(rng, storage_nodes_count),
        )

    @staticmethod
    def _generate_disk_faults(rng: random.Random, storage_nodes_count: int) -> dict[str, Any]:
        # From an rng of their own seeded by the run's state, so that every option above, and
        # the whole schedule of a seed without disk replacements, stays what it was.
        own = random.Random(hash(rng.getstate()[1]))
        del storage_nodes_count
        return {
            "disk_replace_ratio": own.uniform(0.01, 0.05) if own.random() < 0.5 else 0.0,
            "rebuild_rate_bytes_per_s": own.choice((0, 2_000, 20_000)),
            "rebuild_chunk_bytes_max": own.choice((64, 512, 4096)),
            # Drawn last: the draws above stay what they were per seed.
            "damage_repair_ratio": own.choice((0.0, 0.5, 1.0)),
        }

    @staticmethod
    def _generate_recovery_faults(rng: random.Random, maybe: Any,
                                  faults: frozenset[str]) -> dict[str, Any]:
        damage_ratio = maybe(0.2, 0.8)
        del faults  # none opt-in at the moment
        return {
            # Short ones restart attempts mid-recovery (a member that stalls or lost a CLEAN).
            # (Not much shorter: an attempt that needs longer than this never finishes.)
            "recovery_timeout_ms": rng.choice((600, 1_500, 5_000)),
            "clean_loss_ratio": maybe(0.1, 0.6),
            "stall_ratio": maybe(0.005, 0.03),
            "stall_ms_max": rng.choice((200, 800, 2_000)),
            "damage_ratio": damage_ratio,
            "damage_entries_max": rng.choice((1, 4, 16)),
        }

    def describe(self) -> str:
        defaults = SimOptions()
        changed = [
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(defaults, f.name)
        ]
        return "SimOptions(" + ", ".join(changed) + ")"
