"""The ``seqlog`` command as a user runs it (the installed console script, real processes,
a real local cluster): a closed pipe and Ctrl-C end it without a traceback; ``read`` prints a
header, ISO 8601 times and ``--format text|json|raw``; ``read --follow`` (through a node and
``--direct``) on a log never written waits for its first record, as does a long poll on the
records endpoint; ``append`` from stdin shows a progress bar; ``top`` shows the busy log with
its rate; ``completion`` prints a script that bash completes with."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from seqlog_cluster_support import RunningCluster

from seqlog import Client, Gap, Record
from services.cli_output import TEXT_HEADER
from shared.types import format_lsn

pytestmark = pytest.mark.integration

_SCRIPT = Path(sys.executable).parent / "seqlog"
SEQLOG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "services.cli"]
"""The installed ``seqlog`` command (``[project.scripts]``), as a user types it."""
_next_log = [int.from_bytes(os.urandom(4), "big") + 3_000_000]
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def fresh_log() -> int:
    _next_log[0] += 1
    return _next_log[0]


def seqlog(*args: str, stdin: bytes | None = None, timeout_s: float = 60
           ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SEQLOG, *args], input=stdin, capture_output=True,
                          timeout=timeout_s, check=False)


class Follower:
    """A running ``seqlog read --follow``: its stdout read line by line with deadlines."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*SEQLOG, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.buffer = b""

    def line(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no line within {timeout_s} s; so far {self.buffer!r}"
            if self.selector.select(left):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"follower ended: {self.stop()}"
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        _, err = self.proc.communicate(timeout=20)
        self.selector.close()
        return self.proc.returncode, err.decode()


async def test_read_into_a_closed_pipe_ends_quietly(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    async with Client(local_cluster.sequencer_urls) as client:
        for start in range(0, 3000, 1000):
            await client.append_batch(log_id, [b"line %d" % i for i in range(start,
                                                                               start + 1000)])
    command = " ".join([*SEQLOG, "read", str(log_id), "--dir", str(local_cluster.dir)])
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", f"{command} | head -3; echo rc=${{PIPESTATUS[0]}} >&2"],
        capture_output=True, timeout=60, check=False)
    assert done.stdout.decode().splitlines()[0] == TEXT_HEADER
    # 3000 records overflow the pipe long before the end: seqlog met the closed pipe.
    assert done.stderr.decode().strip() == "rc=141", done.stderr.decode()


async def test_ctrl_c_ends_a_follower_without_a_traceback(
        local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    async with Client(local_cluster.sequencer_urls) as client:
        await client.append(log_id, b"one")
    follower = Follower("read", str(log_id), "--follow", "--dir", str(local_cluster.dir))
    try:
        assert await asyncio.to_thread(follower.line, 30) == TEXT_HEADER
        while not (await asyncio.to_thread(follower.line, 30)).endswith("\tone"):
            pass
    finally:
        code, err = await asyncio.to_thread(follower.stop, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err and err.strip() == "seqlog: interrupted", err


def test_ctrl_c_ends_an_append_waiting_for_stdin(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    proc = subprocess.Popen([*SEQLOG, "append", str(log_id), "--dir", str(local_cluster.dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"one\n")
    proc.stdin.flush()  # and stdin stays open: the command waits for more lines
    line = proc.stdout.readline().decode().split("\t")
    assert len(line) == 3 and ISO_MS.match(line[2].strip()), line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert err.decode().strip() == "seqlog: interrupted", err


async def test_read_formats_header_iso_times_json_and_raw(
        local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    payloads = [b"plain", b"tab\there", b"two\nlines", b"\xff\x00binary", "caf\u00e9".encode()]
    async with Client(local_cluster.sequencer_urls) as client:
        appended = [await client.append(log_id, p, key="k\t1" if i == 0 else None)
                    for i, p in enumerate(payloads)]
        entries = [e async for e in _entries(client, log_id)]
    target = ["--dir", str(local_cluster.dir)]

    text = await asyncio.to_thread(seqlog, "read", str(log_id), *target)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.decode().splitlines()
    assert lines[0] == TEXT_HEADER
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == len(entries) and all(len(row) == 5 for row in rows), lines
    records = [row for row in rows if not row[4].startswith("GAP ")]
    assert [int(r[1]) for r in records] == [a.lsn for a in appended]
    assert all(ISO_MS.match(r[2]) for r in records), records
    assert [r[4] for r in records] == ["plain", "tab\\there", "two\\nlines",
                                       "\\xff\\x00binary", "caf\u00e9"]
    assert records[0][3] == "k\\t1" and records[1][3] == "-"
    gaps = [row for row in rows if row[4].startswith("GAP ")]
    assert gaps == [[f"{format_lsn(g.lo)}..{format_lsn(g.hi)}", f"{g.lo}..{g.hi}", "-", "-",
                     f"GAP {g.type}"] for g in entries if isinstance(g, Gap)]

    as_json = await asyncio.to_thread(seqlog, "read", str(log_id), "--format", "json", *target)
    assert as_json.returncode == 0, as_json.stderr
    docs = [json.loads(line) for line in as_json.stdout.splitlines()]
    record_docs = [d for d in docs if d["type"] == "record"]
    assert [base64.b64decode(d["payload_base64"]) for d in record_docs] == payloads
    assert [d["payload"] for d in record_docs] == [
        "plain", "tab\there", "two\nlines", None, "caf\u00e9"]
    assert [d["timestamp_ms"] for d in record_docs] == [a.timestamp_ms for a in appended]
    assert all(ISO_MS.match(d["time"]) for d in record_docs)
    assert [(d["lo"], d["hi"]) for d in docs if d["type"] == "gap"] == [
        (g.lo, g.hi) for g in entries if isinstance(g, Gap)]

    raw = await asyncio.to_thread(seqlog, "read", str(log_id), "--format", "raw", *target)
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == b"".join(p + b"\n" for p in payloads)


async def _entries(client: Client, log_id: int) -> AsyncIterator[Record | Gap]:
    result = await client.read(log_id, 1)
    for entry in result.entries():
        assert isinstance(entry, Record | Gap)
        yield entry


@pytest.mark.parametrize("direct", [False, True], ids=["http", "direct"])
async def test_follow_on_a_log_never_written_waits_for_its_first_record(
        local_cluster: RunningCluster, direct: bool) -> None:
    log_id = fresh_log()
    follower = Follower("read", str(log_id), "--follow", "--format", "json",
                        *(["--direct"] if direct else []), "--dir", str(local_cluster.dir))
    try:
        await asyncio.sleep(1.5)  # the follower is waiting (not exited with NOTFOUND)
        assert follower.proc.poll() is None, follower.stop()
        async with Client(local_cluster.sequencer_urls) as client:
            first = await client.append(log_id, b"first")
        while True:
            doc = json.loads(await asyncio.to_thread(follower.line, 30))
            if doc["type"] == "record":
                break
        assert (doc["lsn"], doc["payload"]) == (first.lsn, "first")
    finally:
        await asyncio.to_thread(follower.stop)


async def test_long_poll_on_a_log_never_written_waits_for_its_first_record(
        local_cluster: RunningCluster) -> None:
    base = local_cluster.sequencer_urls[0]
    log_id = fresh_log()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        started_s = time.monotonic()
        async with session.get(f"{base}/v1/logs/{log_id}/records?wait_ms=400") as response:
            empty = await response.json()
        assert response.status == 200, empty
        assert empty == {"records": [], "gaps": [], "next_lsn": 1, "release_lsn": 0}
        assert time.monotonic() - started_s >= 0.35
        async with session.get(f"{base}/v1/logs/{log_id}/records") as response:
            assert response.status == 404  # no wait: a log never written is not found

        async def poll() -> dict[str, object]:
            async with session.get(f"{base}/v1/logs/{log_id}/records?wait_ms=20000") as answer:
                assert answer.status == 200
                doc: dict[str, object] = await answer.json()
                return doc

        waiting = asyncio.create_task(poll())
        await asyncio.sleep(0.5)
        assert not waiting.done()
        async with Client(local_cluster.sequencer_urls) as client:
            first = await client.append(log_id, b"hello")
        page = await asyncio.wait_for(waiting, 20)
    records = page["records"]
    assert isinstance(records, list) and [r["lsn"] for r in records] == [first.lsn]


async def test_append_from_stdin_shows_progress(local_cluster: RunningCluster,
                                                tmp_path: Path) -> None:
    log_id = fresh_log()
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"".join(b"record %d\n" % i for i in range(2500)))
    target = ["--dir", str(local_cluster.dir)]
    with lines.open("rb") as stdin:
        shown = await asyncio.to_thread(
            subprocess.run, [*SEQLOG, "append", str(log_id), "--batch", "--progress", *target],
            stdin=stdin, capture_output=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "2500/2500" in shown.stderr.decode() and "records" in shown.stderr.decode()
    assert len(shown.stdout.splitlines()) == 3  # one line per batch of 1000
    # Not a terminal and not asked for: scripts see no bar.
    quiet = await asyncio.to_thread(seqlog, "append", str(log_id), "--batch", *target,
                                    stdin=b"a\nb\n")
    assert quiet.returncode == 0 and quiet.stderr == b"", quiet.stderr
    async with Client(local_cluster.sequencer_urls) as client:
        result = await client.read(log_id, 1, limit=5000)
    assert [r.payload for r in result.records] == [b"record %d" % i for i in range(2500)] + [
        b"a", b"b"]


async def test_top_shows_the_busy_log_with_its_rate(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    stop = asyncio.Event()

    async def produce() -> None:
        async with Client(local_cluster.sequencer_urls) as client:
            while not stop.is_set():
                await client.append(log_id, b"busy")

    producer = asyncio.create_task(produce())
    try:
        await asyncio.sleep(0.5)
        top = await asyncio.to_thread(seqlog, "top", "--iterations", "2", "--interval-ms",
                                      "1000", "--rows", "1000", "--dir", str(local_cluster.dir))
    finally:
        stop.set()
        await producer
    assert top.returncode == 0, top.stderr
    second = top.stdout.decode().split("active logs on")[-1]
    rows = [line.split() for line in second.splitlines()
            if line.split()[:1] == [str(log_id)]]
    assert len(rows) == 1, top.stdout.decode()
    row = rows[0]
    assert row[1] in ("seq1", "seq2") and row[2] == "ACTIVE", row
    assert float(row[3].replace(",", "")) > 0, row


def test_completion_script_completes_in_bash() -> None:
    done = seqlog("completion", "bash")
    assert done.returncode == 0, done.stderr
    script = done.stdout.decode()
    probe = ('_shtab_seqlog seqlog re seqlog; echo "${COMPREPLY[*]}"; '
             'COMP_WORDS=(seqlog read 7 --format ""); COMP_CWORD=4; '
             '_shtab_seqlog seqlog "" --format; echo "${COMPREPLY[*]}"')
    shell = subprocess.run(
        ["bash", "-c", f'eval "$1"; COMP_WORDS=(seqlog re); COMP_CWORD=1; {probe}', "bash",
         script], capture_output=True, text=True, timeout=30, check=False)
    assert shell.returncode == 0, shell.stderr
    subcommands, formats = shell.stdout.splitlines()
    assert subcommands.split() == ["read", "rebuild"]
    assert sorted(formats.split()) == ["json", "raw", "text"]
