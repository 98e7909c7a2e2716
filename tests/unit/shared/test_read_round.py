"""ReadRound: when a round's answers suffice (f-majority plus the speculative delay), when it
gives up (SHORT), and when a long poll restarts because a node saw a newer release."""

from __future__ import annotations

import dataclasses

from shared.epoch_metadata import LogMetadata
from shared.read_round import NodesetSpan, ReadRound, metadata_spans, span_of
from shared.status import Status
from shared.types import EPOCH_MAX, LSN_MAX, Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.read import ReadReply

NODES = tuple(NodeId(f"n{i}") for i in range(1, 6))
SPAN = NodesetSpan(first_epoch=Epoch(1), last_epoch=EPOCH_MAX, nodeset=NODES,
                   replication_factor=3)


def lsn(epoch: int, esn: int) -> Lsn:
    return compose_lsn(Epoch(epoch), Esn(esn))


def reply(*esns: int, release: int = 0, next_esn: int | None = None) -> ReadReply:
    records = tuple((lsn(1, e), 1000 + e, None, b"r%d" % e) for e in esns)
    nxt = lsn(1, next_esn) if next_esn is not None else Lsn(max(release, 0) + 1)
    return ReadReply(status=Status.OK, log_id=LogId(1), release_lsn=Lsn(release),
                     records=records, next_lsn=nxt)


def new_round(*, release: int, wait_ms: int = 0, delay_ms: int = 20,
              span: NodesetSpan = SPAN, ask_all: bool = True) -> ReadRound:
    """A round started at 0; with ``ask_all`` every node is asked (as after the delay)."""
    r = ReadRound(log_id=LogId(1), span=span, from_lsn=lsn(1, 1), release_lsn=Lsn(release),
                  records_max=100, bytes_max=1 << 20, wait_ms=wait_ms,
                  speculative_delay_ms=delay_ms, started_ms=0)
    if ask_all:
        r.to_ask(0)
        r.to_ask(delay_ms)
    return r


def test_catch_up_asks_an_f_majority_first_then_more_on_failure_or_delay() -> None:
    r = ReadRound(log_id=LogId(1), span=SPAN, from_lsn=lsn(1, 1), release_lsn=lsn(1, 2),
                  records_max=100, bytes_max=1 << 20, wait_ms=0, speculative_delay_ms=20,
                  started_ms=0, order=(NodeId("n4"), NodeId("n2")))
    assert r.to_ask(0) == ["n4", "n2", "n1"]  # the preferred nodes first, 3 = f-majority
    assert r.to_ask(5) == [] and r.wake_ms() == 20
    r.on_reply(NodeId("n5"), reply(1, 2, release=lsn(1, 2)), 5)  # not asked: ignored
    r.on_reply(NodeId("n2"), Status.CONNFAILED, 6)
    assert r.to_ask(6) == ["n3"]  # one more for the one that failed
    r.on_reply(NodeId("n4"), reply(1, release=lsn(1, 2)), 7)
    r.on_reply(NodeId("n1"), reply(2, release=lsn(1, 2)), 7)
    assert r.result(7) is None  # n3 is still needed
    assert r.to_ask(20) == ["n5"]  # the delay passed without an f-majority: ask the rest
    r.on_reply(NodeId("n5"), reply(1, 2, release=lsn(1, 2)), 21)
    result = r.result(21)
    # n3 never answered; the f-majority (n4, n1, n5) was complete, n3 gets the delay.
    assert result is None
    result = r.result(41)
    assert result is not None and result.end == "MERGED" and result.merged is not None
    assert [rec[0] for rec in result.merged.records] == [lsn(1, 1), lsn(1, 2)]
    assert r.stragglers() == ["n2", "n3"]


def test_an_f_majority_of_prompt_answers_merges_at_once() -> None:
    r = new_round(release=lsn(1, 1), ask_all=False)
    asked = r.to_ask(0)
    assert len(asked) == 3
    for node in asked:
        r.on_reply(node, reply(1, release=lsn(1, 1)), 1)
    result = r.result(1)
    assert result is not None and result.end == "MERGED" and result.answered == 3


def test_long_poll_round_asks_every_node_at_once() -> None:
    r = new_round(release=lsn(1, 1), wait_ms=1_000, ask_all=False)
    assert r.to_ask(0) == list(NODES)


def test_merges_once_every_node_answered() -> None:
    r = new_round(release=lsn(1, 3))
    copies = {"n1": (1, 2), "n2": (1, 3), "n3": (2, 3), "n4": (1,), "n5": (2,)}
    for node, esns in copies.items():
        assert r.result(0) is None
        r.on_reply(NodeId(node), reply(*esns, release=lsn(1, 3)), 0)
    result = r.result(0)
    assert result is not None and result.end == "MERGED" and result.merged is not None
    assert [rec[0] for rec in result.merged.records] == [lsn(1, 1), lsn(1, 2), lsn(1, 3)]


