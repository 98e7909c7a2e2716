"""File backend: the journal layout, group commit, torn tails and corruption, the lock
deadline, compaction, the legacy import, races and kill -9 between OS processes, and the URL
factory."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from epoch_store import FileEpochStore, MemoryEpochStore, open_epoch_store, read_log_state
from epoch_store.backends import file_io, journal_file
from epoch_store.core import journal
from shared.epoch_metadata import LastCleanEpoch, ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId

LOG = LogId(5)
SPEC = ProvisionSpec(nodeset=(NodeId("s1"), NodeId("s2")), replication_factor=2)
W = NodeId("w")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FileEpochStore]:
    store = FileEpochStore(str(tmp_path), lock_timeout_ms=200)
    yield store
    await store.close()


def journal_path(root: Path) -> Path:
    return root / journal_file.JOURNAL_FILE


async def test_layout_is_one_journal_for_all_logs(store: FileEpochStore, tmp_path: Path) -> None:
    for log in range(1, 101):
        await store.activate(LogId(log), writer=W, provision=SPEC)
    await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0))
    assert sorted(os.listdir(tmp_path)) == ["epochs.journal", "epochs.lock"]
    # Compact: a hundred logs take a few kilobytes, not a directory and three files each.
    assert journal_path(tmp_path).stat().st_size < 100 * 64
    reopened = FileEpochStore(str(tmp_path))
    status, meta = await reopened.get_metadata(LOG)
    assert status == Status.OK and meta is not None
    assert (meta.next_epoch, meta.last_writer, meta.version) == (2, "w", 1)
    lce = (await reopened.get_last_clean_epoch(LOG))[1]
    assert lce is not None and (lce.epoch, lce.version) == (1, 1)
    await reopened.close()


async def test_concurrent_changes_share_one_write_and_fsync(store: FileEpochStore) -> None:
    logs = [LogId(i) for i in range(1, 2001)]
    results = await asyncio.gather(*(store.activate(log, writer=W, provision=SPEC)
                                     for log in logs))
    assert all(r[:2] == (Status.OK, 1) for r in results)
    before = store.files.journal.commits_count
    statuses = await asyncio.gather(*(store.set_last_clean_epoch(log, Epoch(1), Lsn(0))
                                      for log in logs))
    assert statuses == [Status.OK] * len(logs)
    # Everything asked for in one loop iteration: one commit (a few if the loop was slow).
    assert store.files.journal.commits_count - before <= 3


async def test_a_torn_tail_is_ignored_then_truncated(tmp_path: Path) -> None:
    store = FileEpochStore(str(tmp_path))
    await store.activate(LOG, writer=W, provision=SPEC)
    await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0))
    await store.close()
    path = journal_path(tmp_path)
    good = path.read_bytes()
    # What a writer killed mid-write leaves: a frame cut short, at every possible cut.
    extra = journal.encode_frame(journal.encode_record(
        LastCleanEpoch(log_id=LOG, epoch=Epoch(5), tail_lsn=Lsn(0), version=2)))
    for cut in (1, 4, 8, len(extra) - 1):
        path.write_bytes(good + extra[:cut])
        reader = FileEpochStore(str(tmp_path))
        status, lce = await reader.get_last_clean_epoch(LOG)
        assert status == Status.OK and lce is not None and lce.epoch == 1
        await reader.close()
        assert path.stat().st_size == len(good) + cut  # readers never truncate
    writer = FileEpochStore(str(tmp_path))
    assert await writer.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.OK
    assert writer.files.journal.torn_tails_count == 1
    await writer.close()
    found = journal.scan(path.read_bytes()[journal.HEADER.size:], {})
    assert found.problem is None and found.torn_bytes == 0


async def test_corruption_answers_internal_and_is_not_overwritten(
    store: FileEpochStore, tmp_path: Path
) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0))
    path = journal_path(tmp_path)
    data = bytearray(path.read_bytes())
    # Damage the first frame while more than one commit's worth of frames follow it.
    data[journal.HEADER.size + journal.FRAME_HEADER.size] ^= 0xFF
    data += b"\x01" * (journal.COMMIT_BYTES_MAX + 100)
    path.write_bytes(bytes(data))
    other = FileEpochStore(str(tmp_path))
    try:
        for _ in range(2):
            assert await other.get_metadata(LOG) == (Status.INTERNAL, None)
            assert await other.activate(LOG, writer=W, provision=SPEC) == (
                Status.INTERNAL, 0, None)
        assert path.read_bytes() == bytes(data)
    finally:
        await other.close()


async def test_an_invalid_record_fails_its_log_only(
    store: FileEpochStore, tmp_path: Path
) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    raw = bytearray(journal.encode_record(
        LastCleanEpoch(log_id=LOG, epoch=Epoch(1), tail_lsn=Lsn(0), version=1)))
    raw[journal.RECORD_HEAD.size + 4:journal.RECORD_HEAD.size + 8] = bytes(4)  # epoch 0
    with journal_path(tmp_path).open("ab") as f:
        f.write(journal.encode_frame(bytes(raw)))
    assert await store.get_last_clean_epoch(LOG) == (Status.INTERNAL, None)
    assert await store.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.INTERNAL
    assert (await store.activate(LogId(6), writer=W, provision=SPEC))[:2] == (Status.OK, 1)
    assert await store.set_last_clean_epoch(LogId(6), Epoch(1), Lsn(0)) == Status.OK


async def test_a_held_lock_times_out(store: FileEpochStore, tmp_path: Path) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    lock_path = str(tmp_path / journal_file.LOCK_FILE)
    with file_io.exclusive_lock(lock_path, timeout_ms=1000) as locked:
        assert locked
        assert await store.activate(LOG, writer=W, provision=None) == (Status.TIMEDOUT, 0, None)
        # Reads take the lock shared: a writer in the middle of a commit holds them up too.
        assert await store.get_metadata(LOG) == (Status.TIMEDOUT, None)
    assert (await store.activate(LOG, writer=W, provision=None))[:2] == (Status.OK, 2)


async def test_compaction_keeps_every_value_and_other_handles_follow(tmp_path: Path) -> None:
    store = FileEpochStore(str(tmp_path), compact_bytes_min=4096)
    other = FileEpochStore(str(tmp_path), compact_bytes_min=4096)
    logs = [LogId(i) for i in range(1, 21)]
    for round_ in range(1, 11):
        assert all(r[0] == Status.OK for r in await asyncio.gather(
            *(store.activate(log, writer=W, provision=SPEC) for log in logs)))
        statuses = await asyncio.gather(*(other.set_last_clean_epoch(log, Epoch(round_),
                                                                    Lsn(0)) for log in logs))
        assert statuses == [Status.OK] * len(logs)
    compactions = (store.files.journal.compactions_count
                   + other.files.journal.compactions_count)
    assert compactions >= 1
    assert journal_path(tmp_path).stat().st_size < 4096 * 4
    assert not (tmp_path / (journal_file.JOURNAL_FILE + journal_file.COMPACT_SUFFIX)).exists()
    for handle in (store, other, FileEpochStore(str(tmp_path))):
        meta = (await handle.get_metadata(LogId(7)))[1]
        lce = (await handle.get_last_clean_epoch(LogId(7)))[1]
        assert meta is not None and (meta.next_epoch, meta.version) == (11, 10)
        assert lce is not None and (lce.epoch, lce.version) == (10, 10)
        await handle.close()


async def test_a_per_log_directory_layout_is_imported(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs" / "5"
    log_dir.mkdir(parents=True)
    (log_dir / "sequencer.json").write_text(json.dumps({
        "format": 1, "log_id": 5, "next_epoch": 4, "nodeset": ["s1", "s2"],
        "replication_factor": 2, "last_writer": "w", "version": 3}))
    (log_dir / "lce.json").write_text(json.dumps({
        "format": 1, "log_id": 5, "epoch": 2, "tail_lsn": 0, "version": 2}))
    (log_dir / "lock").write_bytes(b"")
    store = FileEpochStore(str(tmp_path))
    try:
        status, epoch, meta = await store.activate(LOG, writer=W, provision=None)
        assert (status, epoch) == (Status.OK, 4) and meta is not None and meta.version == 4
        lce = (await store.get_last_clean_epoch(LOG))[1]
        assert lce is not None and (lce.epoch, lce.version) == (2, 2)
        assert await store.set_last_clean_epoch(LOG, Epoch(4), Lsn(0)) == Status.OK
    finally:
        await store.close()


async def test_read_log_state_for_tooling(store: FileEpochStore, tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    assert (await asyncio.to_thread(read_log_state, url, LOG)).status == Status.NOTFOUND
    await store.activate(LOG, writer=W, provision=SPEC)
    state = await asyncio.to_thread(read_log_state, url, LOG)
    assert state.status == Status.OK
    assert state.metadata == (await store.get_metadata(LOG))[1]
    assert state.last_clean_epoch is not None and state.last_clean_epoch.epoch == 0
    assert (await asyncio.to_thread(read_log_state, url, LogId(0))).status == (
        Status.INVALID_PARAM
    )


async def test_open_epoch_store_urls(tmp_path: Path) -> None:
    memory = open_epoch_store("memory:")
    assert isinstance(memory, MemoryEpochStore)
    await memory.close()
    opened = open_epoch_store(f"file://{tmp_path}/epochs/")
    assert isinstance(opened, FileEpochStore) and opened.files.root_dir == f"{tmp_path}/epochs"
    await opened.close()
    for bad in ["file://host/x", "file:relative", "file:///", "zk://h:2181", "memory:x", ""]:
        with pytest.raises(ValueError):
            open_epoch_store(bad)


WORKER = """
import asyncio, json, sys
from epoch_store import FileEpochStore
from shared.epoch_metadata import LastCleanEpoch, ProvisionSpec
from shared.status import Status
from shared.types import LogId, NodeId

