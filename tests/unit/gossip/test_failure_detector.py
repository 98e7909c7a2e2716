"""The failure detector core with an injected clock: heartbeats, thresholds, SUSPECT, skew,
instance ids, graceful failover."""

from __future__ import annotations

import random
from dataclasses import replace

from gossip.core.failure_detector import FailureDetector, NodeState
from shared.config import GossipConfig
from shared.effects import Send
from shared.types import NodeId
from shared.wire.gossip import Gossip

NODES = (NodeId("a"), NodeId("b"), NodeId("c"))
CONFIG = GossipConfig(gossip_interval_ms=100, gossip_threshold_intervals=5,
                      suspect_duration_ms=1_000, min_gossips_for_stable_state=2,
                      startup_wait_ms=10_000, gossip_time_skew_ms=2_000)
WALL0 = 1_000_000


def _fd(node: str, now_ms: int = 0, instance_id: int = WALL0,
        config: GossipConfig = CONFIG) -> FailureDetector:
    return FailureDetector(node_id=NodeId(node), nodes=NODES, config=config,
                           rng=random.Random(1), instance_id=instance_id, now_ms=now_ms)


def _gossip(sender: str, instance_id: int, wall_ms: int,
            entries: dict[str, tuple[int, int, bool]]) -> Gossip:
    ids = tuple(NodeId(n) for n in entries)
    return Gossip(sender=NodeId(sender), instance_id=instance_id, sent_wall_ms=wall_ms,
                  node_ids=ids, heartbeats=tuple(e[0] for e in entries.values()),
                  instance_ids=tuple(e[1] for e in entries.values()),
                  failover=tuple(e[2] for e in entries.values()))


def _hear(fd: FailureDetector, sender: str, now_ms: int, *, instance_id: int = WALL0,
          failover: bool = False) -> bool:
    return fd.on_gossip(_gossip(sender, instance_id, WALL0 + now_ms,
                                {sender: (0, instance_id, failover)}), now_ms, WALL0 + now_ms)


def _ticks(fd: FailureDetector, from_ms: int, to_ms: int) -> None:
    """Regular ticks in (from_ms, to_ms], as a running driver makes them."""
    for now in range(from_ms + 100, to_ms + 1, 100):
        fd.on_tick(now, WALL0 + now)


def test_tick_sends_own_view_to_one_random_peer() -> None:
    fd = _fd("a")
    targets = set()
    for i in range(1, 30):
        effects = fd.on_tick(i * 100, WALL0 + i * 100)
        assert len(effects) == 1 and isinstance(effects[0], Send)
        message = effects[0].message
        assert isinstance(message, Gossip) and message.sender == "a"
        assert dict(zip(message.node_ids, message.heartbeats, strict=True))[NodeId("a")] == 0
        targets.add(effects[0].node)
    assert targets == {"b", "c"}


def test_starting_node_changes_no_state_before_it_is_stable() -> None:
    fd = _fd("a")
    for i in range(1, 50):
        fd.on_tick(i * 100, WALL0 + i * 100)
    assert fd.view() == dict.fromkeys(NODES, NodeState.ALIVE)
    _hear(fd, "b", 5_000)
    assert fd.state(NodeId("c")) is NodeState.ALIVE  # one gossip: still not stable
    _hear(fd, "b", 5_100)
    assert fd.view() == {"a": NodeState.ALIVE, "b": NodeState.ALIVE, "c": NodeState.DEAD}


def test_startup_wait_makes_a_lonely_node_stable() -> None:
    fd = _fd("a", config=replace(CONFIG, startup_wait_ms=1_000))
    _ticks(fd, 0, 900)
    assert fd.state(NodeId("b")) is NodeState.ALIVE
    _ticks(fd, 900, 1_000)
    assert fd.state(NodeId("b")) is NodeState.DEAD and fd.state(NodeId("a")) is NodeState.ALIVE


def test_silent_node_goes_dead_after_threshold_and_back_through_suspect() -> None:
    fd = _fd("a")
    now = 0
    for _ in range(3):
        now += 100
        _hear(fd, "b", now)
        _hear(fd, "c", now)
        fd.on_tick(now, WALL0 + now)
    assert fd.state(NodeId("c")) is NodeState.ALIVE
    # c goes silent; b keeps talking.
    for _ in range(4):
        now += 100
        _hear(fd, "b", now)
        fd.on_tick(now, WALL0 + now)
    assert fd.heartbeat(NodeId("c")) == 5
    assert fd.state(NodeId("c")) is NodeState.ALIVE  # heartbeat 5 is not above 5
    now += 100
    fd.on_tick(now, WALL0 + now)
    assert fd.state(NodeId("c")) is NodeState.DEAD
    now += 100
    _hear(fd, "c", now)
    assert fd.state(NodeId("c")) is NodeState.SUSPECT
    for _ in range(9):
        now += 100
        _hear(fd, "b", now)
        _hear(fd, "c", now)
        fd.on_tick(now, WALL0 + now)
    assert fd.state(NodeId("c")) is NodeState.SUSPECT
    now += 100
    fd.on_tick(now, WALL0 + now)
    assert fd.state(NodeId("c")) is NodeState.ALIVE


def test_second_hand_news_keeps_a_node_alive() -> None:
    fd = _fd("a")
    now = 0
    for _ in range(20):
        now += 100
        fd.on_tick(now, WALL0 + now)
        # b relays that it heard from c one interval ago; c never talks to a directly.
        fd.on_gossip(_gossip("b", WALL0, WALL0 + now, {"b": (0, WALL0, False),
                                                       "c": (1, WALL0, False)}),
                     now, WALL0 + now)
    assert fd.view() == dict.fromkeys(NODES, NodeState.ALIVE)


