"""Join the events of a traced ``loadtests.bench_tail`` run (see README.md) into per-record
stage latencies: append due -> sequencer -> STORE -> durable -> STORED -> answer -> RELEASE
-> storage -> reader. Usage: ``python analyze.py TRACE_DIR``.

Every process wrote ``PID.jsonl``: its argv, then events ``[kind, monotonic_ns, fields...]``.
CLOCK_MONOTONIC is one clock for all processes on the machine, so times compare directly.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from collections import Counter, defaultdict
from typing import Any

Event = list[Any]


def load(directory: str) -> dict[str, list[Event]]:
    procs: dict[str, list[Event]] = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as f:
            lines = f.read().splitlines()
        argv = json.loads(lines[0])[1]
        events = [json.loads(line) for line in lines[1:]]
        node = next((a.split("/")[-2] for a in argv if a.endswith("config.json")), None)
        if node is None:
            if any(e[0] == "gen" for e in events):
                node = "bench-gen"
            elif any(e[0] == "dlv" and e[2] == "direct" for e in events):
                node = "bench-direct"
            else:
                node = "bench-http"
        procs[node] = events
    # Only the tail phase: from just before the first append was due.
    start = min(e[2] for e in procs["bench-gen"] if e[0] == "gen") - 200_000_000
    return {name: [e for e in events if e[1] >= start] for name, events in procs.items()}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def show(label: str, values_ns: list[int]) -> None:
    ms = [v / 1e6 for v in values_ns]
    print(f"{label:55s} n={len(ms):6d} p50 {pct(ms, 50):7.2f} p90 {pct(ms, 90):7.2f} "
          f"p99 {pct(ms, 99):7.2f} ms")


def first_at_or_above(lsns: list[int], times: list[int], lsn: int) -> int | None:
    i = bisect.bisect_left(lsns, lsn)
    return times[i] if i < len(lsns) else None


def rising(pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(time, pointer) in time order -> the pointers each time it rose, and when."""
    lsns: list[int] = []
    times: list[int] = []
    high = 0
    for t, lsn in sorted(pairs):
        if lsn > high:
            high = lsn
            lsns.append(lsn)
            times.append(t)
    return lsns, times


