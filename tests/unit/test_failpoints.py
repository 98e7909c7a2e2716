"""Failpoints (shared/failpoints.py): parsing and rejection at arm time, firing exactly at the
Nth hit, a real SIGKILL in a child process, the storage node's failpoint sitting between the
write and the fsync, and every name the code hits being a registered one."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import failpoints
from shared.failpoints import Arm, FailpointError
from tests.unit.storage_node.helpers import (
    assert_ok,
    lsn,
    make_store,
    running_node,
    segment_paths,
    store,
)

ROOT = Path(__file__).resolve().parents[2]
CODE_PACKAGES = ("shared", "sequencer", "storage_node", "epoch_store", "gossip", "services")
CHILD_TIMEOUT_S = 60


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Failpoint crashes recorded instead of killing the test process."""
    crashes: list[tuple[str, int]] = []
    monkeypatch.setattr(failpoints, "_crash",
                        lambda arm, hits: crashes.append((arm.name, hits)))
    try:
        yield crashes
    finally:
        failpoints.disarm()


def test_parse_accepts_counts_defaults_and_blanks() -> None:
    assert failpoints.parse("") == ()
    assert failpoints.parse(" storage.after_write_before_fsync=crash@3 , ") == (
        Arm("storage.after_write_before_fsync", "crash", 3),)
    assert failpoints.parse("sequencer.after_epoch_bump=crash,recovery.after_seal=crash@1") == (
        Arm("sequencer.after_epoch_bump"), Arm("recovery.after_seal"))
    assert Arm("appender.after_k_stores", at_hit=2).spec() == "appender.after_k_stores=crash@2"


@pytest.mark.parametrize(("spec", "complaint"), [
    ("storage.after_write=crash", "unknown failpoint 'storage.after_write'"),
    ("appender.after_k_stores", "needs an action"),
    ("appender.after_k_stores=explode", "unknown action 'explode'"),
    ("appender.after_k_stores=crash@two", "bad hit count 'two'"),
    ("appender.after_k_stores=crash@0", "outside"),
    ("recovery.after_seal=crash,recovery.after_seal=crash@2", "armed twice"),
])
def test_bad_specs_are_rejected_with_a_clear_error(spec: str, complaint: str) -> None:
    with pytest.raises(FailpointError, match=complaint):
        failpoints.arm(spec)
    assert not failpoints.armed("recovery.after_seal")


def test_unknown_name_error_lists_the_known_ones() -> None:
    with pytest.raises(FailpointError) as info:
        failpoints.parse("nope=crash")
    for name in failpoints.KNOWN:
        assert name in str(info.value)


def test_hit_is_a_no_op_when_nothing_is_armed(fired: list[tuple[str, int]]) -> None:
    for _ in range(10):
        failpoints.hit("appender.after_k_stores")
    assert fired == [] and not failpoints.armed("appender.after_k_stores")
    assert failpoints.hits_count("appender.after_k_stores") == 0


def test_crash_fires_exactly_at_the_nth_hit(fired: list[tuple[str, int]]) -> None:
    failpoints.arm("appender.after_k_stores=crash@3,recovery.after_seal=crash")
    failpoints.hit("appender.after_k_stores")
    failpoints.hit("appender.after_k_stores")
    failpoints.hit("sequencer.after_epoch_bump")  # not armed: ignored
    assert fired == []
    failpoints.hit("appender.after_k_stores")
    assert fired == [("appender.after_k_stores", 3)]
    failpoints.hit("appender.after_k_stores")  # past the Nth: only once
    failpoints.hit("recovery.after_seal")
    assert fired == [("appender.after_k_stores", 3), ("recovery.after_seal", 1)]
    assert failpoints.hits_count("appender.after_k_stores") == 4
    # Arming again replaces the set and starts counting from zero.
    failpoints.arm("recovery.after_seal=crash@2")
    assert not failpoints.armed("appender.after_k_stores")
    assert failpoints.hits_count("recovery.after_seal") == 0


def _child(env_spec: str, code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{failpoints.ENV_VAR: env_spec})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=CHILD_TIMEOUT_S)


def test_armed_from_the_environment_the_process_dies_like_kill_9() -> None:
    code = ("from shared import failpoints\n"
            "for i in range(1, 6):\n"
            "    print(i, flush=True)\n"
            "    failpoints.hit('storage.after_write_before_fsync')\n")
    result = _child("storage.after_write_before_fsync=crash@3", code)
    assert result.returncode == -signal.SIGKILL, result
    assert result.stdout.split() == ["1", "2", "3"]
    assert "failpoints armed: storage.after_write_before_fsync=crash@3" in result.stderr
    assert "failpoint storage.after_write_before_fsync hit 3: SIGKILL" in result.stderr


def test_an_unknown_name_in_the_environment_stops_the_process_at_start() -> None:
    result = _child("sequencer.after_epoch_bumped=crash", "import shared.failpoints")
    assert result.returncode == 1
    assert "FailpointError: unknown failpoint 'sequencer.after_epoch_bumped'" in result.stderr


async def test_storage_failpoint_fires_after_the_write_and_before_the_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    payload = b"written-before-the-crash"
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def commits_a_segment(fd: int) -> bool:
        # Only the record commits count: not the zero-filling thread's syncs (segment_files'
        # preallocation), nor index files, checkpoints or directory syncs on other threads.
        return (not threading.current_thread().name.startswith("seqlog-prealloc")
                and os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"))

    def fsync(fd: int) -> None:
        if commits_a_segment(fd):
            events.append("fsync")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        if commits_a_segment(fd):
            events.append("fsync")
        real_fdatasync(fd)

    def crash(arm: Arm, hits: int) -> None:
        on_disk = b"".join(Path(p).read_bytes() for p in segment_paths(str(tmp_path)))
        events.append(f"failpoint {hits} written={payload in on_disk}")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(failpoints, "_crash", crash)
    failpoints.arm("storage.after_write_before_fsync=crash@2")
    try:
        async with running_node(str(tmp_path)) as node:
            assert_ok([await store(node, make_store(lsn(1, 1)))])
            events.clear()
            assert_ok([await store(node, make_store(lsn(1, 2), (payload,)))])
    finally:
        failpoints.disarm()
    assert events[:2] == ["failpoint 2 written=True", "fsync"], events


def _hit_names(path: Path) -> Iterator[tuple[str, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("hit", "armed")
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "failpoints"
                and node.args):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value, f"{path}:{node.lineno}"
            elif isinstance(arg, ast.Name):
                yield constants.get(arg.id, f"<{arg.id}>"), f"{path}:{node.lineno}"


def test_every_failpoint_the_code_hits_is_registered() -> None:
    used = [hit for package in CODE_PACKAGES for path in (ROOT / package).rglob("*.py")
            for hit in _hit_names(path)]
    unknown = [(name, where) for name, where in used if name not in failpoints.KNOWN]
    assert not unknown, f"failpoints not in shared.failpoints.KNOWN: {unknown}"
    assert "storage.after_write_before_fsync" in {name for name, _ in used}
