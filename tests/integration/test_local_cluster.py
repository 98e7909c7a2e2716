"""End to end against a real local cluster of separate processes: appends over JSON and
msgpack on either sequencer node, reads that return exactly what was written and obey the
coverage rule, atomic batches, 4xx answers to bad input, the demo, restart and down."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from seqlog_cluster_support import RunningCluster, start_cluster

from seqlog import Client, Gap, LogError, Record
from seqlog.demo import coverage_problems
from services import local_cluster as lc
from shared.status import Status
from shared.types import LSN_OLDEST, Lsn, lsn_to_epoch

pytestmark = pytest.mark.integration

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=30)
MSGPACK = "application/msgpack"
_next_log = [int.from_bytes(os.urandom(4), "big") + 1_000_000]


def fresh_log() -> int:
    """A log id no other test (or earlier run on the same dir) has written to."""
    _next_log[0] += 1
    return _next_log[0]


async def post(url: str, body: bytes, content_type: str) -> tuple[int, dict[str, Any], str]:
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session, session.post(
        url, data=body, headers={"Content-Type": content_type}
    ) as resp:
        raw = await resp.read()
        data = msgpack.unpackb(raw) if resp.content_type == MSGPACK else json.loads(raw)
        return resp.status, data, resp.headers.get("X-Seqlog-Sequencer", "")


async def get_json(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session, session.get(
        url, headers={"Accept": "application/json"}
    ) as resp:
        return resp.status, json.loads(await resp.read())


async def read_all(client: Client, log_id: int, *, limit: int = 1000) -> list[Record | Gap]:
    """Every entry from LSN 1 up to the release point, checking coverage page by page."""
    entries: list[Record | Gap] = []
    next_lsn = LSN_OLDEST
    while True:
        result = await client.read(log_id, next_lsn, limit=limit)
        assert coverage_problems(next_lsn, result) == [], result
        entries.extend(result.entries())
        if result.next_lsn == next_lsn or result.next_lsn > result.release_lsn:
            return entries
        next_lsn = result.next_lsn


async def read_all_released(client: Client, log_id: int, through_lsn: int, *,
                            timeout_s: float = 60) -> list[Record | Gap]:
    """read_all once the release point covers ``through_lsn``: an append is acknowledged
    when it is stored, but a sequencer that just took over releases only after recovering
    the previous epoch, so an acknowledged record may be unreadable for a moment."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await client.tail(log_id)).release_lsn < through_lsn:
        assert asyncio.get_running_loop().time() < deadline, (
            f"log {log_id}: release never reached {through_lsn}")
        await asyncio.sleep(0.05)
    return await read_all(client, log_id)


