"""The storage node's authoritative status, pure (``storage_node.core.authority``) and on disk
(``storage_node.authority``): damage marks, repairs, the document round trip, and a missing,
unreadable or malformed file."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from shared.authority import checked
from shared.status import Status
from shared.types import LSN_MAX, LogId, Lsn, NodeId
from shared.wire.read import Read, ReadReply
from shared.wire.recovery import GetDigest, Seal
from storage_node.authority import FILE_NAME, AuthorityFile
from storage_node.core.authority import AuthorityStatus, annotated_reply

LOG = LogId(3)
OTHER = LogId(4)


def test_read_damage_is_per_log_and_scan_damage_covers_every_log() -> None:
    status = AuthorityStatus()
    assert not status.damaged and status.ranges(LOG, 1, LSN_MAX) == ()
    assert status.range_damaged(LOG, 10, 20)
    assert not status.range_damaged(LOG, 12, 15)  # known already
    assert status.range_damaged(LOG, 21, 30)
    assert status.ranges(LOG, 15, 100) == ((15, 30),)
    assert status.ranges(OTHER, 1, LSN_MAX) == ()
    assert status.segments_damaged(frozenset({7}))
    assert not status.segments_damaged(frozenset({7}))
    assert status.ranges(OTHER, 5, 9) == ((5, 9),)
    assert status.clear(None, 1, LSN_MAX)
    assert not status.damaged


def test_clear_cuts_a_repaired_range_out() -> None:
    status = AuthorityStatus()
    status.range_damaged(LOG, 10, 20)
    assert status.clear(LOG, 13, 14)
    assert status.ranges(LOG, 1, 100) == ((10, 12), (15, 20))
    assert not status.clear(OTHER, 1, 100)


def test_the_file_round_trips_and_a_bad_one_vouches_for_nothing(tmp_path: Path) -> None:
    status = AuthorityStatus()
    status.range_damaged(LOG, 10, 20)
    status.segments_damaged(frozenset({2}))
    AuthorityFile(str(tmp_path)).save(status)
    loaded = AuthorityStatus()
    AuthorityFile(str(tmp_path)).load(loaded)
    assert loaded.snapshot() == status.snapshot()
    fresh = AuthorityStatus()
    AuthorityFile(str(tmp_path / "missing")).load(fresh)
    assert not fresh.damaged
    for content in (b"{not json", b'{"version": 1, "all_logs": [[5, 3]], "logs": {}, '
                    b'"damaged_segments": []}', b"[]"):
        (tmp_path / FILE_NAME).write_bytes(content)
        broken = AuthorityStatus()
        AuthorityFile(str(tmp_path)).load(broken)
        assert broken.ranges(OTHER, 1, LSN_MAX) == ((1, LSN_MAX),)


_ints = st.integers(min_value=0, max_value=2**64 - 1)


@given(st.one_of(
    st.builds(Read, log_id=_ints, from_lsn=_ints, until_lsn=_ints, release_lsn=_ints,
              records_max=_ints, bytes_max=_ints),
    st.builds(Seal, log_id=_ints, seal_epoch=_ints, sealed_by=st.just(NodeId("s")),
              from_epoch=_ints),
    st.builds(GetDigest, log_id=_ints, epoch=_ints, from_esn=_ints, seal_epoch=_ints,
              records_max=_ints, bytes_max=_ints)))
def test_any_request_gets_well_formed_ranges(message: Read | Seal | GetDigest) -> None:
    """Requests are annotated before their fields are validated: any values must give
    well-formed ranges (or none), never an exception."""
    status = AuthorityStatus()
    status.segments_damaged(frozenset({1}))
    answers: list[object] = []
    answer = ReadReply(status=Status.BADMSG, log_id=LOG, release_lsn=Lsn(0), records=(),
                       next_lsn=Lsn(0))
    annotated_reply(status, message, answers.append)(answer)
    ranges = getattr(answers[0], "non_authoritative", ())
    assert checked(ranges) is not None
