"""A storage node's side of epoch recovery, on a real record store: SEAL (durable, with the
epochs' tails), DIGEST of unreleased copies with their flags, recovery STOREs that overwrite
part of a batch, CLEAN purging stray copies, and all of it surviving a restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shared.status import Status
from shared.types import ESN_MAX, Epoch, Esn, Lsn, NodeId
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest, Seal, Sealed
from shared.wire.release import Release
from shared.wire.store import (
    RECOVERY_BRIDGE,
    RECOVERY_HOLE,
    RecordFlags,
    Store,
    payloads_checksum,
    recovery_wave,
)
from storage_node.runtime import StorageNode
from tests.unit.storage_node.helpers import (
    LOG,
    SEQ_B,
    log_state,
    lsn,
    make_read,
    make_store,
    read,
    request,
    running_node,
    seal,
    store,
    wait_until,
)

REC = int(RecordFlags.WRITTEN_BY_RECOVERY)


def recovery_store(esn: int, flags: int, payloads: tuple[bytes, ...], seal: int = 1) -> Store:
    return Store(log_id=LOG, lsn=lsn(1, esn), wave=recovery_wave(seal, 1), sequencer_node=SEQ_B,
                 copyset=(),
                 timestamp_ms=5, last_known_good=Esn(0), release_lsn=Lsn(0), timeout_ms=500,
                 key=None, payloads=payloads, checksum=payloads_checksum(payloads), flags=flags)


async def digest_of(node: object, from_esn: int) -> Digest:
    answer = await request(node, GetDigest(  # type: ignore[arg-type]
        log_id=LOG, epoch=Epoch(1), from_esn=Esn(from_esn), seal_epoch=Epoch(1),
        records_max=100, bytes_max=1 << 20))
    assert isinstance(answer, Digest)
    return answer


async def test_seal_digest_mutate_clean_and_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        # Epoch 1 of sequencer A: a batch e1n1..e1n4 (last known good 0), then e1n5 with
        # last known good 2, and a stray e1n8 that no f-majority holds.
        batch = make_store(lsn(1, 1), (b"a1", b"a2", b"a3", b"a4"))
        assert (await store(node, batch)).status is Status.OK
        fifth = dataclasses.replace(make_store(lsn(1, 5), (b"a5",)), last_known_good=Esn(2))
        assert (await store(node, fifth)).status is Status.OK
        assert (await store(node, make_store(lsn(1, 8), (b"stray",)))).status is Status.OK
        sealed = await request(node, Seal(log_id=LOG, seal_epoch=Epoch(1), sealed_by=SEQ_B,
                                          from_epoch=Epoch(1)))
        assert isinstance(sealed, Sealed) and sealed.status is Status.OK
        assert sealed.tails == ((1, 2, 8),)
        # Fenced: sequencer A can no longer store in epoch 1.
        late = await store(node, make_store(lsn(1, 6), (b"late",)))
        assert (late.status, late.sealed_epoch, late.sealed_by) == (Status.PREEMPTED, 1, SEQ_B)
        # The digest has every copy from ESN 3 on, released or not.
        digest = await digest_of(node, 3)
        assert [(e[0], e[1], e[5]) for e in digest.entries] == [
            (3, 0, b"a3"), (4, 0, b"a4"), (5, 0, b"a5"), (8, 0, b"stray")]
        assert digest.next_esn == ESN_MAX + 1
        # Recovery plugs e1n3 (inside the batch), re-replicates e1n4 and bridges at e1n6.
        for mutation in (recovery_store(3, int(RECOVERY_HOLE), (b"",)),
                         recovery_store(4, REC, (b"a4",)),
                         recovery_store(6, int(RECOVERY_BRIDGE), (b"",))):
            assert (await store(node, mutation)).status is Status.OK
        # CLEAN rewrites whatever the node holds where recovery decided "no record", with the
        # precedence of the attempt that decided (1).
        cleaned = await request(node, Clean(log_id=LOG, epoch=Epoch(1), seal_epoch=Epoch(1),
                                            sealed_by=SEQ_B, bridge_esn=Esn(6), holes=((3, 3),),
                                            attempt=1))
        assert isinstance(cleaned, Cleaned) and cleaned.status is Status.OK
        assert node.stats()["purged_records"] == 3  # e1n3 again, the bridge again, e1n8

    async with running_node(data_dir) as node:  # everything above survives a restart
        assert node.log_state(LOG).sealed_epoch == 1
        answer = await read(node, make_read(lsn(1, 1), release_lsn=lsn(1, 100)))
        assert [(r[0], r[3]) for r in answer.records] == [
            (lsn(1, 1), b"a1"), (lsn(1, 2), b"a2"), (lsn(1, 4), b"a4"), (lsn(1, 5), b"a5")]
        # The purge rewrote e1n3 and the bridge with the deciding attempt's precedence, not
        # below it: an abandoned attempt's copy elsewhere must never outrank the decision
        # (issue 16 item 1; tests/unit/sequencer/test_recovery_on_storage.py).
        wave = purged = recovery_wave(1, 1)
        assert answer.markers == (
            (lsn(1, 3), lsn(1, 3), int(RECOVERY_HOLE), purged),
            (lsn(1, 4), lsn(1, 4), REC, wave),
            (lsn(1, 6), lsn(1, 6), int(RECOVERY_BRIDGE), purged),
            (lsn(1, 8), lsn(1, 8), int(RECOVERY_HOLE), purged),
        )
        digest = await digest_of(node, 1)
        assert [(e[0], e[1], e[2]) for e in digest.entries] == [
            (1, 0, 1), (2, 0, 1), (3, int(RECOVERY_HOLE), purged), (4, REC, wave), (5, 0, 1),
            (6, int(RECOVERY_BRIDGE), purged), (8, int(RECOVERY_HOLE), purged)]


async def test_a_higher_seal_refuses_older_recoveries(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert (await store(node, make_store(lsn(1, 1), (b"x",)))).status is Status.OK
        for seal_epoch, expected in ((3, Status.OK), (2, Status.PREEMPTED)):
            answer = await request(node, Seal(log_id=LOG, seal_epoch=Epoch(seal_epoch),
                                              sealed_by=NodeId(f"s{seal_epoch}"),
                                              from_epoch=Epoch(1)))
            assert isinstance(answer, Sealed) and answer.status is expected
        assert answer.sealed_epoch == 3 and answer.sealed_by == "s3"
        stale = await store(node, recovery_store(1, int(RECOVERY_HOLE), (b"",), seal=2))
        assert (stale.status, stale.sealed_epoch) == (Status.PREEMPTED, 3)
        assert (await digest_of(node, 1)).status is Status.PREEMPTED  # asks with seal 1 < 3
        bad = await store(node, recovery_store(1, int(RECOVERY_HOLE), (b"not empty",), seal=3))
        assert bad.status is Status.BADMSG


async def test_clean_purges_a_store_still_queued_when_it_arrives(tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        # A zombie sequencer's STORE (this node missed the SEAL) is queued for the writer...
        stored: list[object] = []
        node.on_message(SEQ_B, make_store(lsn(1, 50), (b"stray",)), stored.append)
        # ...when recovery's CLEAN (bridge at e1n6) arrives, before the STORE is written.
        cleaned = await request(node, Clean(log_id=LOG, epoch=Epoch(1), seal_epoch=Epoch(1),
                                            sealed_by=SEQ_B, bridge_esn=Esn(6), holes=()))
        assert isinstance(cleaned, Cleaned) and cleaned.status is Status.OK
        assert stored  # written before the CLEAN's seal, so the purge saw it
        answer = await read(node, make_read(lsn(1, 7), release_lsn=lsn(2, 0)))
        assert answer.records == ()
        assert answer.markers == ((lsn(1, 50), lsn(1, 50), int(RECOVERY_HOLE),
                                   recovery_wave(1, 0)),)


async def test_clean_purges_strays_on_a_node_sealed_by_a_newer_recovery(
        tmp_path: Path) -> None:
    """A node that missed epoch 1's recovery (seal 1) and was sealed by a newer one (seal 3)
    before epoch 1's CLEAN reached it still purges its strays: the outcome is final. It
    answers PREEMPTED (a recovery member sealed higher must stop) and keeps its seal."""
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        for esn, payload in ((1, b"kept"), (7, b"stray-a"), (9, b"stray-b")):
            assert (await store(node, make_store(lsn(1, esn), (payload,)))).status is Status.OK
        newer = await request(node, Seal(log_id=LOG, seal_epoch=Epoch(3), sealed_by=NodeId("s3"),
                                         from_epoch=Epoch(2)))
        assert isinstance(newer, Sealed) and newer.status is Status.OK
        cleaned = await request(node, Clean(log_id=LOG, epoch=Epoch(1), seal_epoch=Epoch(1),
                                            sealed_by=SEQ_B, bridge_esn=Esn(2), holes=()))
        assert isinstance(cleaned, Cleaned)
        assert (cleaned.status, cleaned.sealed_epoch) == (Status.PREEMPTED, 3)
        assert node.stats()["purged_records"] == 2
    async with running_node(data_dir) as node:
        assert (node.log_state(LOG).sealed_epoch, node.log_state(LOG).sealed_by) == (3, "s3")
        answer = await read(node, make_read(lsn(1, 1), release_lsn=lsn(2, 0)))
        assert [(r[0], r[3]) for r in answer.records] == [(lsn(1, 1), b"kept")]
        assert answer.markers == (
            (lsn(1, 7), lsn(1, 7), int(RECOVERY_HOLE), recovery_wave(1, 0)),
            (lsn(1, 9), lsn(1, 9), int(RECOVERY_HOLE), recovery_wave(1, 0)))


async def test_a_read_starting_past_a_bridge_carries_the_bridge(tmp_path: Path) -> None:
    """A READ from past the bridge of its epoch gets the bridge's marker (so that readers do
    not take a stray copy behind it for a record), from memory and after a restart's scan."""
    data_dir = str(tmp_path)
    async with running_node(data_dir) as node:
        assert (await store(node, make_store(lsn(1, 1), (b"a",)))).status is Status.OK
        assert (await store(node, recovery_store(2, int(RECOVERY_BRIDGE), (b"",)))).status is (
            Status.OK)
        assert (await store(node, make_store(lsn(2, 1), (b"b",)))).status is Status.OK
        answer = await read(node, make_read(lsn(1, 5), release_lsn=lsn(2, 1)))
        bridge = (lsn(1, 2), lsn(1, 2), int(RECOVERY_BRIDGE), recovery_wave(1, 1))
        assert answer.markers == (bridge,)
        assert [r[0] for r in answer.records] == [lsn(2, 1)]
        # Reads from the bridge on, or in another epoch, are as before.
        assert (await read(node, make_read(lsn(1, 2), release_lsn=lsn(2, 1)))).markers == (
            bridge,)
        assert (await read(node, make_read(lsn(2, 1), release_lsn=lsn(2, 1)))).markers == ()
    async with running_node(data_dir) as node:
        answer = await read(node, make_read(lsn(1, 3), release_lsn=lsn(2, 1)))
        assert answer.markers == (bridge,)