async def test_json_appends_on_either_sequencer(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    lsns: list[int] = []
    sequencers = set()
    for i, url in enumerate(local_cluster.sequencer_urls * 2):
        body = json.dumps({"payload": base64.b64encode(b"json %d" % i).decode()}).encode()
        status, data, sequencer = await post(f"{url}/v1/logs/{log_id}/append", body,
                                             "application/json")
        assert status == 200, data
        assert isinstance(data["lsn"], int) and isinstance(data["timestamp_ms"], int)
        lsns.append(data["lsn"])
        sequencers.add(sequencer)
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
    assert len(sequencers) == 1 and sequencers <= {"seq1", "seq2"}
    status, page = await get_json(f"{local_cluster.sequencer_urls[1]}/v1/logs/{log_id}/records")
    assert status == 200
    records = page["records"]
    assert [r["lsn"] for r in records] == lsns
    assert [base64.b64decode(r["payload"]) for r in records] == [b"json %d" % i for i in range(4)]


async def test_msgpack_appends_on_either_sequencer(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    for url in local_cluster.sequencer_urls:
        body = msgpack.packb({"payload": b"\x00\xff" + url.encode(), "key": "k"})
        status, data, sequencer = await post(f"{url}/v1/logs/{log_id}/append", body, MSGPACK)
        assert status == 200 and sequencer, data
    async with Client(local_cluster.sequencer_urls[0]) as client:
        entries = await read_all(client, log_id)
    records = [e for e in entries if isinstance(e, Record)]
    assert [r.payload for r in records] == [b"\x00\xff" + u.encode()
                                            for u in local_cluster.sequencer_urls]
    assert all(r.key == "k" for r in records)


async def test_reads_return_exactly_what_was_written(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    written: dict[int, bytes] = {}
    async with Client(local_cluster.sequencer_urls) as client:
        for i in range(10):
            written[(await client.append(log_id, b"seq %d" % i)).lsn] = b"seq %d" % i
        payloads = [b"conc %d" % i for i in range(40)]
        results = await asyncio.gather(*(client.append(log_id, p) for p in payloads))
        written.update({r.lsn: p for r, p in zip(results, payloads, strict=True)})
        assert len(written) == 50
        entries = await read_all(client, log_id, limit=7)
        records = [e for e in entries if isinstance(e, Record)]
        assert {r.lsn: r.payload for r in records} == written
        assert [r.lsn for r in records] == sorted(written)
        for gap in (e for e in entries if isinstance(e, Gap)):
            assert gap.type in ("BRIDGE", "HOLE"), gap
        tail = await client.tail(log_id)
        assert tail.release_lsn >= max(written) and tail.sequencer in ("seq1", "seq2")
        middle = sorted(written)[25]
        result = await client.read(log_id, middle, limit=5)
        assert coverage_problems(middle, result) == []
        assert [r.lsn for r in result.records] == sorted(written)[25:30]


async def test_long_poll_returns_a_record_appended_meanwhile(
    local_cluster: RunningCluster,
) -> None:
    log_id = fresh_log()
    async with Client(local_cluster.sequencer_urls) as client:
        first = await client.append(log_id, b"first")
        waiting = asyncio.create_task(client.read(log_id, first.lsn + 1, wait_ms=10_000))
        second = await client.append(log_id, b"second")
        result = await asyncio.wait_for(waiting, 20)
    assert [r.lsn for r in result.records] == [second.lsn]


async def test_batches_are_atomic_and_consecutive(local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    async with Client(local_cluster.sequencer_urls) as client:
        await client.append(log_id, b"before")
        batches = await asyncio.gather(
            *(client.append_batch(log_id, [b"b%d-%d" % (b, i) for i in range(25)])
              for b in range(4))
        )
        entries = await read_all(client, log_id)
    records = {e.lsn: e.payload for e in entries if isinstance(e, Record)}
    for b, batch in enumerate(batches):
        assert batch.count == 25 and batch.last_lsn - batch.first_lsn == 24
        assert lsn_to_epoch(batch.first_lsn) == lsn_to_epoch(batch.last_lsn)
        got = [records[Lsn(batch.first_lsn + i)] for i in range(25)]
        assert got == [b"b%d-%d" % (b, i) for i in range(25)]
    spans = sorted((b.first_lsn, b.last_lsn) for b in batches)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))


BAD_POSTS: list[tuple[str, bytes, str]] = [
    ("/v1/logs/0/append", msgpack.packb({"payload": b"x"}), MSGPACK),
    ("/v1/logs/abc/append", msgpack.packb({"payload": b"x"}), MSGPACK),
    (f"/v1/logs/{2**62}/append", msgpack.packb({"payload": b"x"}), MSGPACK),
    ("/v1/logs/1/append", b"\xc1\xc1", MSGPACK),
    ("/v1/logs/1/append", b"{not json", "application/json"),
    ("/v1/logs/1/append", msgpack.packb([1, 2]), MSGPACK),
    ("/v1/logs/1/append", msgpack.packb({"payload": 5}), MSGPACK),
    ("/v1/logs/1/append", msgpack.packb({"payload": "text, not bin"}), MSGPACK),
    ("/v1/logs/1/append", msgpack.packb({}), MSGPACK),
    ("/v1/logs/1/append", msgpack.packb({"payload": b"x", "key": 7}), MSGPACK),
    ("/v1/logs/1/append", json.dumps({"payload": "%%%not base64"}).encode(), "application/json"),
    ("/v1/logs/1/append-batch", msgpack.packb({"payloads": b"x"}), MSGPACK),
    ("/v1/logs/1/append-batch", msgpack.packb({"payloads": [b"x", 3]}), MSGPACK),
]
BAD_QUERIES = [
    "from=-1", "from=abc", "limit=0", "limit=x", "wait_ms=-5", f"from={2**64}", "max_bytes=-1",
]


async def expect_rejection(status: int, data: dict[str, Any], what: str) -> None:
    assert 400 <= status < 500, (what, status, data)
    assert data.get("status") in Status.__members__, (what, data)
    assert isinstance(data.get("message"), str) and data["message"], (what, data)


async def test_bad_input_gets_4xx_with_status_and_message(
    local_cluster: RunningCluster,
) -> None:
    base = local_cluster.sequencer_urls[0]
    for path, body, content_type in BAD_POSTS:
        status, data, _ = await post(base + path, body, content_type)
        await expect_rejection(status, data, f"{path} {body[:30]!r}")
        if path.endswith("/append") and path.startswith("/v1/logs/1/"):
            assert data["status"] in ("BADMSG", "INVALID_PARAM"), (path, body, data)
    for query in BAD_QUERIES:
        status, data = await get_json(f"{base}/v1/logs/1/records?{query}")
        await expect_rejection(status, data, query)
        assert status == 400 and data["status"] in ("BADMSG", "INVALID_PARAM"), (query, data)
    too_big = msgpack.packb({"payload": b"x" * (1024 * 1024 + 1)})
    status, data, _ = await post(f"{base}/v1/logs/1/append", too_big, MSGPACK)
    assert status == 413 and data["status"] == "TOOBIG", data
    async with Client(base) as client:
        with pytest.raises(LogError) as info:
            await client.append(1, b"y" * (1024 * 1024 + 1))
    assert info.value.status is Status.TOOBIG


def test_demo_command_succeeds(local_cluster: RunningCluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "demo", "--dir", str(local_cluster.dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo: OK" in done.stdout


def _processes_mentioning(root: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(root).encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


async def test_restart_keeps_data_and_down_leaves_nothing(tmp_path: Path) -> None:
    cluster = await asyncio.to_thread(start_cluster, tmp_path / "own")
    try:
        log_id = fresh_log()
        async with Client(cluster.sequencer_urls) as client:
            before = await client.append(log_id, b"before restart")
            await asyncio.to_thread(lc.restart, cluster.dir, "st1", ready_timeout_ms=60_000)
            after = await client.append(log_id, b"after restart")
            entries = await read_all(client, log_id)
        records = [e for e in entries if isinstance(e, Record)]
        assert [(r.lsn, r.payload) for r in records] == [
            (before.lsn, b"before restart"), (after.lsn, b"after restart")
        ]
    finally:
        stopped = await asyncio.to_thread(lc.down, cluster.dir)
    assert sorted(stopped) == ["seq1", "seq2", "st1", "st2", "st3"]
    assert _processes_mentioning(cluster.dir) == []
    with pytest.raises(LogError) as info:
        async with Client(cluster.sequencer_urls, connect_timeout_ms=500) as client:
            await client.tail(1)
    assert info.value.status is Status.CONNFAILED


async def test_trim_gives_readers_a_trim_gap_and_survives_restart(
        local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    async with Client(local_cluster.sequencer_urls) as client:
        lsns = [(await client.append(log_id, b"t%d" % i)).lsn for i in range(10)]
        with pytest.raises(LogError) as beyond:
            await client.trim(log_id, lsns[-1] + 1_000)
        assert beyond.value.status is Status.INVALID_PARAM
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.cli", "trim", str(log_id), str(lsns[3]),
             "--dir", str(local_cluster.dir)],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and f"({lsns[3]})" in done.stdout, done.stdout + done.stderr
        assert (await client.tail(log_id)).trim_lsn == lsns[3]
        entries = await read_all(client, log_id)
        assert isinstance(entries[0], Gap) and (entries[0].type, entries[0].lo, entries[0].hi) == (
            "TRIM", LSN_OLDEST, lsns[3])
        assert [e.payload for e in entries if isinstance(e, Record)] == [
            b"t%d" % i for i in range(4, 10)]
        # Trimming again lower changes nothing; a storage node restart keeps the trim point.
        assert await client.trim(log_id, lsns[1]) == lsns[3]
        await asyncio.to_thread(lc.restart, local_cluster.dir, "st1")
        assert (await client.tail(log_id)).trim_lsn == lsns[3]


async def test_find_time_agrees_with_a_scan_and_read_since_starts_there(
        local_cluster: RunningCluster) -> None:
    log_id = fresh_log()
    async with Client(local_cluster.sequencer_urls) as client:
        written = []
        for i in range(30):
            result = await client.append(log_id, b"f%d" % i)
            written.append((result.lsn, result.timestamp_ms))
            if i % 10 == 9:
                await asyncio.sleep(0.01)  # spread the timestamps a little
        release = (await client.tail(log_id)).release_lsn
        for _, wanted_ms in [written[0], written[12], written[29], (0, written[29][1] + 1)]:
            expected = min((lsn for lsn, ts in written if ts >= wanted_ms), default=release + 1)
            assert await client.find_time(log_id, wanted_ms) == expected, wanted_ms
        since_ms = written[20][1]
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.cli", "read", str(log_id), "--since", str(since_ms),
             "--dir", str(local_cluster.dir)],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        first = min(lsn for lsn, ts in written if ts >= since_ms)
        # A header line, then one line per record.
        assert done.stdout.count("\n") == 1 + sum(1 for lsn, _ in written if lsn >= first)
        direct = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.cli", "read", str(log_id), "--since", str(since_ms),
             "--direct", "--dir", str(local_cluster.dir)],
            capture_output=True, text=True, timeout=60, check=False)
        assert direct.returncode == 0, direct.stdout + direct.stderr
        assert direct.stdout == done.stdout