def main(directory: str) -> None:
    procs = load(directory)
    gen = {e[5]: (e[2], e[3], e[4]) for e in procs["bench-gen"] if e[0] == "gen"}
    delivered = {kind: {e[4]: e[1] for e in procs.get(f"bench-{kind}", []) if e[0] == "dlv"}
                 for kind in ("direct", "http")}
    seq_name = max((n for n in procs if n.startswith("seq")),
                   key=lambda n: sum(1 for e in procs[n] if e[0] == "rep"))
    seq = procs[seq_name]
    log_id = Counter(e[3] for e in seq if e[0] == "arr").most_common(1)[0][0]
    arrived = {e[2]: e[1] for e in seq if e[0] == "arr"}
    replied = {e[3]: (arrived.get(e[2]), e[1]) for e in seq if e[0] == "rep" and e[3]}
    store_tx: dict[int, dict[str, int]] = defaultdict(dict)
    store_ack: dict[int, dict[str, int]] = defaultdict(dict)
    for e in seq:
        if e[0] == "st_tx" and e[4] == log_id:
            store_tx[e[3]].setdefault(e[2], e[1])
        elif e[0] == "st_ack" and e[4] == log_id:
            store_ack[e[3]].setdefault(e[2], e[1])
    store_firsts = sorted(store_tx)
    release_lsns, release_times = rising(
        [(e[1], e[3]) for e in seq if e[0] == "rel_tx" and e[4] == log_id])
    nodes = sorted(n for n in procs if n.startswith("st"))
    received: dict[str, dict[int, int]] = {n: {} for n in nodes}
    durable: dict[str, dict[int, int]] = {n: {} for n in nodes}
    node_release: dict[str, tuple[list[int], list[int]]] = {}
    for n in nodes:
        for e in procs[n]:
            if e[0] == "s_rx" and e[3] == log_id:
                received[n].setdefault(e[2], e[1])
            elif e[0] == "s_done" and e[3] == log_id:
                durable[n].setdefault(e[2], e[1])
        node_release[n] = rising([(e[1], e[2]) for e in procs[n]
                                  if e[0] == "r_rx" and e[3] == log_id])
    stages: dict[str, list[int]] = defaultdict(list)
    for lsn, (due, sent, ack) in gen.items():
        stages["0 due -> sent (generator lateness)"].append(sent - due)
        arrive, reply = replied.get(lsn, (None, None))
        if arrive is None or reply is None:
            continue
        stages["1 sent -> sequencer takes the append"].append(arrive - sent)
        i = bisect.bisect_right(store_firsts, lsn) - 1
        if i < 0:
            continue
        first = store_firsts[i]
        tx = min(store_tx[first].values())
        stages["2 append -> STORE sent (grouping)"].append(tx - arrive)
        rxs = [received[n].get(first) for n in nodes]
        dones = [durable[n].get(first) for n in nodes]
        acks = [store_ack[first].get(n) for n in nodes]
        if None in rxs or None in dones or None in acks:
            continue
        for n, rx, done, ack_t in zip(nodes, rxs, dones, acks, strict=True):
            assert rx is not None and done is not None and ack_t is not None
            stages["3 STORE sent -> storage node has it"].append(rx - store_tx[first][n])
            stages["4 storage: received -> durable (queue, write, fsync)"].append(done - rx)
            stages["5 durable -> STORED at the sequencer"].append(ack_t - done)
        last = max(a for a in acks if a is not None)
        stages["3-5 STORE sent -> R-th STORED"].append(last - tx)
        stages["6 R-th STORED -> answer"].append(reply - last)
        stages["7 answer -> client has the ack"].append(ack - reply)
        stages["= due -> acknowledged"].append(ack - due)
        release_tx = first_at_or_above(release_lsns, release_times, lsn)
        if release_tx is None:
            continue
        stages["8 answer -> RELEASE sent"].append(release_tx - reply)
        got = [first_at_or_above(*node_release[n], lsn) for n in nodes]
        if None in got:
            continue
        first_got = min(g for g in got if g is not None)
        stages["9 RELEASE sent -> first storage node has it"].append(first_got - release_tx)
        for kind in ("direct", "http"):
            t = delivered[kind].get(lsn)
            if t is not None:
                stages[f"10 {kind}: release at storage -> delivered"].append(t - first_got)
                stages[f"11 {kind}: acknowledged -> delivered"].append(t - ack)
                stages[f"= {kind}: due -> delivered"].append(t - due)
    def order(label: str) -> tuple[bool, int, str]:
        head = label.split()[0].split("-")[0]
        return label.startswith("="), int(head) if head.isdigit() else 0, label

    for label in sorted(stages, key=order):
        show(label, stages[label])
    for n in nodes:
        batches = [e for e in procs[n] if e[0] == "batch"]
        show(f"{n}: commit, inline", [e[1] - e[2] for e in batches if e[3]])
        show(f"{n}: commit, writer thread", [e[1] - e[2] for e in batches if not e[3]])
        done = [e[1] for e in procs[n] if e[0] == "wdone"]
        finished = [e[1] for e in procs[n] if e[0] == "wfin"]
        if done and len(done) == len(finished):
            show(f"{n}: writer thread done -> loop runs it",
                 [b - a for a, b in zip(done, finished, strict=True)])
    rounds = [e for e in procs.get("bench-direct", []) if e[0] == "round"]
    print("direct reader rounds (long poll?, end):",
          dict(Counter((e[3] > 0, e[5]) for e in rounds)))
    http_rounds = [e for n in procs if n.startswith("seq") for e in procs[n] if e[0] == "hround"]
    print("HTTP read rounds (long poll?, RELEASE_MOVED?):",
          dict(Counter((e[3] > 0, e[5] != -1) for e in http_rounds)))
    for name, events in sorted(procs.items()):
        stalls = [e[2] for e in events if e[0] == "lag"]
        pauses = [e for e in events if e[0] == "gc"]
        if stalls:
            print(f"{name:13s} loop late > 1 ms: {len(stalls):5d} times, p99 "
                  f"{pct(stalls, 99) / 1e6:6.2f} ms, max {max(stalls) / 1e6:6.2f} ms; GC pauses "
                  f"> 0.2 ms: {len(pauses)}, max "
                  f"{max((e[2] for e in pauses), default=0) / 1e6:.2f} ms, generations "
                  f"{dict(Counter(e[3] for e in pauses))}")


if __name__ == "__main__":
    main(sys.argv[1])
