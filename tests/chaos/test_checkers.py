"""The chaos suite's offline checkers on small hand-made histories: a clean history passes
every check, and each check flags the violation it exists for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.chaos import checkers
from tests.chaos.history import Event

LOG = 1


class H:
    """A hand-made history; ``t`` advances by one per event unless given."""

    def __init__(self, replication: int = 2, storage: tuple[str, ...] = ("st1", "st2", "st3")):
        self.events: list[Event] = []
        self.t = 0.0
        self.next_op = 0
        self.add("meta", seed=1, replication=replication, logs=[LOG],
                 storage_nodes=list(storage))

    def add(self, ev: str, t: float | None = None, **fields: Any) -> H:
        self.t = self.t + 1 if t is None else t
        self.events.append({"ev": ev, "t": self.t, **fields})
        return self

    def append(self, payloads: list[str], outcome: str, lsns: list[int] | None = None,
               status: str | None = None, log: int = LOG, t: float | None = None,
               t_done: float | None = None) -> H:
        self.next_op += 1
        self.add("invoke", t, op=self.next_op, log=log, node="seq1", writer="w0",
                 payloads=payloads)
        fields: dict[str, Any] = {"op": self.next_op}
        if outcome == "ok":
            fields["lsns"] = lsns or []
        else:
            fields.update(status=status or "X", http=503)
        return self.add(outcome, t_done, **fields)

    def read(self, frm: int, nxt: int, records: Sequence[tuple[int, str]],
             gaps: Sequence[tuple[str, int, int]] = (), release: int | None = None,
             reader: str = "r1", node: str = "seq1", inc: int = 1, log: int = LOG) -> H:
        return self.add("read", reader=reader, node=node, inc=inc, log=log, **{"from": frm},
                        next=nxt, release=nxt - 1 if release is None else release,
                        records=[list(r) for r in records], gaps=[list(g) for g in gaps])

    def copies(self, node: str, records: Sequence[tuple[int, str]],
               markers: Sequence[tuple[int, int, int]] = (), log: int = LOG) -> H:
        return self.add("copies", node=node, log=log, records=[list(r) for r in records],
                        markers=[list(m) for m in markers])

    def tail(self, release: int, node: str = "seq1", inc: int = 1, log: int = LOG,
             asked_t: float | None = None) -> H:
        asked = self.t + 0.5 if asked_t is None else asked_t  # asked after the last event
        return self.add("tail", node=node, inc=inc, log=log, release=release, asked_t=asked)


def _clean() -> H:
    h = H()
    h.append(["a"], "ok", [10]).append(["b", "c"], "ok", [11, 12])
    h.append(["x"], "fail", status="NOSEQUENCER").append(["y"], "unknown", status="TIMEDOUT")
    h.read(1, 13, [(10, "a"), (11, "b"), (12, "c")], [("BRIDGE", 1, 9)], reader="r1")
    h.read(1, 11, [(10, "a")], [("BRIDGE", 1, 9)], reader="r2", node="st1")
    h.read(11, 14, [(11, "b"), (12, "c"), (13, "y")], reader="r2", node="st1")
    h.tail(12).tail(13)
    for node in ("st1", "st2"):
        h.copies(node, [(10, "a"), (11, "b"), (12, "c"), (13, "y")])
    h.copies("st3", [(13, "y")], markers=[(14, 14, 3)])
    return h.add("end")


def _only(check: str, events: list[Event]) -> list[checkers.Violation]:
    found = checkers.check(events)
    assert found, f"{check} flagged nothing"
    assert {v.check for v in found} >= {check}, found
    return [v for v in found if v.check == check]


def test_a_clean_history_passes_every_check() -> None:
    events = _clean().events
    assert checkers.check(events) == []
    figures = checkers.figures(events, [])
    assert (figures["appends_invoked"], figures["appends_acked"], figures["appends_failed"],
            figures["appends_unknown"]) == (4, 2, 1, 1)
    assert figures["records_acked"] == 3 and figures["records_acked_read"] == 3
    assert figures["logs_release_behind_acks"] == [] and figures["violations"] == 0


def test_acked_record_read_as_a_gap_is_lost() -> None:
    h = _clean().read(1, 13, [(10, "a")], [("BRIDGE", 1, 9), ("DATALOSS", 11, 12)],
                      reader="r3")
    lost = _only("acked_not_lost", h.events)
    assert len(lost) == 2 and "DATALOSS gap [11, 12] over acked 11" in lost[0].detail


def test_acked_record_read_with_another_payload_is_lost() -> None:
    h = _clean().read(1, 11, [(10, "zzz")], [("BRIDGE", 1, 9)], reader="r3")
    assert "read 10 as 'zzz'" in _only("acked_not_lost", h.events)[0].detail


def test_acked_record_on_fewer_than_r_nodes_is_flagged() -> None:
    h = H()
    h.append(["a"], "ok", [10]).append(["b"], "ok", [11])
    h.copies("st1", [(10, "a"), (11, "b")]).copies("st2", [(10, "a")]).copies("st3", [])
    lost = _only("acked_not_lost", h.events)
    assert len(lost) == 1 and "acked 11 ('b', op 2) is on 1 storage nodes" in lost[0].detail


def test_an_unscanned_node_may_hold_a_copy() -> None:
    h = H()
    h.append(["a"], "ok", [10]).copies("st1", [(10, "a")]).copies("st2", [])
    assert checkers.acked_not_lost(h.events) == []
    h.copies("st3", [])
    assert len(checkers.acked_not_lost(h.events)) == 1


def test_acked_record_under_a_recovery_plug_is_flagged() -> None:
    h = H()
    h.append(["a"], "ok", [10]).copies("st1", [(10, "a")]).copies("st2", [(10, "a")])
    h.copies("st3", [], markers=[(9, 11, 3)])
    assert "recovery plug" in _only("acked_not_lost", h.events)[0].detail


def test_an_lsn_with_two_payloads_is_flagged() -> None:
    h = H().append(["a"], "ok", [10]).append(["b"], "ok", [10])
    conflict = _only("one_payload_per_lsn", h.events)
    assert len(conflict) == 1 and "LSN 10 has 2 payloads" in conflict[0].detail
    h = H().append(["y"], "unknown").copies("st1", [(13, "y")]).copies("st2", [(13, "q")])
    assert len(_only("one_payload_per_lsn", h.events)) == 1


def test_a_payload_at_two_lsns_is_flagged() -> None:
    h = H().append(["y"], "unknown").copies("st1", [(13, "y"), (14, "y")])
    assert "'y' is at LSNs [13, 14]" in _only("no_duplicates", h.events)[0].detail


E1, E3 = 1 << 32, 3 << 32


def test_a_stray_copy_behind_a_recovery_plug_is_not_a_duplicate() -> None:
    """Chaos seed 3: st2 missed epoch 1's recovery and kept the sequencer's copy of 'y' at
    e1n255, where recovery put the bridge on st1 and st3; the idempotent retry wrote 'y' at
    e3n1. No reader can be served e1n255, so only e3n1 counts."""
    h = H().append(["y"], "unknown").append(["y"], "ok", [E3 + 1])
    h.copies("st2", [(E1 + 254, "x"), (E1 + 255, "y"), (E1 + 256, "z")])
    for node in ("st1", "st3"):
        h.copies(node, [(E1 + 254, "x"), (E3 + 1, "y")],
                 markers=[(E1 + 255, E1 + 255, 7, 1 << 8)])
    assert not [v for v in checkers.check(h.events) if v.check == "no_duplicates"]
    assert checkers.visible_copies(h.events) == (
        {LOG: {E1 + 254: "x", E3 + 1: "y"}}, 2)
    # A hole plug hides its LSN only, in any epoch.
    h = H().append(["y"], "ok", [E3 + 1]).copies("st2", [(E1 + 9, "y"), (E1 + 10, "w")])
    h.copies("st1", [(E1 + 10, "w"), (E3 + 1, "y")], markers=[(E1 + 9, E1 + 9, 3, 1 << 8)])
    assert not [v for v in checkers.check(h.events) if v.check == "no_duplicates"]
    assert checkers.visible_copies(h.events)[0] == {LOG: {E1 + 10: "w", E3 + 1: "y"}}


def test_a_copy_that_outranks_the_plug_is_seen_and_a_duplicate() -> None:
    # A plug of an abandoned recovery attempt (wave 1<<8 | 1) loses to the record a later
    # attempt re-replicated there (wave 1<<8 | 2): readers see 'y' at e1n9 and at e3n1.
    h = H().append(["y"], "ok", [E3 + 1])
    h.copies("st1", [(E3 + 1, "y")], markers=[(E1 + 9, E1 + 9, 3, 1 << 8 | 1)])
    h.copies("st2", [(E1 + 9, "y")], markers=[(E1 + 9, E1 + 9, 1, 1 << 8 | 2)])
    assert "is at LSNs" in _only("no_duplicates", h.events)[0].detail


def test_a_retried_payload_written_twice_is_flagged_and_a_failed_retry_is_not() -> None:
    # An idempotent writer's first attempt ended unknown and wrote at 13; its retry failed.
    h = H().append(["y"], "unknown").append(["y"], "fail").copies("st1", [(13, "y")])
    assert not [v for v in checkers.check(h.events) if v.check == "failed_not_written"]
    # A retry that wrote a second copy is a duplicate.
    h = H().append(["y"], "unknown").append(["y"], "ok", [14]).copies("st1", [(13, "y")])
    assert "'y' is at LSNs [13, 14]" in _only("no_duplicates", h.events)[0].detail


@pytest.mark.parametrize(("reads", "complaint"), [
    ([(1, 5, [(2, "p")], [("HOLE", 1, 1), ("HOLE", 3, 4)]),
      (4, 6, [(5, "q")], [("HOLE", 4, 4)])], "previous answer ended at 5"),
    ([(1, 5, [(2, "p"), (3, "q")], [("HOLE", 1, 2), ("HOLE", 4, 4)])], "overlaps"),
    ([(1, 5, [(2, "p")], [("HOLE", 1, 1), ("HOLE", 4, 4)])], "leaves [3, 3] uncovered"),
    ([(1, 6, [(2, "p")], [("HOLE", 1, 1), ("HOLE", 3, 4)])], "next_lsn is 6"),
    ([(1, 3, [(2, "p")], [("HOLE", 1, 1), ("HOLE", 3, 2)])], "is empty"),
])
def test_reader_order_flags_broken_coverage(reads: list[Any], complaint: str) -> None:
    h = H()
    for frm, nxt, records, gaps in reads:
        h.read(frm, nxt, records, gaps)
    found = _only("reader_order", h.events)
    assert any(complaint in v.detail for v in found), found


def test_reader_past_the_release_pointer_is_flagged() -> None:
    h = H().read(1, 3, [(1, "p"), (2, "q")], release=1)
    assert "past release_lsn 1" in _only("reader_order", h.events)[0].detail


def test_readers_through_different_nodes_must_agree() -> None:
    h = H().read(1, 3, [(1, "p"), (2, "q")], reader="r1", node="seq1")
    h.read(1, 3, [(1, "p")], [("HOLE", 2, 2)], reader="r2", node="st1")
    found = _only("readers_agree", h.events)
    assert "r2@st1 got a HOLE gap [2, 2], ['r1@seq1'] read ['q']" in found[0].detail
    h = H().read(1, 2, [(1, "p")], reader="r1").read(1, 2, [(1, "o")], reader="r2")
    assert "LSN 1" in _only("readers_agree", h.events)[0].detail


def test_release_must_not_go_backwards_per_observer() -> None:
    h = H().tail(10).tail(12).tail(11)
    regress = _only("release_monotonic", h.events)
    assert len(regress) == 1 and "release 11" in regress[0].detail
    # A restarted node is a new observer.
    assert checkers.release_monotonic(H().tail(10).tail(5, inc=2).events) == []
    h = H().read(1, 3, [(1, "p"), (2, "q")], release=5).read(3, 3, [], release=4)
    assert "reader r1" in _only("release_monotonic", h.events)[0].detail


def test_tail_must_not_go_backwards_across_nodes_and_restarts() -> None:
    # A restarted node, or another node, that answers less than an earlier answer is a
    # regression for a consumer that uses tail as a high-water mark.
    h = H().tail(10, node="seq1").tail(0, node="seq2", inc=2)
    regress = _only("tail_monotonic", h.events)
    assert len(regress) == 1 and "release 0" in regress[0].detail
    assert "seq1 had answered 10" in regress[0].detail
    # Concurrent requests (the lower one asked before the higher one was answered) may
    # answer in either order.
    h = H().tail(5).tail(10, node="seq2").tail(7, node="seq1", asked_t=1.0)
    assert checkers.tail_monotonic(h.events) == []
    assert checkers.tail_monotonic(H().tail(3).tail(3, node="seq2").tail(4).events) == []


def test_a_definitely_failed_append_is_never_read_nor_stored() -> None:
    h = H().append(["x"], "fail", status="SEQNOBUFS").read(1, 2, [(1, "x")])
    found = _only("failed_not_written", h.events)
    assert "failed with SEQNOBUFS" in found[0].detail and "read it at 1" in found[0].detail
    h = H().append(["x"], "fail").copies("st2", [(7, "x")])
    assert "st2 holds it at 7" in _only("failed_not_written", h.events)[0].detail


def test_unavailability_windows_run_from_first_failure_to_next_fresh_ack() -> None:
    h = H()
    h.append(["a"], "ok", [1], t=1.0, t_done=1.5)
    h.add("fault", t=1.8, phase="start", action="kill", nodes=["seq1"], mode="", failpoint="")
    h.append(["b"], "unknown", t=2.0, t_done=6.0)  # window opens at 2.0
    h.append(["c"], "fail", t=3.0, t_done=3.1)
    h.append(["d"], "ok", [2], t=1.9, t_done=4.0)  # invoked before the window: no close
    h.add("fault", t=4.2, phase="end", action="kill", nodes=["seq1"])
    h.append(["e"], "ok", [3], t=4.5, t_done=5.0)  # closes it: 3.0 s
    h.append(["f"], "fail", t=8.0, t_done=8.1)     # open until the end at 10.0
    h.add("end", t=10.0)
    assert checkers.unavailability_windows(h.events) == {LOG: [3.0, 2.0]}
    figures = checkers.figures(h.events, [])
    assert figures["unavailability_s"]["max"] == 3.0
    assert figures["unavailability_s"]["median"] == 2.5
    assert figures["unavailability_s"]["longest"] == [
        {"log": LOG, "start_t": 2.0, "length_s": 3.0, "faults": ["kill seq1"]},
        {"log": LOG, "start_t": 8.0, "length_s": 2.0, "faults": []}]