def test_slow_node_costs_only_the_speculative_delay() -> None:
    r = new_round(release=lsn(1, 2), delay_ms=20)
    for node in ("n1", "n2", "n3"):
        r.on_reply(NodeId(node), reply(1, 2, release=lsn(1, 2)), 100)
    # An f-majority (5 - 3 + 1 = 3) answered: the other two get 20 ms more, no longer.
    assert r.result(100) is None and r.result(119) is None
    assert r.wake_ms() == 120
    result = r.result(120)
    assert result is not None and result.end == "MERGED" and result.answered == 3
    assert result.merged is not None and len(result.merged.records) == 2


def test_fewer_than_an_f_majority_never_merges() -> None:
    r = new_round(release=lsn(1, 2))
    r.on_reply(NodeId("n1"), reply(1, 2, release=lsn(1, 2)), 0)
    r.on_reply(NodeId("n2"), reply(1, 2, release=lsn(1, 2)), 0)
    assert r.result(10_000) is None  # waits for the others however long it takes
    r.on_reply(NodeId("n3"), Status.CONNFAILED, 0)
    r.on_reply(NodeId("n4"), Status.TIMEDOUT, 0)
    assert r.result(10_000) is None  # n5 could still make three
    r.on_reply(NodeId("n5"), Status.TIMEDOUT, 0)
    result = r.result(10_000)
    assert result is not None and result.end == "SHORT" and result.merged is None
    assert (result.answered, result.needed) == (2, 3)
    assert dict(result.failures) == {"n3": Status.CONNFAILED, "n4": Status.TIMEDOUT,
                                     "n5": Status.TIMEDOUT}


def test_error_reply_counts_as_a_failure_and_strangers_are_ignored() -> None:
    r = new_round(release=lsn(1, 1))
    bad = ReadReply(status=Status.CHECKSUM_MISMATCH, log_id=LogId(1), release_lsn=Lsn(0),
                    records=(), next_lsn=lsn(1, 1))
    for node in ("n1", "n2", "n3"):
        r.on_reply(NodeId(node), bad, 0)
    r.on_reply(NodeId("stranger"), reply(1, release=lsn(1, 1)), 0)
    r.on_reply(NodeId("n4"), Status.TIMEDOUT, 0)
    r.on_reply(NodeId("n5"), Status.TIMEDOUT, 0)
    result = r.result(0)
    assert result is not None and result.end == "SHORT" and result.answered == 0


def test_long_poll_restarts_when_a_node_reports_a_newer_release() -> None:
    r = new_round(release=lsn(1, 2), wait_ms=5_000)
    r.on_reply(NodeId("n1"), reply(3, release=lsn(1, 3)), 0)
    result = r.result(0)
    assert result is not None and result.end == "RELEASE_MOVED"
    assert result.release_lsn == lsn(1, 3)
    # Without a wait, the same answers just wait for the f-majority.
    plain = new_round(release=lsn(1, 2))
    plain.on_reply(NodeId("n1"), reply(3, release=lsn(1, 3)), 0)
    assert plain.result(0) is None


def test_long_poll_merges_an_f_majority_with_records_without_waiting_for_held_reads() -> None:
    # R=3 of 3: one node is an f-majority. A release reaches the nodes one after the other;
    # the first woken READ's records are delivered at once, not after the other nodes (which
    # still hold theirs) nor after a second round.
    span = NodesetSpan(first_epoch=Epoch(1), last_epoch=EPOCH_MAX, nodeset=NODES[:3],
                       replication_factor=3)
    r = new_round(release=lsn(1, 0), wait_ms=5_000, span=span)
    assert r.to_ask(0) == []  # a long poll asked every node at once
    r.on_reply(NodeId("n2"), reply(1, 2, release=lsn(1, 2)), 1)
    result = r.result(1)
    assert result is not None and result.end == "MERGED" and result.merged is not None
    assert [rec[0] for rec in result.merged.records] == [lsn(1, 1), lsn(1, 2)]
    assert result.merged.next_lsn == lsn(1, 3) and result.release_lsn == lsn(1, 2)
    # Fewer than an f-majority (5 nodes, R=3: 3 needed): restart with the newer pointer.
    wide = new_round(release=lsn(1, 0), wait_ms=5_000)
    wide.on_reply(NodeId("n1"), reply(1, 2, release=lsn(1, 2)), 1)
    wide.on_reply(NodeId("n2"), reply(1, 2, release=lsn(1, 2)), 1)
    moved = wide.result(1)
    assert moved is not None and moved.end == "RELEASE_MOVED"
    # An f-majority that brought nothing past the cursor (their waits ran out) does not end a
    # long poll early: the others may still answer with records.
    idle = new_round(release=lsn(1, 0), wait_ms=5_000, span=span)
    idle.on_reply(NodeId("n1"), reply(release=lsn(1, 0), next_esn=1), 1)
    assert idle.result(1) is None