async def test_unsettled_epochs_are_reported_until_a_clean_or_a_drained_release_settles_them(
        tmp_path: Path) -> None:
    """GET_LOG_STATE lists the epochs with copies above the last-known-good ESN that nothing
    settled (issue 16 item 6): a CLEAN settles one, and so does the last RELEASE of a drained
    epoch that covers every copy; durably, and without raising the last-known-good ESN."""
    data_dir = str(tmp_path)

    async def unsettled(node: StorageNode) -> tuple[tuple[int, int, int], ...]:
        return (await log_state(node)).unclean

    async with running_node(data_dir) as node:
        for epoch in (1, 2):
            assert (await store(node, make_store(lsn(epoch, 1), (b"a",)))).status is Status.OK
            second = dataclasses.replace(make_store(lsn(epoch, 2), (b"b",)),
                                         last_known_good=Esn(1))
            assert (await store(node, second)).status is Status.OK
        assert await unsettled(node) == ((1, 1, 2), (2, 1, 2))
        # A plain RELEASE, or a drained epoch's last one short of a copy, settles nothing.
        node.on_message(SEQ_B, Release(log_id=LOG, release_lsn=lsn(1, 2)), lambda _: None)
        node.on_message(SEQ_B, Release(log_id=LOG, release_lsn=lsn(2, 1),
                                       drained_epoch=Epoch(2)), lambda _: None)
        assert await unsettled(node) == ((1, 1, 2), (2, 1, 2))
        node.on_message(SEQ_B, Release(log_id=LOG, release_lsn=lsn(1, 2),
                                       drained_epoch=Epoch(1)), lambda _: None)
        await wait_until(lambda: node.log_state(LOG).settled.get(Epoch(1)) == 2)
        cleaned = await request(node, Clean(log_id=LOG, epoch=Epoch(2), seal_epoch=Epoch(2),
                                            sealed_by=SEQ_B, bridge_esn=Esn(2), holes=(),
                                            attempt=1))
        assert isinstance(cleaned, Cleaned) and cleaned.status is Status.OK
        assert await unsettled(node) == ()
    async with running_node(data_dir) as node:
        assert await unsettled(node) == ()
        # Settled, yet the last-known-good ESNs are what the STOREs carried: a mark is no
        # evidence for recovery (``StoreMachine.clean_mark``).
        assert node.log_state(LOG).settled == {1: 2, 2: 2}
        assert node.log_state(LOG).epoch_tails == {1: (1, 2), 2: (1, 2)}


async def test_a_late_store_of_an_abandoned_attempt_never_overwrites_a_newer_one(
        tmp_path: Path) -> None:
    async with running_node(str(tmp_path)) as node:
        assert await seal(node, 1, SEQ_B) is Status.OK
        newer = dataclasses.replace(recovery_store(2, int(RECOVERY_BRIDGE), (b"",)),
                                    wave=recovery_wave(1, 2))
        assert (await store(node, newer)).status is Status.OK
        late = recovery_store(2, REC, (b"attempt 1",))  # attempt 1 of the same recovery
        assert (await store(node, late)).status is Status.PREEMPTED
        answer = await read(node, make_read(lsn(1, 1), release_lsn=lsn(2, 0)))
        assert answer.records == ()
        assert answer.markers == ((lsn(1, 2), lsn(1, 2), int(RECOVERY_BRIDGE),
                                   recovery_wave(1, 2)),)