async def main(root, writer, logs, count):
    store = FileEpochStore(root)
    spec = ProvisionSpec(nodeset=(NodeId("s1"),), replication_factor=1)
    print("ready", flush=True)
    sys.stdin.readline()
    agains = 0
    async def one(log):
        nonlocal agains
        for _ in range(100):
            status, epoch, _ = await store.activate(log, writer=writer, provision=spec)
            if status == Status.OK:
                return [log, epoch]
            assert status == Status.AGAIN, status
            agains += 1
        raise AssertionError("still AGAIN after 100 tries")
    taken = await asyncio.gather(*(one(LogId(logs[i % len(logs)])) for i in range(count)))
    await store.close()
    result = {"taken": taken, "agains": agains, "conflicts": store.cas_conflicts_count}
    print(json.dumps(result), flush=True)

asyncio.run(main(sys.argv[1], NodeId(sys.argv[2]), [1, 2, 3], int(sys.argv[3])))
"""


async def test_processes_racing_on_the_same_logs_share_out_epochs_exactly(
    tmp_path: Path,
) -> None:
    processes_count, activations_per_process = 4, 25
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", WORKER, str(tmp_path), f"p{i}", str(activations_per_process),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        for i in range(processes_count)
    ]
    async with asyncio.timeout(120):
        for proc in procs:
            assert proc.stdout is not None
            assert await proc.stdout.readline() == b"ready\n"
        outputs = await asyncio.gather(*(p.communicate(b"go\n") for p in procs))
    assert all(p.returncode == 0 for p in procs), outputs
    by_log: dict[int, list[int]] = {}
    for stdout, _ in outputs:
        for log, epoch in json.loads(stdout)["taken"]:
            by_log.setdefault(log, []).append(epoch)
    assert sum(len(e) for e in by_log.values()) == processes_count * activations_per_process
    for epochs in by_log.values():
        assert sorted(epochs) == list(range(1, len(epochs) + 1))


KILLED_WORKER = """
import asyncio, json, sys
from epoch_store import FileEpochStore
from shared.epoch_metadata import ProvisionSpec
from shared.status import Status
from shared.types import Epoch, LogId, Lsn, NodeId