def test_span_read_ends_its_last_epoch_with_a_bridge() -> None:
    old = NodesetSpan(first_epoch=Epoch(1), last_epoch=Epoch(1), nodeset=NODES[:3],
                      replication_factor=3)
    new = NodesetSpan(first_epoch=Epoch(2), last_epoch=EPOCH_MAX, nodeset=NODES[2:],
                      replication_factor=2)
    assert span_of([old, new], lsn(1, 7)) is old
    assert span_of([old, new], lsn(2, 0)) is old
    assert span_of([old, new], lsn(2, 1)) is new
    assert new.until_lsn == LSN_MAX and old.until_lsn == lsn(2, 0)
    r = new_round(release=lsn(2, 5), span=old, ask_all=False)
    assert r.to_ask(0) == [NodeId("n1")]  # R=3 of 3: any one node holds every record
    assert r.request.until_lsn == lsn(2, 0)
    end = ReadReply(status=Status.OK, log_id=LogId(1), release_lsn=lsn(2, 5),
                    records=((lsn(1, 1), 1, None, b"x"),), next_lsn=Lsn(lsn(2, 0) + 1))
    r.on_reply(NodeId("n1"), end, 0)
    result = r.result(100)
    assert result is not None and result.merged is not None
    assert [(g.kind, g.lo, g.hi) for g in result.merged.gaps] == [
        ("BRIDGE", lsn(1, 2), lsn(2, 0))]
    assert result.merged.next_lsn == lsn(2, 1)


def test_metadata_has_one_span_for_every_epoch() -> None:
    metadata = LogMetadata(log_id=LogId(1), next_epoch=Epoch(4), nodeset=NODES[:3],
                           replication_factor=2, last_writer=None, version=1)
    (span,) = metadata_spans(metadata)
    assert (span.first_epoch, span.last_epoch, span.nodeset) == (1, 3, NODES[:3])


def test_compressed_blocks_merge_as_plain_records_and_bad_ones_fail_the_node() -> None:
    import dataclasses

    from shared.compression import Codec, compress_batch

    payloads = [b"line %d of a compressible batch" % i for i in range(10)]
    blob = compress_batch(payloads, Codec.LZ4)
    assert blob is not None
    block = (lsn(1, 2), 1002, "k", int(Codec.LZ4), 10, blob)
    release = lsn(1, 12)
    r = new_round(release=release)
    # n1 sends the batch as a block, n2 the same LSNs as records (sliced), n3 a bad block.
    r.on_reply(NodeId("n1"), dataclasses.replace(reply(1, 12, release=release),
                                                 blocks=(block,)), 1)
    sliced = tuple((lsn(1, 2 + i), 1002, "k", p) for i, p in enumerate(payloads))
    r.on_reply(NodeId("n2"), dataclasses.replace(reply(1, 12, release=release),
                                                 records=reply(1, 12).records[:1] + sliced
                                                 + reply(1, 12).records[1:]), 1)
    bad = (lsn(1, 2), 1002, "k", int(Codec.ZSTD), 10, blob)
    r.on_reply(NodeId("n3"), dataclasses.replace(reply(release=release), blocks=(bad,)), 1)
    r.on_reply(NodeId("n4"), dataclasses.replace(reply(1, 12, release=release),
                                                 blocks=(block,)), 1)
    assert r.stragglers() == ["n3", "n5"]  # the bad block counts as a failed answer
    r.on_reply(NodeId("n5"), Status.TIMEDOUT, 2)
    result = r.result(2)
    assert result is not None and result.merged is not None
    records = result.merged.records
    assert [rec[0] for rec in records] == [lsn(1, e) for e in range(1, 13)]
    assert [rec[3] for rec in records[1:11]] == payloads and not result.merged.gaps
    assert len(r._blocks) == 1  # n1's and n4's copies of the batch expanded once


def unsure(r: ReadReply, *ranges: tuple[int, int]) -> ReadReply:
    return dataclasses.replace(r, non_authoritative=ranges)


