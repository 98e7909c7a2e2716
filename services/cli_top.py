"""``seqlog top``: a live terminal view of the busiest logs of a cluster.

Every ``--interval-ms`` it asks each sequencer node of the cluster (found through
``GET /v1/cluster``) for the logs it sequences (``GET /v1/logs``, paged; see
``services.log_stats``) and shows the logs with the highest append rate, computed from how far
each log's next LSN moved since the previous look (LAG: LSNs handed out, not yet released).
On a terminal the table redraws in place
(``rich.live``); otherwise each look prints one table, so ``--iterations`` makes it usable in
scripts. A node that does not answer is named under the table and its logs are left out.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from seqlog import Client
from shared.types import Lsn, format_lsn, lsn_to_epoch, lsn_to_esn

PAGES_MAX = 100
"""Pages of ``GET /v1/logs`` asked of one node per look (1,000,000 logs at 10,000 a page)."""
PAGE_LIMIT = 10_000
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class LogSample:
    node_id: str
    row: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Look:
    at_s: float
    logs: dict[int, LogSample]
    failed: list[str]
    nodes: int


async def _node_logs(session: aiohttp.ClientSession, http: str, scheme: str = "http"
                     ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after = 0
    for _ in range(PAGES_MAX):
        async with session.get(f"{scheme}://{http}/v1/logs",
                               params={"after": str(after), "limit": str(PAGE_LIMIT)},
                               headers={"Accept": "application/json"}) as response:
            response.raise_for_status()
            page = await response.json()
        rows.extend(page["logs"])
        if page.get("next_after") is None:
            break
        after = int(page["next_after"])
    return rows


async def look(client: Client, session: aiohttp.ClientSession) -> Look:
    """One look at every sequencer node of the cluster."""
    info = await client.cluster()
    nodes = [n for n in info.nodes if "sequencer" in n.roles and n.state != "DEAD"]
    scheme = "http" if client.ssl_context is None else "https"
    answers = await asyncio.gather(*(_node_logs(session, n.http, scheme) for n in nodes),
                                   return_exceptions=True)
    logs: dict[int, LogSample] = {}
    failed: list[str] = []
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException):
            failed.append(f"{node.node_id} ({type(answer).__name__})")
            continue
        for row in answer:
            previous = logs.get(row["log_id"])
            # After a failover two nodes may both know the log for a moment: the newer
            # epoch is the one that sequences it.
            if previous is None or row["epoch"] > previous.row["epoch"]:
                logs[row["log_id"]] = LogSample(node.node_id, row)
    return Look(at_s=time.monotonic(), logs=logs, failed=failed, nodes=len(nodes))


def appended_between(before: dict[str, Any] | None, after: dict[str, Any]) -> int:
    """Records appended to a log between two looks, from its next LSN (a new epoch starts its
    sequence numbers at 1)."""
    now = Lsn(int(after["next_lsn"]))
    if before is None:
        # Not active at the previous look: every LSN of its epoch was handed out since.
        return max(0, lsn_to_esn(now) - 1)
    then = Lsn(int(before["next_lsn"]))
    if lsn_to_epoch(now) == lsn_to_epoch(then):
        return max(0, now - then)
    return max(0, lsn_to_esn(now) - 1)


def rates(previous: Look | None, current: Look) -> dict[int, float]:
    if previous is None or current.at_s <= previous.at_s:
        return {}
    elapsed_s = current.at_s - previous.at_s
    return {log_id: appended_between(
                previous.logs[log_id].row if log_id in previous.logs else None, sample.row)
            / elapsed_s for log_id, sample in current.logs.items()}


def render(previous: Look | None, current: Look, rows_max: int) -> Group:
    per_log = rates(previous, current)
    ordered = sorted(current.logs.items(),
                     key=lambda item: (-per_log.get(item[0], 0.0), item[1].row["idle_ms"]
                                       if item[1].row["idle_ms"] is not None else 2**62,
                                       item[0]))
    total = sum(per_log.values())
    title = (f"{len(current.logs)} active logs on {current.nodes} sequencer nodes, "
             f"{total:,.0f} appends/s" if per_log else
             f"{len(current.logs)} active logs on {current.nodes} sequencer nodes "
             "(rates from the next look)")
    table = Table(title=title, title_justify="left", expand=False, box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for name, justify in (("LOG", "right"), ("SEQ", "left"), ("STATE", "left"),
                          ("APPENDS/S", "right"), ("NEXT", "right"), ("RELEASED", "right"),
                          ("LAG", "right"), ("INFLIGHT", "right"), ("IDLE_S", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for log_id, sample in ordered[:rows_max]:
        row = sample.row
        state = row["state"] + (" (recovering)" if row["recovering"] else "")
        rate = per_log.get(log_id)
        idle = row["idle_ms"]
        table.add_row(
            str(log_id), sample.node_id, state, "-" if rate is None else f"{rate:,.1f}",
            format_lsn(row["next_lsn"]), format_lsn(row["release_lsn"]),
            str(max(0, row["next_lsn"] - 1 - row["release_lsn"])), str(row["appends_in_flight"]),
            "-" if idle is None else f"{idle / 1000:.1f}")
    parts: list[Any] = [table]
    if current.failed:
        parts.append(Text(f"not answering: {', '.join(current.failed)}", style="bold red"))
    return Group(*parts)


async def run_top(client: Client, *, interval_ms: int, iterations: int | None, rows_max: int,
                  console: Console) -> int:
    """Looks until interrupted (or ``iterations`` looks)."""
    previous: Look | None = None
    done = 0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    # The client's TLS (docs/SECURITY.md) for the nodes' own pages too.
    context = client.ssl_context
    connector = aiohttp.TCPConnector(ssl=context if context is not None else True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                     headers=client.auth_headers) as session:
        live = Live(console=console, auto_refresh=False) if console.is_terminal else None
        if live is not None:
            live.start()
        try:
            while iterations is None or done < iterations:
                current = await look(client, session)
                view = render(previous, current, rows_max)
                if live is not None:
                    live.update(view, refresh=True)
                else:
                    console.print(view)
                previous = current
                done += 1
                if iterations is None or done < iterations:
                    await asyncio.sleep(interval_ms / 1000)
        finally:
            if live is not None:
                live.stop()
    return 0
