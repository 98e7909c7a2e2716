"""The seeded fault schedule of a chaos run: a pure function of the seed and the cluster's
shape, so ``python -m tests.chaos.run --seed N`` replays the same faults in the same order
at the same offsets (the interleaving with the workload still depends on real timing).

Faults come one after another, each undone before the next starts, so that the cluster
always keeps enough nodes to make progress:

- ``kill``: kill -9 one node, restart it ``duration_s`` later on the same data.
- ``pause``: SIGSTOP one node for ``duration_s``, then SIGCONT (past the gossip threshold
  it is declared DEAD and its logs fail over; after SIGCONT it must not act on stale state).
- ``isolate``: every link to and from one node in ``mode`` (blackhole or drop).
- ``split``: the links between a minority group and the rest, both ways.
- ``oneway``: one directed link ``src>dst`` only.
- ``delay``: every link to and from one node delayed by ``delay_ms`` each way.
- ``killall``: kill -9 every node at once (a power cut), restart them all ``duration_s``
  later on their data.
- ``failpoint``: kill -9 one node, restart it with ``SEQLOG_FAILPOINTS=failpoint``, give it
  ``duration_s`` to crash there, then restart it clean (kill -9 first if it did not crash).
- ``wipe`` (only with ``disk_faults``): kill -9 one storage node, delete everything in its
  data directory but its config (a replaced disk), restart it, and wait until its rebuild
  finished (at most ``WIPE_REBUILD_S_MAX``), so at most one disk is lost at a time, each
  after the previous rebuild finished.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

ACTIONS = ("kill", "pause", "isolate", "split", "oneway", "delay", "failpoint", "killall",
           "wipe")
WEIGHTS = {"kill": 3, "pause": 2, "isolate": 2, "split": 1, "oneway": 1, "delay": 1,
           "failpoint": 3, "killall": 1}
FIRST_FAULT_S = 2.0
QUIET_S_MIN = 1.0
"""Time between one fault's end and the next one's start, so the cluster can settle."""
QUIET_S_MAX = 3.0
WIPE_WEIGHT = 2
WIPE_REBUILD_S_MAX = 90.0


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    """Offset from the start of the fault phase (later if the previous fault overran)."""
    action: str
    nodes: tuple[str, ...]
    """The target; ``split``: the minority side; ``oneway``: (src, dst)."""
    duration_s: float
    mode: str = ""
    """Link mode of network faults: blackhole, drop or delay."""
    delay_ms: int = 0
    failpoint: str = ""
    """``SEQLOG_FAILPOINTS`` value of a ``failpoint`` fault."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sequencer_failpoints(rng: random.Random, replication: int) -> str:
    return rng.choice([
        f"appender.after_k_stores=crash@{rng.randint(1, replication)}",
        f"appender.after_k_stores=crash@{rng.randint(replication + 1, 60)}",
        "sequencer.after_epoch_bump=crash",
        "sequencer.after_epoch_bump=crash@2",
        "recovery.after_seal=crash",
    ])


def schedule(seed: int, duration_s: float, sequencers: list[str], storage: list[str],
             replication: int, *, disk_faults: bool = False) -> list[Fault]:
    """The faults of a fault phase of ``duration_s`` seconds (``disk_faults``: with
    ``wipe``; without, the schedules of earlier seeds are unchanged)."""
    rng = random.Random(seed)
    nodes = sequencers + storage
    actions = list(WEIGHTS) + (["wipe"] if disk_faults else [])
    weights = [WEIGHTS.get(a, WIPE_WEIGHT) for a in actions]
    faults: list[Fault] = []
    t = FIRST_FAULT_S
    while t < duration_s:
        action = rng.choices(actions, weights)[0]
        target = rng.choice(nodes)
        duration = round(rng.uniform(0.5, 3.0), 2)
        fault: Fault
        if action in ("kill", "pause"):
            fault = Fault(t, action, (target,), duration)
        elif action == "wipe":
            # Nominal: the fault lasts until the rebuild is done (at most WIPE_REBUILD_S_MAX),
            # and the next one starts later if it overran.
            fault = Fault(t, action, (rng.choice(storage),), round(rng.uniform(3.0, 8.0), 2))
        elif action == "killall":
            fault = Fault(t, action, tuple(nodes), duration)
        elif action == "isolate":
            fault = Fault(t, action, (target,), round(rng.uniform(1.0, 4.0), 2),
                          mode=rng.choice(["blackhole", "drop"]))
        elif action == "split":
            minority = tuple(sorted(rng.sample(nodes, max(1, (len(nodes) - 1) // 2))))
            fault = Fault(t, action, minority, round(rng.uniform(1.0, 4.0), 2),
                          mode=rng.choice(["blackhole", "drop"]))
        elif action == "oneway":
            src, dst = rng.sample(nodes, 2)
            fault = Fault(t, action, (src, dst), round(rng.uniform(1.0, 4.0), 2),
                          mode=rng.choice(["blackhole", "drop"]))
        elif action == "delay":
            fault = Fault(t, action, (target,), round(rng.uniform(2.0, 5.0), 2), mode="delay",
                          delay_ms=rng.choice([20, 50, 100, 200]))
        else:
            if target in storage:
                spec = f"storage.after_write_before_fsync=crash@{rng.randint(1, 30)}"
            else:
                spec = sequencer_failpoints(rng, replication)
            fault = Fault(t, action, (target,), round(rng.uniform(3.0, 6.0), 2),
                          failpoint=spec)
        faults.append(fault)
        t = round(t + fault.duration_s + rng.uniform(QUIET_S_MIN, QUIET_S_MAX), 2)
    return faults


def links_of(nodes: list[str], fault: Fault) -> list[str]:
    """The directed links (``src>dst``) a network fault acts on."""
    if fault.action in ("isolate", "delay"):
        (target,) = fault.nodes
        return [f"{a}>{b}" for a in nodes for b in nodes
                if a != b and target in (a, b)]
    if fault.action == "split":
        side = set(fault.nodes)
        return [f"{a}>{b}" for a in nodes for b in nodes
                if a != b and (a in side) != (b in side)]
    if fault.action == "oneway":
        return [f"{fault.nodes[0]}>{fault.nodes[1]}"]
    return []