def test_a_non_authoritative_answer_does_not_count_toward_the_f_majority() -> None:
    r = ReadRound(log_id=LogId(1), span=SPAN, from_lsn=lsn(1, 1), release_lsn=lsn(1, 2),
                  records_max=100, bytes_max=1 << 20, wait_ms=0, speculative_delay_ms=20,
                  started_ms=0, order=(NodeId("n1"), NodeId("n4"), NodeId("n5")))
    assert r.to_ask(0) == ["n1", "n4", "n5"]
    r.on_reply(NodeId("n1"), unsure(reply(release=lsn(1, 2)), (lsn(1, 1), lsn(1, 2))), 1)
    r.on_reply(NodeId("n4"), reply(release=lsn(1, 2)), 1)
    r.on_reply(NodeId("n5"), reply(release=lsn(1, 2)), 1)
    assert r.result(1) is None  # three answers, but only two vouch for e1n1
    assert r.to_ask(1) == ["n2"]
    r.on_reply(NodeId("n2"), reply(1, 2, release=lsn(1, 2)), 2)
    result = r.result(2)
    assert result is not None and result.merged is not None
    assert [rec[0] for rec in result.merged.records] == [lsn(1, 1), lsn(1, 2)]
    assert result.merged.gaps == []


def test_the_merge_stops_where_too_few_answers_vouch() -> None:
    r = new_round(release=lsn(1, 4))
    damaged = unsure(reply(1, release=lsn(1, 4)), (lsn(1, 3), lsn(1, 9)))
    r.on_reply(NodeId("n1"), damaged, 1)
    r.on_reply(NodeId("n2"), reply(1, release=lsn(1, 4)), 1)
    r.on_reply(NodeId("n3"), reply(1, release=lsn(1, 4)), 1)
    r.on_reply(NodeId("n4"), Status.TIMEDOUT, 1)
    r.on_reply(NodeId("n5"), Status.TIMEDOUT, 1)
    result = r.result(1)
    assert result is not None and result.end == "MERGED" and result.merged is not None
    # e1n2 is vouched for by three nodes (a loss); from e1n3 on only by two: not decided.
    assert [(g.kind, g.lo, g.hi) for g in result.merged.gaps] == [
        ("DATALOSS", lsn(1, 2), lsn(1, 2))]
    assert result.merged.next_lsn == lsn(1, 3)


def test_with_every_answer_in_what_no_node_holds_is_gone_and_otherwise_it_is_short() -> None:
    everyone = new_round(release=lsn(1, 2))
    for index, node in enumerate(NODES):
        answer = reply(release=lsn(1, 2))
        everyone.on_reply(node, unsure(answer, (1, LSN_MAX)) if index < 3 else answer, 1)
    result = everyone.result(1)
    assert result is not None and result.merged is not None
    assert [g.kind for g in result.merged.gaps] == ["DATALOSS"]
    short = new_round(release=lsn(1, 2))
    for index, node in enumerate(NODES):
        answer = reply(release=lsn(1, 2))
        short.on_reply(node, unsure(answer, (1, LSN_MAX)) if index < 3 else (
            answer if index == 3 else Status.CONNFAILED), 1)
    result = short.result(1)
    assert result is not None and result.end == "SHORT"


def test_malformed_ranges_fail_the_node() -> None:
    r = new_round(release=lsn(1, 2))
    r.on_reply(NodeId("n1"), unsure(reply(1, release=lsn(1, 2)), (5, 3)), 1)
    assert r.stragglers()[0] == "n1"


def test_a_bridge_ends_no_more_of_its_epoch_than_is_vouched_for() -> None:
    """A bridge at e1n2, read by an f-majority that vouches only up to e1n3: the BRIDGE gap
    stops at e1n3; the next round decides the rest with nodes that vouch for it."""
    bridge = ((lsn(1, 2), lsn(1, 2), 7, 1),)  # WRITTEN_BY_RECOVERY | HOLE | BRIDGE
    r = new_round(release=lsn(2, 1))
    for node in NODES[:2]:
        r.on_reply(node, dataclasses.replace(reply(1, release=lsn(2, 1)), markers=bridge), 1)
    r.on_reply(NODES[2], unsure(reply(1, release=lsn(2, 1)), (lsn(1, 4), lsn(1, 9))), 1)
    r.on_reply(NODES[3], Status.TIMEDOUT, 1)
    r.on_reply(NODES[4], Status.TIMEDOUT, 1)
    result = r.result(1)
    assert result is not None and result.merged is not None
    assert [(g.kind, g.lo, g.hi) for g in result.merged.gaps] == [
        ("BRIDGE", lsn(1, 2), lsn(1, 3))]
    assert result.merged.next_lsn == lsn(1, 4)
