"""The web console at ``/ui`` in a real headless Chromium (Debian's ``chromium``, driven by
Playwright with the system browser) against a real local cluster of its own: the cluster page
lists the nodes ``/v1/cluster`` lists, the logs page shows the written logs with the release
points ``/tail`` gives and searches them, a log's page shows its records' payloads and its
epochs, a killed node shows as DEAD within the failure detector's threshold, and no page logs
a console error. The assets come from the node (no CDN): every request the browser makes goes
to the node."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from seqlog_cluster_support import RunningCluster, start_cluster

from seqlog import Client
from services import local_cluster as lc
from shared.config import GossipConfig
from shared.types import format_lsn

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
PAGE_TIMEOUT_MS = 15_000
_GOSSIP = GossipConfig()
DEAD_THRESHOLD_S = _GOSSIP.gossip_interval_ms * _GOSSIP.gossip_threshold_intervals / 1000
REFRESH_S = 2.0
PAYLOADS = [b"hello console", b"tab\there", b"\xff\xfe binary"]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def post_json(url: str, doc: object) -> Any:
    request = urllib.request.Request(url, data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    running = start_cluster(tmp_path_factory.mktemp("console-cluster"))
    try:
        yield running
    finally:
        lc.down(running.dir)


@pytest.fixture(scope="module")
def logs(cluster: RunningCluster) -> list[int]:
    base = cluster.sequencer_urls[0]
    log_ids = [int.from_bytes(os.urandom(3), "big") * 10 + 1_000_000_000 + i for i in range(3)]
    for log_id in log_ids:
        post_json(f"{base}/v1/logs/{log_id}/append-batch",
                  {"payloads": [base64.b64encode(p).decode() for p in PAYLOADS]})
    return log_ids


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None, "chromium missing: run scripts/bootstrap.sh"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


class Console:
    """One browser page on a node's console, with its console errors and foreign requests."""

    def __init__(self, browser: Browser, base: str) -> None:
        self.base = base
        self.page: Page = browser.new_page(viewport={"width": 1280, "height": 800})
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.errors: list[str] = []
        self.allowed_errors: tuple[str, ...] = ()
        """Console errors a test expects (the browser logs every non-2xx fetch as one)."""
        self.foreign: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: None if r.url.startswith(base) or r.url.startswith(
            "data:") else self.foreign.append(r.url))

    def open(self, fragment: str) -> Page:
        self.page.goto(f"{self.base}/ui/{fragment}")
        self.page.wait_for_selector("body[data-ready='1']")
        return self.page

    def cells(self, table_id: str) -> list[list[str]]:
        return self.page.eval_on_selector_all(
            f"#{table_id} tbody tr",
            "rows => rows.map(r => Array.from(r.cells, c => c.textContent.trim()))")

    def close(self) -> None:
        self.page.close()
        errors = [e for e in self.errors if not any(a in e for a in self.allowed_errors)]
        assert errors == [], errors
        assert self.foreign == [], self.foreign


@pytest.fixture
def console(browser: Browser, cluster: RunningCluster) -> Iterator[Console]:
    opened = Console(browser, cluster.sequencer_urls[0])
    yield opened
    opened.close()


def test_cluster_page_lists_the_nodes_of_the_api(console: Console,
                                                 cluster: RunningCluster) -> None:
    console.open("#/cluster")
    api = get_json(f"{cluster.sequencer_urls[0]}/v1/cluster")
    rows = console.cells("nodes")
    assert [(r[0], r[1], r[3]) for r in rows] == [
        (n["node_id"], n["state"], n["http"]) for n in api["nodes"]]
    assert console.page.inner_text("#count-ALIVE .value") == str(len(api["nodes"]))
    assert console.page.locator("canvas").count() == 3


def test_logs_page_shows_and_searches_the_logs(console: Console, cluster: RunningCluster,
                                               logs: list[int]) -> None:
    console.open("#/logs")
    console.page.wait_for_function(
        "ids => ids.every(id => document.querySelector('#logs').textContent.includes(id))",
        arg=[str(i) for i in logs])
    # Trim points arrive after the table (each from the log's /tail, in the background).
    console.page.wait_for_function(
        "ids => ids.every(id => (document.querySelector(`td[data-trim='${id}']`) || {})"
        ".textContent !== '…')", arg=[str(i) for i in logs])
    rows = {int(r[0]): r for r in console.cells("logs")}
    for log_id in logs:
        tail = get_json(f"{cluster.sequencer_urls[0]}/v1/logs/{log_id}/tail")
        row = rows[log_id]
        assert row[1] == tail["sequencer"] and row[2] == "ACTIVE", row
        assert (row[3], row[4], row[5]) == (str(tail["epoch"]), format_lsn(tail["release_lsn"]),
                                            format_lsn(tail["trim_lsn"])), row
    console.page.fill("#log-search", str(logs[1]))
    console.page.wait_for_function("n => document.querySelectorAll('#logs tbody tr').length == n",
                                   arg=1)
    assert console.cells("logs")[0][0] == str(logs[1])