async def main(root):
    store = FileEpochStore(root)
    spec = ProvisionSpec(nodeset=(NodeId("s1"),), replication_factor=1)
    logs = [LogId(i) for i in range(1, 201)]
    while True:
        results = await asyncio.gather(*(store.activate(log, writer=NodeId("k"), provision=spec)
                                         for log in logs))
        taken = [[log, epoch] for log, (status, epoch, _) in zip(logs, results)
                 if status == Status.OK]
        await asyncio.gather(*(store.set_last_clean_epoch(log, Epoch(e), Lsn(0))
                               for log, e in taken))
        print(json.dumps(taken), flush=True)

asyncio.run(main(sys.argv[1]))
"""


async def test_kill_9_mid_commit_never_hands_out_an_epoch_twice(tmp_path: Path) -> None:
    """Workers SIGKILLed at arbitrary points (mid-write included, at random) leave a journal
    that the next process reads: every epoch reported as taken stays taken."""
    reported: dict[int, list[int]] = {}
    for round_ in range(6):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", KILLED_WORKER, str(tmp_path), stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            for _ in range(1 + round_ % 3):
                for log, epoch in json.loads(await proc.stdout.readline()):
                    reported.setdefault(log, []).append(epoch)
        proc.kill()
        rest, _ = await proc.communicate()
        for line in rest.splitlines():
            if line.endswith(b"]"):
                for log, epoch in json.loads(line):
                    reported.setdefault(log, []).append(epoch)
    assert len(reported) == 200
    store = FileEpochStore(str(tmp_path))
    try:
        for log, epochs in reported.items():
            assert len(set(epochs)) == len(epochs), (log, epochs)
            status, epoch, _ = await store.activate(LogId(log), writer=W, provision=None)
            assert status == Status.OK and epoch > max(epochs), (log, epoch, epochs)
            lce = (await store.get_last_clean_epoch(LogId(log)))[1]
            assert lce is not None and lce.epoch < epoch
    finally:
        await store.close()
