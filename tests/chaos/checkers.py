"""Offline checkers of a chaos run's history (``tests/chaos/history.py``), and its figures.

Each check is a function from the events to a list of ``Violation``; none of them assumes a
particular fault or timing, so they stay correct whether or not epoch recovery releases the
records of a failed-over log (a log that stops releasing is not a violation, only a figure).

- ``acked_not_lost``: an acknowledged record is never read as a gap or with another payload,
  and after the run it is on at least R storage nodes with its payload (and no node holds a
  hole or bridge plug over it).
- ``one_payload_per_lsn``: no LSN is seen (acked, read or on disk) with two payloads.
- ``no_duplicates``: no payload is seen at two LSNs (the workload never retries a payload),
  acked, read, or on disk as clients can see it (``visible_copies``): a stray copy that a
  node kept where recovery plugged the LSN or ended the epoch, which no reader is served, is
  counted as ``stray_copies`` instead.
- ``reader_order``: each reader's answers cover their ranges exactly once, in increasing LSN
  order, each starting where the previous ended, never past the release pointer.
- ``readers_agree``: where readers (through different nodes) covered the same LSN, none saw
  a record where another saw a gap, and none saw another payload.
- ``release_monotonic``: the release pointer reported by one observer (one node incarnation,
  through ``tail`` or a reader's answers) never goes backwards.
- ``tail_monotonic``: across every node and incarnation, a ``tail`` answer is never below
  one that was answered, through any node, before it was asked (consumers use tail as a
  high-water mark, whichever node they ask).
- ``failed_not_written``: a definitely failed append is never read, and is on no node.

``figures`` reports the counts and the append-unavailability windows per log.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import Event

RECORD = "record"
HOLE_FLAG = 2
"""``RecordFlags.HOLE`` of a storage node's recovery marker: a plugged hole or a bridge (a
marker without it is a record recovery re-replicated)."""
BRIDGE_FLAG = 4
"""``RecordFlags.BRIDGE``: the marker ends its epoch."""


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    log: int | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "log": self.log, "detail": self.detail}


@dataclass(slots=True)
class Op:
    op: int
    log: int
    node: str
    payloads: list[str]
    t_invoke: float
    outcome: str | None = None
    """``ok``, ``fail``, ``unknown``, or None if the history ends before an answer."""
    t_done: float | None = None
    lsns: list[int] = field(default_factory=list)
    status: str | None = None


def ops(events: Iterable[Event]) -> dict[int, Op]:
    found: dict[int, Op] = {}
    for e in events:
        kind = e["ev"]
        if kind == "invoke":
            found[e["op"]] = Op(e["op"], e["log"], e["node"], list(e["payloads"]), e["t"])
        elif kind in ("ok", "fail", "unknown") and e["op"] in found:
            op = found[e["op"]]
            op.outcome, op.t_done = kind, e["t"]
            op.lsns = list(e.get("lsns", []))
            op.status = e.get("status")
    return found


def _acked(all_ops: dict[int, Op]) -> dict[tuple[int, int], tuple[str, int]]:
    """(log, lsn) -> (payload, op) of every acknowledged record."""
    acked: dict[tuple[int, int], tuple[str, int]] = {}
    for op in all_ops.values():
        if op.outcome == "ok":
            for lsn, payload in zip(op.lsns, op.payloads, strict=False):
                acked[(op.log, lsn)] = (payload, op.op)
    return acked


def _reads(events: Iterable[Event]) -> list[Event]:
    return [e for e in events if e["ev"] == "read"]


def _copies(events: Iterable[Event]) -> list[Event]:
    return [e for e in events if e["ev"] == "copies"]


def _sorted_lsns(keys: Iterable[tuple[int, int]], log: int) -> list[int]:
    return sorted(lsn for lg, lsn in keys if lg == log)


def _in_range(sorted_lsns: list[int], lo: int, hi: int) -> list[int]:
    return sorted_lsns[bisect.bisect_left(sorted_lsns, lo):bisect.bisect_right(sorted_lsns, hi)]


def _storage_nodes(events: list[Event]) -> set[str]:
    for e in events:
        if e["ev"] == "meta":
            return set(e.get("storage_nodes", ()))
    return set()


def _replication(events: list[Event]) -> int:
    for e in events:
        if e["ev"] == "meta":
            return int(e["replication"])
    return 1


# ---- the checks --------------------------------------------------------------------------


def acked_not_lost(events: list[Event]) -> list[Violation]:
    violations: list[Violation] = []
    acked = _acked(ops(events))
    by_log: dict[int, list[int]] = defaultdict(list)
    for log, lsn in acked:
        by_log[log].append(lsn)
    for lsns in by_log.values():
        lsns.sort()
    for e in _reads(events):
        log = e["log"]
        for lsn, payload in e["records"]:
            want = acked.get((log, lsn))
            if want is not None and want[0] != payload:
                violations.append(Violation("acked_not_lost", log, (
                    f"reader {e['reader']} via {e['node']} read {lsn} as {payload!r}, but op "
                    f"{want[1]} was acked with {want[0]!r} there (t={e['t']})")))
        for kind, lo, hi in e["gaps"]:
            for lsn in _in_range(by_log.get(log, []), lo, hi):
                payload, op = acked[(log, lsn)]
                violations.append(Violation("acked_not_lost", log, (
                    f"reader {e['reader']} via {e['node']} got a {kind} gap [{lo}, {hi}] over "
                    f"acked {lsn} ({payload!r}, op {op}) (t={e['t']})")))
    copies = _copies(events)
    if not copies:
        return violations
    replication = _replication(events)
    held: dict[tuple[int, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    plugs: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    scanned_logs = set()
    for e in copies:
        scanned_logs.add(e["log"])
        for lsn, payload in e["records"]:
            held[(e["log"], lsn)][payload].add(e["node"])
        for first, last, flags, *_ in e.get("markers", []):
            if flags & HOLE_FLAG:
                plugs[e["log"]].append((first, last, e["node"], flags))
    storage_nodes = _storage_nodes(events)
    scanned: dict[int, set[str]] = defaultdict(set)
    for e in copies:
        scanned[e["log"]].add(e["node"])
    for (log, lsn), (payload, op) in sorted(acked.items()):
        if log not in scanned_logs:
            continue
        # A node that could not be scanned may hold one of the R copies.
        unscanned = len(storage_nodes - scanned[log]) if storage_nodes else 0
        required = max(1, replication - unscanned)
        nodes = held.get((log, lsn), {}).get(payload, set())
        if len(nodes) < required:
            violations.append(Violation("acked_not_lost", log, (
                f"acked {lsn} ({payload!r}, op {op}) is on {len(nodes)} storage nodes "
                f"{sorted(nodes)} after the run; R={replication}, {unscanned} not scanned")))
    for log, markers in plugs.items():
        lsns = by_log.get(log, [])
        for first, last, node, flags in markers:
            for lsn in _in_range(lsns, first, last):
                violations.append(Violation("acked_not_lost", log, (
                    f"{node} holds a recovery plug (flags {flags}) [{first}, {last}] over "
                    f"acked {lsn} ({acked[(log, lsn)][0]!r})")))
    return violations


def one_payload_per_lsn(events: list[Event]) -> list[Violation]:
    seen: dict[tuple[int, int], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for op in ops(events).values():
        if op.outcome == "ok":
            for lsn, payload in zip(op.lsns, op.payloads, strict=False):
                seen[(op.log, lsn)][payload].append(f"ack of op {op.op}")
    for e in events:
        if e["ev"] == "read":
            for lsn, payload in e["records"]:
                seen[(e["log"], lsn)][payload].append(f"reader {e['reader']}")
        elif e["ev"] == "copies":
            for lsn, payload in e["records"]:
                seen[(e["log"], lsn)][payload].append(f"copy on {e['node']}")
    violations = []
    for (log, lsn), payloads in sorted(seen.items()):
        if len(payloads) > 1:
            detail = "; ".join(f"{p!r} from {', '.join(sorted(set(s))[:4])}"
                               for p, s in sorted(payloads.items()))
            violations.append(Violation("one_payload_per_lsn", log,
                                        f"LSN {lsn} has {len(payloads)} payloads: {detail}"))
    return violations


_Copy = tuple[tuple[int, int], bool, bool, str | None]
"""(precedence, is a hole, is a bridge, payload) of one copy of an LSN."""
_Marker = tuple[int, int, int, int]


def _offer(best: dict[int, _Copy], lsn: int, candidate: _Copy) -> None:
    current = best.get(lsn)
    # On a tie a record beats a plug: the checker errs towards seeing more.
    if current is None or (candidate[0], not candidate[1]) > (current[0], not current[1]):
        best[lsn] = candidate


def _covering(markers: list[_Marker], firsts: list[int], lsn: int) -> _Marker | None:
    i = bisect.bisect_right(firsts, lsn) - 1
    return markers[i] if i >= 0 and markers[i][1] >= lsn else None


def visible_copies(events: list[Event]) -> tuple[dict[int, dict[int, str]], int]:
    """Per log, the records on the scanned disks as a reader that merges every node would get
    them (LogDevice's digest precedence, written independently of ``shared.read_merge``): per
    LSN the copy with the highest precedence wins, a copy written by recovery (its marker's
    wave: seal epoch, then attempt) over any sequencer copy; a winning hole hides the LSN and a
    winning bridge the rest of its epoch. Also how many node copies that leaves unseen (stray
    copies of appends recovery never saw, kept by a node that missed its CLEAN)."""
    by_log: dict[int, list[Event]] = defaultdict(list)
    for e in _copies(events):
        by_log[e["log"]].append(e)
    visible: dict[int, dict[int, str]] = {}
    strays = 0
    for log, scans in by_log.items():
        best: dict[int, _Copy] = {}
        all_lsns = sorted({lsn for e in scans for lsn, _ in e["records"]})
        for e in scans:
            markers = sorted((int(m[0]), int(m[1]), int(m[2]), int(m[3]) if len(m) > 3 else 0)
                             for m in e.get("markers", []))
            firsts = [m[0] for m in markers]
            for first, last, flags, wave in markers:
                if flags & HOLE_FLAG:
                    # A plug matters where it starts (a bridge ends its epoch there) and where
                    # any node holds a copy.
                    _offer(best, first, ((1, wave), True, bool(flags & BRIDGE_FLAG), None))
                    for lsn in _in_range(all_lsns, first + 1, last):
                        _offer(best, lsn, ((1, wave), True, False, None))
            for lsn, payload in e["records"]:
                marker = _covering(markers, firsts, lsn)
                recovered = marker is not None and not marker[2] & HOLE_FLAG
                precedence = (1, marker[3]) if marker is not None and recovered else (0, 0)
                _offer(best, lsn, (precedence, False, False, payload))
        shown: dict[int, str] = {}
        ended_epoch = -1
        for lsn in sorted(best):
            _, hole, bridge, payload = best[lsn]
            if lsn >> 32 == ended_epoch:
                continue
            if bridge:
                ended_epoch = lsn >> 32
            elif not hole and payload is not None:
                shown[lsn] = payload
        visible[log] = shown
        strays += sum(1 for e in scans for lsn, payload in e["records"]
                      if shown.get(lsn) != payload)
    return visible, strays


def no_duplicates(events: list[Event]) -> list[Violation]:
    where: dict[tuple[int, str], set[int]] = defaultdict(set)
    for op in ops(events).values():
        if op.outcome == "ok":
            for lsn, payload in zip(op.lsns, op.payloads, strict=False):
                where[(op.log, payload)].add(lsn)
    for e in _reads(events):
        for lsn, payload in e["records"]:
            where[(e["log"], payload)].add(lsn)
    for log, shown in visible_copies(events)[0].items():
        for lsn, payload in shown.items():
            where[(log, payload)].add(lsn)
    return [Violation("no_duplicates", log, f"payload {payload!r} is at LSNs {sorted(lsns)}")
            for (log, payload), lsns in sorted(where.items()) if len(lsns) > 1]


def reader_order(events: list[Event]) -> list[Violation]:
    violations = []
    cursors: dict[str, int] = {}
    for e in _reads(events):
        reader, log = e["reader"], e["log"]

        def flag(detail: str, e: Event = e, reader: str = reader, log: int = log) -> None:
            violations.append(Violation("reader_order", log, (
                f"reader {reader} via {e['node']} from {e['from']} (t={e['t']}): {detail}")))

        expected = cursors.get(reader)
        if expected is not None and e["from"] != expected:
            flag(f"started at {e['from']}, but the previous answer ended at {expected}")
        entries = sorted([(lsn, lsn, RECORD) for lsn, _ in e["records"]]
                         + [(lo, hi, kind) for kind, lo, hi in e["gaps"]])
        cursor = e["from"]
        for lo, hi, kind in entries:
            if lo > hi:
                flag(f"{kind} [{lo}, {hi}] is empty")
            elif lo != cursor:
                flag(f"{kind} [{lo}, {hi}] " + (f"overlaps LSNs below {cursor}" if lo < cursor
                                                else f"leaves [{cursor}, {lo - 1}] uncovered"))
            cursor = max(cursor, hi + 1)
        if cursor != e["next"]:
            flag(f"entries end at {cursor - 1} but next_lsn is {e['next']}")
        if e["next"] < e["from"]:
            flag(f"next_lsn {e['next']} went backwards")
        if e["next"] - 1 > e["release"]:
            flag(f"next_lsn {e['next']} is past release_lsn {e['release']} + 1")
        cursors[reader] = max(e["next"], e["from"])
    return violations


def readers_agree(events: list[Event]) -> list[Violation]:
    violations = []
    records: dict[int, dict[int, dict[str, set[str]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(set)))
    gaps: dict[int, list[tuple[int, int, str, str]]] = defaultdict(list)
    for e in _reads(events):
        who = f"{e['reader']}@{e['node']}"
        for lsn, payload in e["records"]:
            records[e["log"]][lsn][payload].add(who)
        for kind, lo, hi in e["gaps"]:
            gaps[e["log"]].append((lo, hi, kind, who))
    for log, by_lsn in sorted(records.items()):
        for lsn, payloads in sorted(by_lsn.items()):
            if len(payloads) > 1:
                violations.append(Violation("readers_agree", log, f"LSN {lsn}: " + "; ".join(
                    f"{sorted(w)} read {p!r}" for p, w in sorted(payloads.items()))))
        lsns = sorted(by_lsn)
        for lo, hi, kind, who in gaps.get(log, []):
            for lsn in _in_range(lsns, lo, hi):
                readers = sorted(w for ws in by_lsn[lsn].values() for w in ws)
                violations.append(Violation("readers_agree", log, (
                    f"LSN {lsn}: {who} got a {kind} gap [{lo}, {hi}], {readers} read "
                    f"{sorted(by_lsn[lsn])}")))
    return violations


def release_monotonic(events: list[Event]) -> list[Violation]:
    violations = []
    last: dict[tuple[str, str, int, int], tuple[int, float]] = {}
    for e in events:
        if e["ev"] == "tail":
            key = ("tail", e["node"], e["inc"], e["log"])
        elif e["ev"] == "read":
            key = (f"reader {e['reader']}", e["node"], e["inc"], e["log"])
        else:
            continue
        previous = last.get(key)
        if previous is not None and e["release"] < previous[0]:
            violations.append(Violation("release_monotonic", e["log"], (
                f"{key[0]} via {e['node']} (incarnation {e['inc']}): release {e['release']} at "
                f"t={e['t']} after {previous[0]} at t={previous[1]}")))
        if previous is None or e["release"] >= previous[0]:
            last[key] = (e["release"], e["t"])
    return violations


def tail_monotonic(events: list[Event]) -> list[Violation]:
    violations = []
    by_log: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if e["ev"] == "tail" and "asked_t" in e:  # older histories lack asked_t
            by_log[e["log"]].append(e)
    for log, tails in by_log.items():
        tails.sort(key=lambda e: e["t"])
        answered_t = [e["t"] for e in tails]
        # best[i]: the highest release among the first i + 1 answers, and which one it was.
        best: list[Event] = []
        for e in tails:
            best.append(e if not best or e["release"] > best[-1]["release"] else best[-1])
        for e in tails:
            before = bisect.bisect_left(answered_t, e["asked_t"])  # answered before asked
            if before and best[before - 1]["release"] > e["release"]:
                high = best[before - 1]
                violations.append(Violation("tail_monotonic", log, (
                    f"tail via {e['node']} (incarnation {e['inc']}) asked at "
                    f"t={e['asked_t']}: release {e['release']}, but {high['node']} had "
                    f"answered {high['release']} at t={high['t']}")))
    return violations


def failed_not_written(events: list[Event]) -> list[Violation]:
    """A payload whose every attempt failed was never written (an idempotent writer's retry
    may fail after an attempt with an unknown outcome that did write it)."""
    failed: dict[tuple[int, str], Op] = {}
    tried: set[tuple[int, str]] = set()
    for op in ops(events).values():
        for payload in op.payloads:
            if op.outcome == "fail":
                failed[(op.log, payload)] = op
            else:
                tried.add((op.log, payload))
    for key in tried:
        failed.pop(key, None)
    violations = []
    for e in events:
        if e["ev"] not in ("read", "copies"):
            continue
        for lsn, payload in e["records"]:
            failed_op = failed.get((e["log"], payload))
            if failed_op is not None:
                where = (f"reader {e['reader']} via {e['node']} read it" if e["ev"] == "read"
                         else f"{e['node']} holds it")
                violations.append(Violation("failed_not_written", e["log"], (
                    f"op {failed_op.op} ({payload!r}) failed with {failed_op.status} via "
                    f"{failed_op.node}, but "
                    f"{where} at {lsn}")))
    return violations


CHECKS: tuple[Callable[[list[Event]], list[Violation]], ...] = (
    acked_not_lost, one_payload_per_lsn, no_duplicates, reader_order, readers_agree,
    release_monotonic, tail_monotonic, failed_not_written)


def check(events: list[Event]) -> list[Violation]:
    return [v for run in CHECKS for v in run(events)]


# ---- figures -----------------------------------------------------------------------------


def unavailability_windows(events: list[Event]) -> dict[int, list[float]]:
    """Per log, the windows (seconds) during which its appends did not succeed: from the
    invocation of an append that failed or ended unknown (with no window open), to the ack
    of the first append invoked after that moment. A window still open when the workload
    ended closes at its end."""
    return {log: [length for _, length in found]
            for log, found in _unavailability(events).items()}


def _unavailability(events: list[Event]) -> dict[int, list[tuple[float, float]]]:
    """Per log, (start, length) of each window of ``unavailability_windows``."""
    all_ops = ops(events)
    end = max((e["t"] for e in events if e["ev"] == "end"), default=None)
    if end is None:
        end = max((e["t"] for e in events), default=0.0)
    by_log: dict[int, list[tuple[float, int, Op]]] = defaultdict(list)
    for op in all_ops.values():
        if op.outcome == "ok" and op.t_done is not None:
            by_log[op.log].append((op.t_done, 1, op))
        elif op.outcome in ("fail", "unknown") or (op.outcome is None and op.t_invoke < end):
            by_log[op.log].append((op.t_invoke, 0, op))
    windows: dict[int, list[tuple[float, float]]] = {}
    for log, timeline in sorted(by_log.items()):
        timeline.sort(key=lambda item: (item[0], item[1], item[2].op))
        opened: float | None = None
        found: list[tuple[float, float]] = []
        for t, is_ok, op in timeline:
            if not is_ok:
                opened = t if opened is None else opened
            elif opened is not None and op.t_invoke >= opened:
                found.append((opened, round(t - opened, 3)))
                opened = None
        if opened is not None:
            found.append((opened, round(end - opened, 3)))
        windows[log] = found
    return windows


def _fault_intervals(events: list[Event]) -> list[tuple[float, float, str]]:
    """(start, end, description) of every fault; one never ended ends with the history."""
    t_last = max((e["t"] for e in events), default=0.0)
    found: list[tuple[float, float, str]] = []
    open_at: tuple[float, str] | None = None
    for e in events:
        if e["ev"] != "fault":
            continue
        if e.get("phase") == "start":
            detail = e.get("mode") or e.get("failpoint") or ""
            open_at = (e["t"], f"{e['action']} {','.join(e['nodes'])} {detail}".rstrip())
        elif open_at is not None:
            found.append((open_at[0], e["t"], open_at[1]))
            open_at = None
    if open_at is not None:
        found.append((open_at[0], t_last, open_at[1]))
    return found


def longest_windows(events: list[Event], count: int = 5) -> list[dict[str, Any]]:
    """The ``count`` longest unavailability windows, with the faults that overlapped them
    (faults run one at a time, so a window after a fault's end shows the cluster's
    recovery time)."""
    windows = [(length, start, log) for log, found in _unavailability(events).items()
               for start, length in found]
    faults = _fault_intervals(events)
    return [{"log": log, "start_t": start, "length_s": length,
             "faults": [what for lo, hi, what in faults
                        if lo <= start + length and hi >= start]}
            for length, start, log in sorted(windows, reverse=True)[:count]]


def figures(events: list[Event], violations: list[Violation]) -> dict[str, Any]:
    all_ops = ops(events)
    outcomes: dict[str | None, int] = defaultdict(int)
    for op in all_ops.values():
        outcomes[op.outcome] += 1
    acked = _acked(all_ops)
    by_check: dict[str, int] = defaultdict(int)
    for v in violations:
        by_check[v.check] += 1
    windows = unavailability_windows(events)
    flat = [w for ws in windows.values() for w in ws]
    release: dict[int, int] = {}
    for e in events:
        if e["ev"] in ("tail", "read"):
            release[e["log"]] = max(release.get(e["log"], 0), e["release"])
    max_acked: dict[int, int] = {}
    for log, lsn in acked:
        max_acked[log] = max(max_acked.get(log, 0), lsn)
    read_lsns = {(e["log"], lsn) for e in _reads(events) for lsn, _ in e["records"]}
    faults: dict[str, int] = defaultdict(int)
    for e in events:
        if e["ev"] == "fault" and e.get("phase", "start") == "start":
            faults[e["action"]] += 1
    retries = [e for e in events if e["ev"] == "invoke" and e.get("retry")]
    retried_ok = sum(1 for e in retries if all_ops[e["op"]].outcome == "ok")
    return {
        "appends_invoked": len(all_ops),
        "idempotent_retries": len(retries),
        "idempotent_retries_acked": retried_ok,
        "appends_acked": outcomes["ok"],
        "appends_failed": outcomes["fail"],
        "appends_unknown": outcomes["unknown"] + outcomes[None],
        "records_acked": len(acked),
        "records_acked_read": len(read_lsns & set(acked)),
        "records_acked_unreleased": sum(
            1 for log, lsn in acked if lsn > release.get(log, 0)),
        "lost_acked_records": by_check["acked_not_lost"],
        "duplicate_lsn_conflicts": by_check["one_payload_per_lsn"],
        "duplicated_payloads": by_check["no_duplicates"],
        "stray_copies": visible_copies(events)[1],
        "ordering_violations": by_check["reader_order"],
        "agreement_violations": by_check["readers_agree"],
        "release_regressions": by_check["release_monotonic"],
        "tail_regressions": by_check["tail_monotonic"],
        "failed_appends_written": by_check["failed_not_written"],
        "reads": len(_reads(events)),
        "logs_release_behind_acks": sorted(
            log for log, lsn in max_acked.items() if release.get(log, 0) < lsn),
        "unavailability_s": {
            "max": max(flat, default=0.0),
            "median": statistics.median(flat) if flat else 0.0,
            "per_log": {str(log): {"windows": len(ws), "max": max(ws, default=0.0),
                                   "median": statistics.median(ws) if ws else 0.0}
                        for log, ws in windows.items()},
            "longest": longest_windows(events),
        },
        "faults": dict(sorted(faults.items())),
        "violations": len(violations),
    }