def test_log_page_shows_records_and_epochs(console: Console, cluster: RunningCluster,
                                           logs: list[int]) -> None:
    log_id = logs[0]
    console.open(f"#/logs/{log_id}")
    tail = get_json(f"{cluster.sequencer_urls[0]}/v1/logs/{log_id}/tail")
    assert console.page.inner_text("#card-release .value") == format_lsn(tail["release_lsn"])
    assert console.page.inner_text("#card-sequencer .value") == tail["sequencer"]
    records = [r for r in console.cells("records") if not r[4].endswith(" gap")]
    assert [r[4] for r in records] == ["hello console", "tab\\there",
                                       "(binary, 9 bytes) ff fe 20 62 69 6e 61 72 79"]
    nodesets = get_json(f"{cluster.sequencer_urls[0]}/v1/logs/{log_id}/nodesets")
    epochs = console.cells("epochs")
    assert [e[2] for e in epochs] == [
        ", ".join(n["node_id"] for n in s["nodes"]) for s in nodesets["nodesets"]]


def test_logs_page_pages_and_searches_a_thousand_logs(console: Console,
                                                     cluster: RunningCluster) -> None:
    many = 1200
    first = 2_000_000_000 + int.from_bytes(os.urandom(2), "big") * 10_000

    async def write() -> None:
        async with Client(cluster.sequencer_urls) as client:
            gate = asyncio.Semaphore(64)

            async def one(log_id: int) -> None:
                async with gate:
                    await client.append(log_id, b"many")

            await asyncio.gather(*(one(first + i) for i in range(many)))

    # Playwright's sync API runs a loop in this thread: the writes get a thread of their own.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(write())).result(timeout=120)
    console.open("#/logs")
    info = console.page.inner_text("#page-info")
    total = int(info.split("·")[1].split()[0])
    assert total >= many and info.startswith(f"page 1 of {-(-total // 50)}"), info
    assert len(console.cells("logs")) == 50
    console.page.click("#next")
    console.page.wait_for_function("() => document.querySelector('#page-info').textContent"
                                   ".startsWith('page 2 of')")
    assert len(console.cells("logs")) == 50
    wanted = first + 777
    console.page.fill("#log-search", str(wanted))
    console.page.wait_for_function("n => document.querySelectorAll('#logs tbody tr').length == n",
                                   arg=1)
    assert console.cells("logs")[0][0] == str(wanted)


def test_a_killed_node_shows_as_dead_within_the_threshold(console: Console,
                                                          cluster: RunningCluster) -> None:
    console.open("#/cluster")
    victim = next(n for n in cluster.state.nodes if n.node_id == "st3")
    os.kill(victim.pid, signal.SIGKILL)
    killed_s = time.monotonic()
    console.page.wait_for_function(
        "() => Array.from(document.querySelectorAll('#nodes tbody tr')).some("
        "r => r.cells[0].textContent == 'st3' && r.cells[1].textContent == 'DEAD')",
        timeout=int((DEAD_THRESHOLD_S + 2 * REFRESH_S + 5) * 1000))
    assert time.monotonic() - killed_s <= DEAD_THRESHOLD_S + 2 * REFRESH_S + 5
    assert "st3 DEAD" in console.page.inner_text("#banner")
    assert console.page.inner_text("#count-DEAD .value") == "1"
    # The rest of the console still works with the node gone. A log's tail may be 503
    # NOTREADY meanwhile (with R=3 of 3 storage nodes, no R nodes can confirm its
    # sequencer), which the browser logs as a failed load: expected, the page shows "?".
    console.allowed_errors = ("status of 503 (Service Unavailable)",)
    console.open("#/logs")
    assert console.cells("logs")


def test_the_console_is_shipped_in_the_package() -> None:
    assets = Path(__file__).resolve().parents[2] / "services" / "console"
    html = (assets / "index.html").read_text()
    assert "http://" not in html and "https://" not in html
    for name in ("console.js", "console.css"):
        text = (assets / name).read_text()
        assert "http://" not in text and "https://" not in text, name