def test_restarted_node_passes_through_suspect_even_if_never_dead() -> None:
    fd = _fd("a")
    for now in (100, 200, 300):
        _hear(fd, "b", now)
        _hear(fd, "c", now)
    assert fd.state(NodeId("b")) is NodeState.ALIVE
    _hear(fd, "b", 400, instance_id=WALL0 + 400)
    assert fd.state(NodeId("b")) is NodeState.SUSPECT
    fd.on_tick(1_400, WALL0 + 1_400)
    assert fd.state(NodeId("b")) is NodeState.ALIVE


def test_gossip_from_an_older_instance_or_skewed_or_malformed_is_dropped() -> None:
    fd = _fd("a")
    assert _hear(fd, "b", 100, instance_id=WALL0 + 50)
    assert not _hear(fd, "b", 200, instance_id=WALL0)  # older instance
    late = _gossip("c", WALL0, WALL0, {"c": (0, WALL0, False)})
    assert not fd.on_gossip(late, 3_000, WALL0 + 3_000)  # 3 s old, skew 2 s
    future = _gossip("c", WALL0 + 5_000, WALL0 + 100, {"c": (0, WALL0 + 5_000, False)})
    assert not fd.on_gossip(future, 100, WALL0 + 100)  # instance id from the future
    bad = Gossip(sender=NodeId("c"), instance_id=WALL0, sent_wall_ms=WALL0, node_ids=(NodeId("c"),),
                 heartbeats=(0, 1), instance_ids=(WALL0,), failover=(False,))
    assert not fd.on_gossip(bad, 0, WALL0)
    wrong_type = replace(bad, heartbeats=("x",))  # type: ignore[arg-type]
    assert not fd.on_gossip(wrong_type, 0, WALL0)
    stranger = _gossip("zz", WALL0, WALL0, {"zz": (0, WALL0, False)})
    assert not fd.on_gossip(stranger, 0, WALL0)
    assert fd.gossips_received == 1


def test_graceful_failover_is_dead_at_once_and_a_restart_clears_it() -> None:
    b = _fd("b")
    announce = b.begin_failover(WALL0 + 100)
    assert {e.node for e in announce} == {"a", "c"}
    fd = _fd("a")
    for now in (100, 200, 300):
        _hear(fd, "b", now)
        _hear(fd, "c", now)
    message = announce[0].message
    assert fd.on_gossip(message, 300, WALL0 + 300)
    assert fd.state(NodeId("b")) is NodeState.DEAD
    _hear(fd, "b", 400, instance_id=WALL0 + 400)
    assert fd.state(NodeId("b")) is NodeState.SUSPECT


def test_node_never_declares_itself_dead() -> None:
    fd = _fd("a", config=replace(CONFIG, startup_wait_ms=0))
    for i in range(1, 100):
        fd.on_tick(i * 100, WALL0 + i * 100)
    assert fd.state(NodeId("a")) is NodeState.ALIVE


def test_stalled_node_holds_itself_suspect() -> None:
    fd = _fd("a", config=replace(CONFIG, startup_wait_ms=0))
    fd.on_tick(100, WALL0 + 100)
    fd.on_tick(5_000, WALL0 + 5_000)  # paused for 49 intervals, threshold 5
    assert fd.state(NodeId("a")) is NodeState.SUSPECT
    _ticks(fd, 5_000, 5_900)
    assert fd.state(NodeId("a")) is NodeState.SUSPECT
    _ticks(fd, 5_900, 6_000)
    assert fd.state(NodeId("a")) is NodeState.ALIVE


def test_restarted_node_learns_it_from_peers_and_holds_itself_suspect() -> None:
    fd = _fd("a", instance_id=WALL0 + 500)
    view = _gossip("b", WALL0, WALL0 + 600, {"a": (3, WALL0, False), "b": (0, WALL0, False)})
    assert fd.on_gossip(view, 100, WALL0 + 600)
    assert fd.state(NodeId("a")) is NodeState.SUSPECT
    _hear(fd, "b", 200)
    for now in range(100, 1_101, 100):
        fd.on_tick(now, WALL0 + 500 + now)
    assert fd.state(NodeId("a")) is NodeState.ALIVE


def test_version_counts_state_changes() -> None:
    fd = _fd("a", config=replace(CONFIG, startup_wait_ms=0))
    version = fd.version
    _ticks(fd, 0, 500)
    assert fd.version == version
    _ticks(fd, 500, 600)
    assert fd.version == version + 2  # b and c, never heard of, are DEAD
    _ticks(fd, 600, 900)
    assert fd.version == version + 2


def test_added_node_is_gossiped_to_and_goes_dead_if_silent() -> None:
    fd = _fd("a")
    _hear(fd, "b", 100)
    _hear(fd, "c", 100)
    # Before it is added, d's gossip is dropped.
    assert not _hear(fd, "d", 150)
    assert fd.add_node(NodeId("d")) and not fd.add_node(NodeId("d"))
    assert fd.state(NodeId("d")) is NodeState.ALIVE
    assert _hear(fd, "d", 200)
    targets = {e.node for i in range(3, 40) for e in fd.on_tick(i * 100, WALL0 + i * 100)
               if _hear(fd, "b", i * 100) and _hear(fd, "c", i * 100)}
    assert "d" in targets
    # d stopped gossiping at 200 ms: DEAD after the threshold, while b and c stay ALIVE.
    assert fd.state(NodeId("d")) is NodeState.DEAD
    assert fd.state(NodeId("b")) is NodeState.ALIVE
