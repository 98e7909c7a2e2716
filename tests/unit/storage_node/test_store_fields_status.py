"""``store_fields_status`` (the check of every STORE a storage node receives, inlined for speed)
answers exactly what the straightforward version built from ``shared.types``' validators
answers, for any field values the codec lets through (its top-level types)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.limits import BATCH_RECORDS_MAX, COPYSET_SIZE_MAX, KEY_BYTES_MAX
from shared.status import Status
from shared.types import (
    ESN_MAX,
    epoch_valid,
    log_id_valid,
    lsn_to_epoch,
    lsn_to_esn,
    lsn_valid,
    node_id_valid,
)
from shared.wire.store import FLAGS_ALL, Store, payloads_checksum
from storage_node.core.store_machine import store_fields_status


def reference_status(store: Store, node_id_ok: Callable[[str], bool] = node_id_valid) -> Status:
    first_esn = lsn_to_esn(store.lsn)
    records_count = store.records_count
    if not log_id_valid(store.log_id) or not lsn_valid(store.release_lsn):
        return Status.BADMSG
    if not epoch_valid(lsn_to_epoch(store.lsn)) or first_esn < 1:
        return Status.BADMSG
    if not 1 <= records_count <= BATCH_RECORDS_MAX or first_esn + records_count - 1 > ESN_MAX:
        return Status.BADMSG
    if not 0 <= store.last_known_good <= ESN_MAX or store.timestamp_ms < 0:
        return Status.BADMSG
    if not node_id_ok(store.sequencer_node) or len(store.copyset) > COPYSET_SIZE_MAX:
        return Status.BADMSG
    for payload in store.payloads:
        if type(payload) is not bytes:
            return Status.BADMSG
    for node in store.copyset:
        if not node_id_ok(node):
            return Status.BADMSG
    if store.key is not None and len(store.key.encode("utf-8", "replace")) > KEY_BYTES_MAX:
        return Status.BADMSG
    return store.validate()


EDGES = [0, 1, 2, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**62 - 1, 2**62, 2**64 - 1, 2**64,
         -1, 5 << 32, (5 << 32) | 1, (5 << 32) | (2**32 - 2), (2**32 - 2) << 32 | 1,
         (2**32 - 1) << 32 | 1]
ints = st.one_of(st.sampled_from(EDGES), st.integers(min_value=-2**65, max_value=2**65))


def mostly(*valid: int) -> st.SearchStrategy[int]:
    """Usually a valid value, so that every check is reached; else anything."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(valid),
                     ints)


LSNS = ((5 << 32) | 1, (5 << 32) | 7, (1 << 32) | (2**32 - 2), 5 << 32)
node_ids = st.one_of(st.sampled_from(["n1", "seq1"]), st.sampled_from(["n1", "seq1"]),
                     st.sampled_from(["", "bad id", "client.x", "a" * 64]), st.text(max_size=8))
payload_lists = st.lists(st.one_of(st.binary(max_size=8), st.binary(max_size=8),
                                   st.just("text")), max_size=3)


@settings(max_examples=600, deadline=None)
@given(log_id=mostly(1, 7, 2**62 - 1), lsn=mostly(*LSNS), release_lsn=mostly(0, *LSNS),
       last_known_good=mostly(0, 3, ESN_MAX), timestamp_ms=mostly(0, 1_700_000_000_000),
       wave=mostly(1, 2), timeout_ms=mostly(0, 10), sequencer=node_ids,
       copyset=st.lists(node_ids, max_size=4),
       payloads=payload_lists, key=st.one_of(st.none(), st.text(max_size=4),
                                             st.just("k" * (KEY_BYTES_MAX + 1))),
       flags=st.one_of(st.just(0), st.sampled_from([0, 1, 3, 7, 2, 8, FLAGS_ALL + 1, -1]),
                       ints),
       compression=st.sampled_from([0, 0, 0, 1, 2, 99]), records=mostly(1, 2, BATCH_RECORDS_MAX),
       good_checksum=st.booleans())
def test_same_answer_as_the_reference(
        log_id: int, lsn: int, release_lsn: int, last_known_good: int, timestamp_ms: int,
        wave: int, timeout_ms: int, sequencer: str, copyset: list[str], payloads: list[object],
        key: str | None, flags: int, compression: int, records: int,
        good_checksum: bool) -> None:
    payload_tuple = tuple(payloads)
    checksum = 0
    if good_checksum and all(type(p) is bytes for p in payload_tuple):
        checksum = payloads_checksum(payload_tuple)  # type: ignore[arg-type]
    store = Store(log_id=log_id, lsn=lsn, wave=wave, sequencer_node=sequencer,  # type: ignore[arg-type]
                  copyset=tuple(copyset), timestamp_ms=timestamp_ms,  # type: ignore[arg-type]
                  last_known_good=last_known_good, release_lsn=release_lsn,  # type: ignore[arg-type]
                  timeout_ms=timeout_ms, key=key, payloads=payload_tuple,  # type: ignore[arg-type]
                  checksum=checksum, flags=flags, compression=compression, records=records)
    try:
        expected: Status | type[BaseException] = reference_status(store)
    except Exception as error:  # e.g. a checksum over a str payload: both must raise alike
        expected = type(error)
    try:
        got: Status | type[BaseException] = store_fields_status(store)
    except Exception as error:
        got = type(error)
    assert got == expected
