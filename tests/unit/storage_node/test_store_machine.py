"""StoreMachine (pure): which STOREs are persisted, seals, soft seals and the release pointer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from shared.status import Status
from shared.types import Epoch, Esn, LogId, Lsn, NodeId, compose_lsn
from shared.wire.read import GetLogState
from shared.wire.recovery import Clean, Seal
from shared.wire.release import Release
from shared.wire.store import RecordFlags, recovery_wave
from storage_node.core.store_machine import (
    UNCLEAN_EPOCHS_REPORTED_MAX,
    LogStorageState,
    StoreMachine,
    unsettled_epochs,
)
from tests.unit.storage_node.helpers import LOG, SEQ_A, SEQ_B, lsn, make_read, make_store


def machine(accept_writes: bool = True) -> StoreMachine:
    return StoreMachine(accept_writes=accept_writes)


def test_valid_store_is_persisted_and_reply_comes_after() -> None:
    core = machine()
    message = make_store(lsn(1, 1))
    decision = core.on_store(message, disk_low=False)
    assert decision.status == Status.OK and decision.reply is None
    assert core.state(LOG).last_lsn == 0
    reply = core.on_persisted(message)
    assert reply.status == Status.OK and reply.lsn == message.lsn and reply.wave == 1
    assert core.state(LOG).last_lsn == lsn(1, 1)


def test_bad_checksum_and_malformed_stores_are_refused() -> None:
    core = machine()
    assert core.on_store(make_store(lsn(1, 1), checksum=1), disk_low=False).status == \
        Status.CHECKSUM_MISMATCH
    bad = [
        make_store(lsn(1, 1), ()),
        make_store(lsn(0, 5)),
        make_store(lsn(1, 0)),
        make_store(Lsn(2**32 - 1 + (1 << 32)), (b"a", b"b")),  # batch would leave the epoch
        make_store(lsn(1, 1), wave=0),
        make_store(lsn(1, 1), log_id=LogId(0)),
        make_store(lsn(1, 1), key="k" * 5000),
        dataclasses.replace(make_store(lsn(1, 1)), payloads=("text",)),  # type: ignore[arg-type]
        dataclasses.replace(make_store(lsn(1, 1)), copyset=(3,)),  # type: ignore[arg-type]
    ]
    for message in bad:
        decision = core.on_store(message, disk_low=False)
        assert decision.status == Status.BADMSG, message
        assert decision.reply is not None and decision.reply.status == Status.BADMSG
    assert core.state(LOG) == LogStorageState()


def test_store_of_newer_epoch_soft_seals_older_epochs() -> None:
    core = machine()
    assert core.on_store(make_store(lsn(3, 1), sequencer=SEQ_B), disk_low=False).status == \
        Status.OK
    decision = core.on_store(make_store(lsn(2, 9), sequencer=SEQ_A), disk_low=False)
    assert decision.status == Status.PREEMPTED
    assert decision.reply is not None
    assert (decision.reply.sealed_epoch, decision.reply.sealed_by) == (2, SEQ_B)
    # The soft seal does not stop the newer epoch itself.
    assert core.on_store(make_store(lsn(3, 2), sequencer=SEQ_B), disk_low=False).status == \
        Status.OK
    assert core.on_get_log_state(GetLogState(log_id=LOG)).sealed_epoch == 2


def test_durable_seal_only_increases_and_preempts_sealed_epochs() -> None:
    core = machine()
    assert core.seal(LOG, Epoch(5), NodeId("recovery")) == Status.OK
    assert core.seal(LOG, Epoch(5), NodeId("recovery")) == Status.UPTODATE
    assert core.seal(LOG, Epoch(4), NodeId("other")) == Status.PREEMPTED
    assert core.seal(LOG, Epoch(0), NodeId("other")) == Status.INVALID_PARAM
    decision = core.on_store(make_store(lsn(5, 1)), disk_low=False)
    assert decision.reply is not None
    assert (decision.status, decision.reply.sealed_epoch, decision.reply.sealed_by) == (
        Status.PREEMPTED, 5, "recovery")
    assert core.on_store(make_store(lsn(6, 1)), disk_low=False).status == Status.OK


def test_disabled_and_low_disk() -> None:
    assert machine(False).on_store(make_store(lsn(1, 1)), disk_low=False).status == \
        Status.DISABLED
    assert machine().on_store(make_store(lsn(1, 1)), disk_low=True).status == Status.NOSPC


def test_release_never_decreases_and_rides_on_stores() -> None:
    core = machine()
    assert core.on_release(Release(log_id=LOG, release_lsn=lsn(1, 5))) == lsn(1, 5)
    assert core.on_release(Release(log_id=LOG, release_lsn=lsn(1, 3))) is None
    decision = core.on_store(make_store(lsn(1, 9), release_lsn=lsn(1, 7)), disk_low=True)
    assert decision.status == Status.NOSPC and decision.release_lsn == lsn(1, 7)
    assert core.state(LOG).release_lsn == lsn(1, 7)
    assert core.on_release(Release(log_id=LogId(0), release_lsn=Lsn(9))) is None


def test_readable_until_is_bounded_by_release_and_range() -> None:
    core = machine()
    core.on_release(Release(log_id=LOG, release_lsn=lsn(1, 5)))

    def holds(*lsns: int) -> Callable[[LogId, Lsn, Lsn], Lsn | None]:
        def first_copy(log_id: LogId, lo: Lsn, hi: Lsn) -> Lsn | None:
            assert log_id == LOG
            return next((Lsn(x) for x in sorted(lsns) if lo <= x <= hi), None)
        return first_copy

    assert core.readable_until(make_read(1), holds()) == lsn(1, 5)
    assert core.readable_until(make_read(1, until_lsn=lsn(1, 2)), holds()) == lsn(1, 2)
    # A READ's pointer never makes a copy above the node's own pointer readable (issue 16
    # item 7): it only says the node holds nothing up to there.
    assert core.readable_until(make_read(1, release_lsn=lsn(1, 8)), holds(lsn(1, 6))) == (
        lsn(1, 5))
    assert core.readable_until(make_read(1, release_lsn=lsn(1, 8)), holds(lsn(1, 7))) == (
        lsn(1, 6))
    assert core.readable_until(make_read(1, release_lsn=lsn(1, 8)), holds(lsn(1, 9))) == (
        lsn(1, 8))
    assert core.readable_until(make_read(1, release_lsn=2**64 - 1), holds()) == 2**64 - 2
    assert core.readable_until(make_read(1, release_lsn=2**64 - 1), holds(lsn(2, 1))) == (
        lsn(2, 1) - 1)


def test_restore_loads_recovered_state() -> None:
    core = machine()
    state = LogStorageState(sealed_epoch=Epoch(2), sealed_by=SEQ_B, release_lsn=lsn(2, 1),
                            last_lsn=lsn(3, 4), soft_sealed_epoch=Epoch(2), soft_sealed_by=SEQ_A)
    core.restore(LOG, state)
    assert core.state(LOG) == state
    assert core.log_ids() == [LOG]


def test_unsettled_epochs_skip_settled_and_trimmed_ones_and_are_bounded() -> None:
    tails = {Epoch(e): (1, 3) for e in range(1, 200)}
    tails[Epoch(2)] = (3, 3)  # settled
    state = LogStorageState(epoch_tails=tails, trim_lsn=compose_lsn(Epoch(3), Esn(3)))
    reported = unsettled_epochs(state)
    assert len(reported) == UNCLEAN_EPOCHS_REPORTED_MAX
    assert reported[:2] == ((4, 1, 3), (5, 1, 3))  # 1 and 3 trimmed, 2 settled


def test_a_clean_settles_what_its_purge_saw_without_raising_the_last_known_good() -> None:
    """``clean_mark``: the epoch is settled up to the highest ESN held when the purge was
    decided; the last-known-good ESN that SEALED reports stays what the STOREs carried (a
    purge's holes past the bridge are no record); a copy that lands after the purge was
    decided leaves the epoch unsettled, reported from its true last-known-good ESN."""
    core = machine()
    for esn in (1, 2, 3):
        store = dataclasses.replace(make_store(lsn(1, esn)), last_known_good=Esn(esn - 1))
        assert core.on_store(store, disk_low=False).status is Status.OK
        core.on_persisted(store)
    clean = Clean(log_id=LOG, epoch=Epoch(1), seal_epoch=Epoch(1), sealed_by=SEQ_B,
                  bridge_esn=Esn(2), holes=(), attempt=1)
    purged = core.epoch_last_esn(LOG, Epoch(1))
    assert purged == 3
    late = dataclasses.replace(make_store(lsn(1, 4)), wave=recovery_wave(1, 1),
                               flags=int(RecordFlags.WRITTEN_BY_RECOVERY))
    core.on_persisted(late)  # an abandoned attempt's copy, after the purge was decided
    mark = core.clean_mark(clean, purged)
    assert mark == 3
    core.on_clean_marked(LOG, Epoch(1), mark)
    state = core.state(LOG)
    assert state.epoch_tails[Epoch(1)] == (2, 4) and state.settled == {Epoch(1): 3}
    assert unsettled_epochs(state) == ((1, 2, 4),)
    sealed = core.sealed(Seal(log_id=LOG, seal_epoch=Epoch(1), sealed_by=SEQ_B,
                              from_epoch=Epoch(1)), Status.OK)
    assert sealed.tails == ((1, 2, 4),)
    # Settled up to the late copy too once a CLEAN's purge covers it; never below a mark.
    core.on_clean_marked(LOG, Epoch(1), core.clean_mark(clean, 4) or 0)
    core.on_clean_marked(LOG, Epoch(1), 1)
    assert core.state(LOG).settled == {Epoch(1): 4} and unsettled_epochs(core.state(LOG)) == ()
    assert core.clean_mark(clean, 4) is None
