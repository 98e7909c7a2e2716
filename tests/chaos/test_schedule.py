"""The seeded fault schedule: the same seed gives the same faults, faults never overlap, every
failpoint spec is valid, and network faults pick the right links."""

from __future__ import annotations

import itertools

from shared import failpoints
from tests.chaos.faults import ACTIONS, Fault, links_of, schedule

SEQ = ["seq1", "seq2"]
ST = ["st1", "st2", "st3"]
NODES = SEQ + ST


def test_same_seed_same_schedule_other_seed_other_one() -> None:
    assert schedule(7, 120, SEQ, ST, 2) == schedule(7, 120, SEQ, ST, 2)
    assert schedule(7, 120, SEQ, ST, 2) != schedule(8, 120, SEQ, ST, 2)


def test_faults_follow_one_another_within_the_phase() -> None:
    for seed in range(50):
        faults = schedule(seed, 90, SEQ, ST, 2)
        assert faults and all(f.action in ACTIONS for f in faults)
        assert all(f.at_s < 90 for f in faults)
        for before, after in itertools.pairwise(faults):
            assert after.at_s >= before.at_s + before.duration_s + 1.0


def test_failpoint_specs_parse_and_fit_the_node_role() -> None:
    seen = set()
    for seed in range(200):
        for fault in schedule(seed, 90, SEQ, ST, 2):
            if fault.action != "failpoint":
                continue
            (arm,) = failpoints.parse(fault.failpoint)
            seen.add(arm.name)
            on_storage = fault.nodes[0] in ST
            assert on_storage == (arm.name == "storage.after_write_before_fsync"), fault
    # Reclaim runs only once records are trimmed, which the chaos workload never does; its
    # failpoints are exercised by tests/integration/test_retention.py instead.
    reclaim = {"storage.reclaim_after_checkpoint", "storage.compact_before_rename"}
    assert seen == set(failpoints.KNOWN) - reclaim


def test_network_faults_pick_their_links() -> None:
    isolate = Fault(0, "isolate", ("st1",), 1, mode="drop")
    assert sorted(links_of(NODES, isolate)) == sorted(
        [f"st1>{n}" for n in NODES if n != "st1"] + [f"{n}>st1" for n in NODES if n != "st1"])
    split = Fault(0, "split", ("seq1", "st1"), 1, mode="blackhole")
    links = links_of(NODES, split)
    assert len(links) == 2 * 2 * 3 and "seq1>st2" in links and "st2>seq1" in links
    assert "seq1>st1" not in links and "st2>st3" not in links
    assert links_of(NODES, Fault(0, "oneway", ("st2", "seq1"), 1, mode="drop")) == ["st2>seq1"]
    assert links_of(NODES, Fault(0, "kill", ("st2",), 1)) == []


def test_disk_faults_wipe_only_storage_nodes_and_leave_default_schedules_alone() -> None:
    wipes = [f for seed in range(100) for f in schedule(seed, 300, SEQ, ST, 2, disk_faults=True)
             if f.action == "wipe"]
    assert wipes and all(f.nodes[0] in ST and len(f.nodes) == 1 for f in wipes)
    assert not any(f.action == "wipe" for seed in range(100)
                   for f in schedule(seed, 300, SEQ, ST, 2))
