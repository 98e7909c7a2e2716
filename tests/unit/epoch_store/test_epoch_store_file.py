"""File backend: on-disk layout, crash leftovers, corrupt objects, the lock deadline, a race
between OS processes, and the URL factory."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from epoch_store import FileEpochStore, MemoryEpochStore, open_epoch_store, read_log_state
from epoch_store.backends import file_io
from shared.epoch_metadata import ProvisionSpec
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


async def test_layout_is_one_directory_per_log(store: FileEpochStore, tmp_path: Path) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0))
    log_dir = tmp_path / "logs" / "5"
    assert sorted(p.name for p in log_dir.iterdir()) == ["lce.json", "lock", "sequencer.json"]
    stored = json.loads((log_dir / "sequencer.json").read_text())
    assert (stored["next_epoch"], stored["last_writer"], stored["version"]) == (2, "w", 1)
    assert json.loads((log_dir / "lce.json").read_text())["epoch"] == 1


async def test_torn_temp_file_does_not_break_reads_or_writes(
    store: FileEpochStore, tmp_path: Path
) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    log_dir = tmp_path / "logs" / "5"
    # What a crash between write() and rename() leaves behind.
    (log_dir / "sequencer.json.tmp").write_bytes(b'{"format": 1, "next_ep')
    (log_dir / "lce.json.tmp").write_bytes(b"\x00" * 10)
    status, meta = await store.get_metadata(LOG)
    assert status == Status.OK and meta is not None and meta.next_epoch == 2
    assert (await store.activate(LOG, writer=W, provision=None))[:2] == (Status.OK, 2)
    assert (await store.get_last_clean_epoch(LOG))[0] == Status.OK
    assert await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0)) == Status.OK


async def test_corrupt_objects_answer_internal_and_are_not_overwritten(
    store: FileEpochStore, tmp_path: Path
) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    await store.set_last_clean_epoch(LOG, Epoch(1), Lsn(0))
    sequencer = tmp_path / "logs" / "5" / "sequencer.json"
    sequencer.write_bytes(b"garbage")
    for _ in range(2):
        assert await store.get_metadata(LOG) == (Status.INTERNAL, None)
        assert await store.activate(LOG, writer=W, provision=SPEC) == (Status.INTERNAL, 0, None)
    assert sequencer.read_bytes() == b"garbage"

    lce = tmp_path / "logs" / "5" / "lce.json"
    lce.write_text(json.dumps({"format": 1, "log_id": 6, "epoch": 1, "tail_lsn": 0,
                               "version": 1}))
    assert await store.get_last_clean_epoch(LOG) == (Status.INTERNAL, None)
    assert await store.set_last_clean_epoch(LOG, Epoch(2), Lsn(0)) == Status.INTERNAL
    # Other logs are unaffected.
    assert (await store.activate(LogId(6), writer=W, provision=SPEC))[:2] == (Status.OK, 1)


async def test_a_held_lock_times_out(store: FileEpochStore, tmp_path: Path) -> None:
    await store.activate(LOG, writer=W, provision=SPEC)
    lock_path = str(tmp_path / "logs" / "5" / "lock")
    with file_io.exclusive_lock(lock_path, timeout_ms=1000) as locked:
        assert locked
        assert await store.activate(LOG, writer=W, provision=None) == (Status.TIMEDOUT, 0, None)
        # Reads take no lock.
        assert (await store.get_metadata(LOG))[0] == Status.OK
    assert (await store.activate(LOG, writer=W, provision=None))[:2] == (Status.OK, 2)


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
from shared.epoch_metadata import ProvisionSpec
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
