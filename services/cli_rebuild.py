"""``seqlog rebuild status`` and ``seqlog node drain|remove``: the cluster's storage shards
(``shared.cluster_state``).

``rebuild status`` asks a node for ``GET /v1/cluster`` and shows every shard (disk
generation, status, since when, what its rebuild covers: the whole shard or a mini-rebuild's
damaged ranges, who asked) and, for each rebuild or drain under way, a
progress bar per donor (bytes sent against the donor's estimate of what it holds, records
sent) and whether it is done; ``--watch`` redraws until nothing is being rebuilt.

``node drain NODE`` records DRAINING in the cluster state (in the epoch store, like
``seqlog epochs``): the other storage nodes re-replicate NODE's copies elsewhere while it
still serves reads, and NODE takes no new copies. ``node remove NODE`` is refused until the
drain is done (DRAINED).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

from epoch_store.cluster_state import open_cluster_state
from services import local_cluster as lc
from shared import cluster_state as cs
from shared.cluster_state import ShardStatus
from shared.status import Status

UNDER_WAY = ("REBUILDING", "DRAINING")


def add_parsers(commands: Any, add_target: Any) -> None:
    rebuild = commands.add_parser("rebuild", help="storage shards being rebuilt")
    actions = rebuild.add_subparsers(dest="action", required=True)
    status = actions.add_parser("status", help="every shard, and progress bars for rebuilds "
                                "and drains under way")
    status.add_argument("--watch", action="store_true",
                        help="redraw every --interval-ms until nothing is being rebuilt")
    status.add_argument("--interval-ms", type=int, default=1000)
    add_target(status)
    node = commands.add_parser("node", help="drain or remove a storage node")
    node_actions = node.add_subparsers(dest="action", required=True)
    for name, text in (("drain", "re-replicate the node's copies elsewhere; it keeps serving "
                        "reads and takes no new copies"),
                       ("remove", "mark a drained node removed (refused until drained)")):
        parser = node_actions.add_parser(name, help=text)
        parser.add_argument("node_id", metavar="NODE")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--dir", type=Path, help="local cluster directory")
        source.add_argument("--epoch-store", help="file:///dir or zk://host:port[,...]/root")


def _shards(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/cluster", timeout=10) as answer:
        document = json.loads(answer.read())
    shards = document.get("shards")
    if not isinstance(shards, list):
        raise RuntimeError(f"{url} did not report shards (epoch store unreadable?)")
    return shards


def _scope(shard: dict[str, Any]) -> str:
    """What the shard's rebuild (under way, or the last one) covers: the whole shard, or a
    mini-rebuild's damaged LSN ranges (absent from nodes that predate mini-rebuilds)."""
    if shard["status"] not in ("REBUILDING", "AUTHORITATIVE") or not shard.get("rebuilds_count"):
        return "-"
    dirty = shard.get("dirty_ranges") or []
    # The ranges are kept only while the rebuild runs; their count stays (newer nodes).
    ranges = shard.get("scope_ranges", sum(len(r) for _, r in dirty))
    logs = shard.get("scope_logs", len(dirty))
    if not ranges:
        return "shard"
    return f"mini: {ranges} range{'s' * (ranges != 1)} of {logs} log{'s' * (logs != 1)}"


def format_shards(shards: list[dict[str, Any]], now_ms: int) -> str:
    rows = [("SHARD", "GENERATION", "STATUS", "SINCE", "REBUILT", "REQUESTED_BY", "REASON")]
    for shard in shards:
        since = shard["since_ms"]
        ago = f"{(now_ms - since) / 1000:,.0f}s ago" if since else "-"
        rows.append((shard["node_id"], str(shard["generation"]), shard["status"], ago,
                     _scope(shard), shard["requested_by"] or "-", shard["reason"] or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _draw(shards: list[dict[str, Any]], console: Console) -> bool:
    """Print the table and the progress of what is under way; True if anything is."""
    console.print(format_shards(shards, time.time_ns() // 1_000_000), highlight=False)
    busy = [s for s in shards if s["status"] in UNDER_WAY]
    if not busy:
        console.print("no rebuild or drain under way", highlight=False)
        return False
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                        TextColumn("{task.fields[detail]}"), console=console,
                        auto_refresh=False)
    for shard in busy:
        for donor in shard["donors"]:
            total = max(donor["bytes_total"], donor["bytes"], 1)
            done = total if donor["done"] else min(donor["bytes"], total)
            detail = (f"{donor['records']:,} records, {donor['bytes'] / 2**20:,.1f} MiB"
                      + (" done" if donor["done"] else f", at log {donor['log_id']}"))
            kind = ("mini-rebuilding" if shard["status"] == "REBUILDING" and shard.get("mini")
                    else shard["status"].lower())
            progress.add_task(f"{kind} {shard['node_id']} <- "
                              f"{donor['node_id']}", total=total, completed=done,
                              detail=detail)
    progress.refresh()
    progress.stop()
    return True


def run(args: argparse.Namespace, urls: list[str]) -> int:
    if args.command == "rebuild":
        return _status(args, urls)
    return asyncio.run(_node(args))


def _status(args: argparse.Namespace, urls: list[str]) -> int:
    console = Console()
    while True:
        shards: list[dict[str, Any]] | None = None
        error: Exception | None = None
        for url in urls:
            try:
                shards = _shards(url)
                break
            except (OSError, ValueError, RuntimeError, urllib.error.URLError) as exc:
                error = exc
        if shards is None:
            print(f"seqlog: {error}", file=sys.stderr)
            return 1
        busy = _draw(shards, console)
        if not args.watch or not busy:
            return 0
        time.sleep(max(args.interval_ms, 100) / 1000)
        console.print()


async def _node(args: argparse.Namespace) -> int:
    url = args.epoch_store
    if args.dir is not None:
        recorded = lc.load_state(args.dir.resolve())
        if recorded is None:
            raise lc.LocalClusterError(f"no {lc.STATE_FILE} in {args.dir}")
        url = recorded.epoch_store
    store = open_cluster_state(url)
    try:
        status, state, _ = await store.read()
        if status is not Status.OK:
            print(f"seqlog: cluster state in {url}: {status.name}", file=sys.stderr)
            return 1
        shard = state.shard(args.node_id)
        if shard is None:
            print(f"seqlog: no storage shard {args.node_id!r} in the cluster state",
                  file=sys.stderr)
            return 1
        now_ms = time.time_ns() // 1_000_000
        if args.action == "drain":
            donors = tuple(s.node_id for s in state.shards
                           if s.node_id != args.node_id and s.status not in (
                               ShardStatus.REMOVED, ShardStatus.DRAINED))
            transition = cs.drain_started(args.node_id, donors, now_ms=now_ms,
                                          requested_by="seqlog node drain")
        else:
            if shard.status is not ShardStatus.DRAINED:
                print(f"seqlog: {args.node_id} is {shard.status.value}: only a DRAINED node "
                      "can be removed (seqlog node drain first, then wait for "
                      "seqlog rebuild status)", file=sys.stderr)
                return 1
            transition = cs.removed(args.node_id, now_ms)
        status, state = await cs.change(store, transition)
        if status is not Status.OK:
            print(f"seqlog: {status.name}", file=sys.stderr)
            return 1
        after = state.shard(args.node_id)
        print(f"{args.node_id}: {after.status.value if after else '?'}", flush=True)
        return 0
    finally:
        await store.close()
