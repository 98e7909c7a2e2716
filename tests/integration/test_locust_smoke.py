"""Locust load tests: a short mixed-traffic run through ``loadtests/run_locust.py`` on its own
local cluster (R=3, fsync=always) must send every main request kind without unexpected
failures and leave CSV/HTML reports; the capacity report logic is checked on synthetic
statistics; against a fake node that serves find-time, 429s are counted as backpressure,
503s as failures and find-time is called; the full capacity search runs only with ``--run-slow``.

Locust is only ever run as a subprocess: importing it here would monkey-patch this
process with gevent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
from aiohttp import web

from loadtests.cpu_watch import CpuUse
from loadtests.locust_report import (
    EndpointStats,
    read_stats,
    step_from_stats,
    write_capacity_report,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE_DURATION_S = 20
RUN_TIMEOUT_S = 240
CAPACITY_TIMEOUT_S = 1500
MAIN_ENDPOINTS = ("append", "append-batch", "records (tail)", "records (catch-up)", "tail")


def run_runner(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtests.run_locust", *args], cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )


@pytest.mark.integration
def test_mixed_smoke_run(tmp_path: Path) -> None:
    report = tmp_path / "report"
    done = run_runner(["mixed", "--duration-s", str(SMOKE_DURATION_S), "--users", "12",
                       "--spawn-rate", "12", "--report-dir", str(report)], RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("locust_stats.csv", "locust_failures.csv", "locust.html", "summary.json",
                 "summary.md"):
        assert (report / name).is_file(), name
    assert (report / "locust.html").stat().st_size > 1000
    rows = {r.name: r for r in read_stats(report / "locust_stats.csv")}
    for name in MAIN_ENDPOINTS:
        assert name in rows and rows[name].requests > 0, (name, sorted(rows))
    unexpected = {r.name: r.failures for r in rows.values() if r.method and r.failures}
    assert unexpected == {}, (report / "locust_failures.csv").read_text()
    summary = json.loads((report / "summary.json").read_text())
    assert summary["cpu"]["cores"] >= 1


@pytest.mark.integration
def test_mixed_smoke_run_with_auth_on(tmp_path: Path) -> None:
    """The users send the cluster's token (docs/SECURITY.md): no 401 or 403 anywhere."""
    report = tmp_path / "report"
    done = run_runner(["mixed", "--auth", "--duration-s", str(SMOKE_DURATION_S // 2),
                       "--users", "6", "--spawn-rate", "6", "--report-dir", str(report),
                       "--sequencers", "1"], RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r.name: r for r in read_stats(report / "locust_stats.csv")}
    for name in ("append", "append-batch", "tail"):
        assert name in rows and rows[name].requests > 0, (name, sorted(rows))
    unexpected = {r.name: r.failures for r in rows.values() if r.method and r.failures}
    assert unexpected == {}, (report / "locust_failures.csv").read_text()


def fake_node() -> web.Application:
    """Serves the API.md shapes: every 5th append is a 429, every 7th a 503."""
    counter = itertools.count(1)

    def packed(body: object, status: int = 200) -> web.Response:
        return web.Response(body=msgpack.packb(body), status=status,
                            content_type="application/msgpack",
                            headers={"X-Seqlog-Sequencer": "n1"})

    async def cluster(request: web.Request) -> web.Response:
        node = {"node_id": "n1", "roles": ["sequencer", "storage"], "http": request.host,
                "state": "ALIVE"}
        return web.json_response({"cluster": "fake", "nodes": [node]})

    async def openapi(_request: web.Request) -> web.Response:
        paths = ["/v1/logs/{log_id}/append", "/v1/logs/{log_id}/tail",
                 "/v1/logs/{log_id}/find-time"]
        return web.json_response({"openapi": "3.1.0", "paths": {p: {} for p in paths}})

    async def append(_request: web.Request) -> web.Response:
        n = next(counter)
        if n % 5 == 0:
            return packed({"status": "SEQNOBUFS", "message": "window full"}, 429)
        if n % 7 == 0:
            return packed({"status": "NOSEQUENCER", "message": "no sequencer"}, 503)
        return packed({"lsn": (1 << 32) | n, "timestamp_ms": int(time.time() * 1000)})

    async def tail(_request: web.Request) -> web.Response:
        return packed({"release_lsn": 1 << 32, "trim_lsn": 0, "epoch": 1, "sequencer": "n1"})

    async def find_time(_request: web.Request) -> web.Response:
        return packed({"lsn": (1 << 32) | 1})

    app = web.Application()
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_post("/v1/logs/{log_id}/append", append)
    app.router.add_get("/v1/logs/{log_id}/tail", tail)
    app.router.add_get("/v1/logs/{log_id}/find-time", find_time)
    return app


async def test_status_accounting_and_find_time_against_a_fake_node(tmp_path: Path) -> None:
    runner = web.AppRunner(fake_node())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    report = tmp_path / "report"
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadtests.run_locust", "mixed", "--url",
            f"http://127.0.0.1:{port}", "--duration-s", "10", "--users", "6", "--spawn-rate",
            "6", "--report-dir", str(report), "Producer", "Inspector", cwd=REPO_ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(process.communicate(), RUN_TIMEOUT_S)
    finally:
        await runner.cleanup()
    assert process.returncode == 1, output.decode()  # the 503s are failures
    rows = {r.name: r for r in read_stats(report / "locust_stats.csv")}
    assert rows["append"].requests > 0 and rows["append"].failures > 0
    assert rows["append [429 backpressure]"].requests > 0
    assert rows["append [429 backpressure]"].failures == 0
    assert rows["find-time"].requests > 0 and rows["find-time"].failures == 0
    assert rows["tail"].requests > 0 and rows["tail"].failures == 0
    assert "503 NOSEQUENCER" in (report / "locust_failures.csv").read_text()


def _row(name: str, requests: int, failures: int, p50_ms: float, p99_ms: float,
         duration_s: float = 10.0) -> EndpointStats:
    return EndpointStats(
        method="POST", name=name, requests=requests, failures=failures,
        requests_per_s=requests / duration_s, failures_per_s=failures / duration_s,
        avg_ms=p50_ms, p50_ms=p50_ms, p99_ms=p99_ms, max_ms=p99_ms,
    )


def test_capacity_report_finds_the_knee(tmp_path: Path) -> None:
    cpu = CpuUse(generator_core_max=0.3, generator_cores=0.3, cluster_cores=1.0,
                 machine_busy=0.6, cores=2)
    hot = CpuUse(generator_core_max=0.95, generator_cores=0.95, cluster_cores=1.0,
                 machine_busy=1.0, cores=2)
    steps = [
        step_from_stats([_row("append", 1000, 0, 2, 5)], offered_rps=100, users=5, cpu=cpu),
        step_from_stats([_row("append", 2000, 0, 3, 9),
                         _row("append [429 backpressure]", 10, 0, 1, 1)],
                        offered_rps=200, users=10, cpu=cpu),
        step_from_stats([_row("append", 3000, 50, 8, 30)], offered_rps=400, users=20, cpu=hot),
    ]
    assert steps[1].error_ratio == pytest.approx(10 / 2010)
    assert steps[1].backpressure_rps == pytest.approx(1.0)
    doc = write_capacity_report(tmp_path, steps, p99_threshold_ms=10, error_ratio_max=0.01,
                                meta={"test": True})
    assert doc["knee"]["offered_rps"] == 200
    assert doc["knee"]["achieved_rps"] == pytest.approx(200)
    assert doc["first_over"]["offered_rps"] == 400
    assert doc["generator_bound"] is True
    text = (tmp_path / "capacity.md").read_text()
    assert "Knee: 200 appends/s offered" in text
    assert "load generator was the limit from 400/s" in text
    assert (tmp_path / "capacity.png").read_bytes().startswith(b"\x89PNG")


def test_capacity_report_without_a_knee(tmp_path: Path) -> None:
    cpu = CpuUse(generator_core_max=0.1, generator_cores=0.1, cluster_cores=0.5,
                 machine_busy=0.3, cores=2)
    steps = [step_from_stats([_row("append", 100, 0, 12, 40)], offered_rps=10, users=1,
                             cpu=cpu)]
    doc = write_capacity_report(tmp_path, steps, p99_threshold_ms=10, error_ratio_max=0.01,
                                meta={})
    assert doc["knee"] is None
    assert "No knee" in (tmp_path / "capacity.md").read_text()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(CAPACITY_TIMEOUT_S + 60)
def test_capacity_search(tmp_path: Path) -> None:
    report = tmp_path / "capacity"
    done = run_runner(["capacity", "--report-dir", str(report)], CAPACITY_TIMEOUT_S)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads((report / "capacity.json").read_text())
    assert len(doc["steps"]) >= 2
    assert (report / "capacity.png").read_bytes().startswith(b"\x89PNG")
    assert (report / "step-01_stats.csv").is_file() and (report / "step-01.html").is_file()


def test_a_noisy_low_step_does_not_hide_the_knee(tmp_path: Path) -> None:
    cpu = CpuUse(generator_core_max=0.1, generator_cores=0.1, cluster_cores=0.5,
                 machine_busy=0.3, cores=2)
    steps = [
        step_from_stats([_row("append", 100, 0, 5, 60)], offered_rps=10, users=1, cpu=cpu),
        step_from_stats([_row("append", 200, 0, 5, 8)], offered_rps=20, users=1, cpu=cpu),
        step_from_stats([_row("append", 400, 0, 9, 25)], offered_rps=40, users=2, cpu=cpu),
    ]
    doc = write_capacity_report(tmp_path, steps, p99_threshold_ms=10, error_ratio_max=0.01,
                                meta={})
    assert doc["knee"]["offered_rps"] == 20
    assert doc["first_over"]["offered_rps"] == 40
    assert "1 lower step(s) missed" in (tmp_path / "capacity.md").read_text()
