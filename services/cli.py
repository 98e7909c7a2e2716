"""The ``seqlog`` command: local cluster control plus append/read/tail/demo through the client,
``status`` (the cluster's nodes with their gossip states, as a table), ``top`` (the busiest
logs, live; ``services.cli_top``), ``epochs``, which reads a log's epoch metadata straight from
the epoch store, and ``completion``, which prints a shell completion script (shtab).

Output: ``read`` prints ``--format text|json|raw`` (``services.cli_output``); long operations
(``append`` from stdin) show a progress bar on stderr when it is a terminal (rich). A closed
pipe (``seqlog read 7 | head``) ends the command quietly, as does Ctrl-C: no traceback.

Exit codes: 0 success, 1 the operation failed (a ``LogError``, a launcher error or a demo
mismatch), 2 bad usage (argparse), 130 interrupted, 141 the reader of stdout went away.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TextIO

import shtab
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from epoch_store import read_log_state
from seqlog import Client, LogError
from seqlog.demo import run_demo
from seqlog.results import ClusterInfo
from services import cli_rebuild, cli_top, ingest_cli, token_cli
from services import local_cluster as lc
from services.cli_output import FORMATS, EntryWriter, iso_time, text_line
from services.local_membership import add_node
from shared.config import FSYNC_MODES, AuthConfig
from shared.http_contract import TOKEN_ENV
from shared.status import Status
from shared.types import LOG_ID_MAX, LOG_ID_MIN, LogId, format_lsn, parse_lsn

DEFAULT_URL = f"http://127.0.0.1:{lc.DEFAULT_BASE_PORT}"
_BATCH_RECORDS_MAX = 1000
"""Payloads per append-batch request when ``append --batch`` reads many lines."""
_LINES_READ_MAX = 1000
"""Lines of stdin read at a time (in a thread, off the event loop) by ``append``."""
NOT_WRITTEN_POLL_S = 0.5
"""How often ``read --follow --direct`` asks again for a log that has never been written."""
TOP_PIPE_WIDTH = 160
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a command killed by writing to a closed pipe."""


def _log_id(text: str) -> int:
    if not text.isdigit() or not LOG_ID_MIN <= int(text) <= LOG_ID_MAX:
        raise argparse.ArgumentTypeError(f"log id must be an integer in 1..2**62-1: {text!r}")
    return int(text)


def _lsn(text: str) -> int:
    lsn = parse_lsn(text)
    if lsn is None:
        raise argparse.ArgumentTypeError(f"not an LSN (decimal or e5n8): {text!r}")
    return lsn


def _time_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (ISO 8601 or milliseconds since the epoch): {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as a user at a terminal means it
    return int(moment.timestamp() * 1000)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a non-negative integer: {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer: {text!r}")
    return int(text)


def _add_progress(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", action="store_true", default=None,
                       help="show a progress bar on stderr even when it is not a terminal")
    group.add_argument("--no-progress", action="store_false", dest="progress",
                       help="never show a progress bar")


def _add_target(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--url", action="append", help="node URL (repeatable or comma-separated)")
    group.add_argument("--dir", type=Path, help="local cluster directory (reads cluster.json)")
    parser.add_argument("--ca", default=None,
                        help="CA file to verify the nodes' TLS certificates with (https and "
                             "the binary protocol; default: SEQLOG_CA, or the CA of a secure "
                             "--dir cluster)")
    parser.add_argument("--token", default=None,
                        help=f"bearer token (default: {TOKEN_ENV}, else the admin token of a "
                             "local cluster's --dir when it has one)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqlog", description="Seqlog replicated log")
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="run a cluster of local processes")
    actions = local.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start a local cluster")
    up.add_argument("--dir", type=Path, required=True)
    up.add_argument("--storage-nodes", type=_positive, default=3)
    up.add_argument("--sequencers", type=_positive, default=2)
    up.add_argument("--replication", type=_positive, default=3)
    up.add_argument("--base-port", type=_positive, default=lc.DEFAULT_BASE_PORT)
    up.add_argument("--epoch-store", default="file",
                    help="file, or zk://host:port[,host:port...]/root of a running ZooKeeper")
    up.add_argument("--with-zookeeper", action="store_true",
                    help="start a local ZooKeeper server (data in DIR/zookeeper) and use it")
    up.add_argument("--fsync", choices=FSYNC_MODES, default="always")
    up.add_argument("--auth", action="store_true",
                    help="require bearer tokens: a signing key, a permissions file and an "
                         "admin token are made in DIR/auth (docs/SECURITY.md)")
    up.add_argument("--log-backlog-ms", type=_non_negative, default=0,
                    help="retention of every log: storage nodes trim and delete records older "
                         "than this (0: keep forever)")
    up.add_argument("--ready-timeout-ms", type=_positive, default=30_000)
    up.add_argument("--secure", action="store_true",
                    help="generate a CA, node certificates and a cluster secret in DIR/secure "
                         "and turn on TLS and node authentication everywhere "
                         "(docs/SECURITY.md)")
    down = actions.add_parser("down", help="stop a local cluster")
    down.add_argument("--dir", type=Path, required=True)
    restart = actions.add_parser("restart", help="restart one node on its data")
    restart.add_argument("--dir", type=Path, required=True)
    restart.add_argument("node_id")
    status = actions.add_parser("status", help="show the nodes of a local cluster")
    status.add_argument("--dir", type=Path, required=True)
    add_node = actions.add_parser(
        "add-node", help="start a new node and add it to every running node's membership "
                         "(no restarts; new logs use a new storage node)")
    add_node.add_argument("--dir", type=Path, required=True)
    add_node.add_argument("--role", choices=("storage", "sequencer"), default="storage")

    append = commands.add_parser("append", help="append payloads (arguments or stdin lines)")
    append.add_argument("log_id", type=_log_id, metavar="LOG")
    append.add_argument("--batch", action="store_true", help="one atomic append-batch")
    append.add_argument("--key")
    append.add_argument("payloads", nargs="*", metavar="PAYLOAD")
    _add_progress(append)
    _add_target(append)

    read = commands.add_parser("read", help="print records and gaps")
    read.add_argument("log_id", type=_log_id, metavar="LOG")
    start = read.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_lsn", type=_lsn, default=1)
    start.add_argument("--since", type=_time_ms, metavar="TIME",
                       help="start at the first record at or after TIME (ISO 8601, e.g. "
                            "2026-11-22T10:00:00+00:00, or milliseconds since the epoch)")
    read.add_argument("--limit", type=_positive, default=1000, help="records per request")
    read.add_argument("--follow", action="store_true", help="keep waiting for new records")
    read.add_argument("--direct", action="store_true",
                      help="read the storage nodes directly (Client.reader) instead of "
                           "through a node's HTTP API")
    read.add_argument("--format", choices=FORMATS, default="text", dest="output_format",
                      help="text: a header and one tab-separated line per record or gap "
                           "(ISO 8601 UTC times, escaped payloads); json: one JSON object "
                           "per line; raw: payload bytes only, one per line")
    _add_target(read)

    tail = commands.add_parser("tail", help="show a log's release point and sequencer")
    tail.add_argument("log_id", type=_log_id, metavar="LOG")
    _add_target(tail)

    trim = commands.add_parser("trim", help="make records at or below LSN unreadable")
    trim.add_argument("log_id", type=_log_id, metavar="LOG")
    trim.add_argument("lsn", type=_lsn, metavar="LSN", help="e5n8 or an integer")
    _add_target(trim)

    cluster = commands.add_parser("cluster", help="show the cluster's nodes")
    _add_target(cluster)

    status = commands.add_parser(
        "status", help="table of the cluster's nodes: gossip state, roles, weights")
    _add_target(status)

    epochs = commands.add_parser("epochs", help="show a log's epoch metadata and last clean "
                                 "epoch, read from the epoch store")
    epochs.add_argument("log_id", type=_log_id, metavar="LOG")
    source = epochs.add_mutually_exclusive_group(required=True)
    source.add_argument("--dir", type=Path, help="local cluster directory (reads cluster.json)")
    source.add_argument("--epoch-store", help="file:///dir or zk://host:port[,...]/root")

    top = commands.add_parser("top", help="live view of the busiest logs (append rate, "
                              "release point, appends in flight)")
    top.add_argument("--interval-ms", type=_positive, default=2000)
    top.add_argument("--rows", type=_positive, default=20, help="logs shown")
    top.add_argument("--iterations", type=_positive,
                     help="stop after this many looks (default: until Ctrl-C)")
    _add_target(top)

    completion = commands.add_parser(
        "completion", help="print a shell completion script",
        description="bash: eval \"$(seqlog completion bash)\" (or save it under "
                    "/etc/bash_completion.d/seqlog); zsh: seqlog completion zsh > "
                    "\"${fpath[1]}/_seqlog\"")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))

    cli_rebuild.add_parsers(commands, _add_target)

    demo = commands.add_parser("demo", help="write, read back and check a small workload")
    _add_target(demo)
    demo.add_argument("--logs", type=_positive, default=3)
    demo.add_argument("--seed", type=int)
    ingest_cli.add_parser(commands)
    token_cli.add_parser(commands)
    return parser


def target_urls(args: argparse.Namespace) -> list[str]:
    if getattr(args, "dir", None) is not None:
        state = lc.load_state(args.dir.resolve())
        if state is None:
            raise lc.LocalClusterError(f"no {lc.STATE_FILE} in {args.dir}")
        return state.sequencer_urls
    if getattr(args, "url", None):
        return [u for item in args.url for u in item.split(",") if u.strip()]
    return [os.environ.get("SEQLOG_URL", DEFAULT_URL)]


def target_ca(args: argparse.Namespace) -> str | None:
    """The CA to verify nodes with: ``--ca``, else SEQLOG_CA, else a secure ``--dir``'s."""
    ca = getattr(args, "ca", None) or os.environ.get("SEQLOG_CA") or None
    if ca is None and getattr(args, "dir", None) is not None:
        state = lc.load_state(args.dir.resolve())
        ca = state.ca_file or None if state is not None else None
    return ca


def _print(*parts: object) -> None:
    print(*parts, flush=True)


format_entry = text_line
"""One line of ``read --format text``."""


class _Lines:
    """stdin's lines, read by a daemon thread in chunks of up to ``chunk_lines`` and handed
    to the loop through a bounded queue: a big file or a slow producer never blocks the event
    loop, and Ctrl-C is not held up by a thread blocked in ``readline`` (a daemon thread is
    not joined at exit, as an executor's would be)."""

    CHUNKS_QUEUED_MAX = 4

    def __init__(self, stream: TextIO, chunk_lines: int) -> None:
        self.stream = stream
        self.chunk_lines = chunk_lines
        self.queue: asyncio.Queue[list[str]] = asyncio.Queue(self.CHUNKS_QUEUED_MAX)
        self.loop = asyncio.get_running_loop()
        threading.Thread(target=self._run, name="stdin", daemon=True).start()

    def _run(self) -> None:
        while True:
            chunk = []
            try:
                for _ in range(self.chunk_lines):
                    line = self.stream.readline()
                    if not line:
                        break
                    chunk.append(line)
            except (OSError, ValueError):
                pass
            asyncio.run_coroutine_threadsafe(self.queue.put(chunk), self.loop).result()
            if len(chunk) < self.chunk_lines:
                if chunk:
                    asyncio.run_coroutine_threadsafe(self.queue.put([]), self.loop).result()
                return

    async def chunk(self) -> list[str]:
        """The next lines; empty at the end of stdin."""
        return await self.queue.get()


def _progress(args: argparse.Namespace, description: str) -> Progress:
    """A progress bar on stderr: shown when stderr is a terminal, or always with
    ``--progress``; never with ``--no-progress``."""
    forced = getattr(args, "progress", None)
    console = Console(stderr=True, force_terminal=True if forced else None)
    disable = forced is False or (forced is None and not console.is_terminal)
    return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(),
                    TextColumn("records"), TaskProgressColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[rate]}"), console=console, disable=disable,
                    transient=False,
                    # Printed results go above the bar when both share a terminal, and stay
                    # on stdout when it is a pipe or a file.
                    redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)


async def _append(client: Client, args: argparse.Namespace, payloads: list[bytes]) -> int:
    if args.batch:
        for start in range(0, len(payloads), _BATCH_RECORDS_MAX):
            chunk = payloads[start : start + _BATCH_RECORDS_MAX]
            await _append_batch(client, args, chunk)
        return 0
    for payload in payloads:
        await _append_one(client, args, payload)
    return 0


async def _append_batch(client: Client, args: argparse.Namespace, chunk: list[bytes]) -> None:
    result = await client.append_batch(args.log_id, chunk, key=args.key)
    first, last = format_lsn(result.first_lsn), format_lsn(result.last_lsn)
    _print(f"{first}..{last}\t{result.first_lsn}..{result.last_lsn}\t{result.count}")


async def _append_one(client: Client, args: argparse.Namespace, payload: bytes) -> None:
    single = await client.append(args.log_id, payload, key=args.key)
    _print(f"{format_lsn(single.lsn)}\t{single.lsn}\t{iso_time(single.timestamp_ms)}")


async def _append_stdin(client: Client, args: argparse.Namespace) -> int:
    """``append`` of stdin's lines as they are read, with a progress bar: by bytes of a
    regular file, by records otherwise."""
    lines = _Lines(sys.stdin, _LINES_READ_MAX if args.batch else 1)
    started_s = time.monotonic()
    records = 0
    with _progress(args, f"log {args.log_id}") as progress:
        task = progress.add_task("append", total=None, rate="")
        while True:
            chunk = await lines.chunk()
            if not chunk:
                break
            payloads = [line.rstrip("\n").encode() for line in chunk]
            if args.batch:
                await _append_batch(client, args, payloads)
            else:
                await _append_one(client, args, payloads[0])
            records += len(payloads)
            elapsed_s = max(time.monotonic() - started_s, 1e-6)
            progress.update(task, completed=records, rate=f"{records / elapsed_s:,.0f}/s")
        progress.update(task, total=records, completed=records)
    return 0


async def _read(client: Client, args: argparse.Namespace) -> int:
    writer = EntryWriter(sys.stdout.buffer, args.output_format)
    if args.since is not None:
        args.from_lsn = await client.find_time(args.log_id, args.since)
    if args.direct:
        await _read_direct(client, args, writer)
        writer.finish()
        return 0
    if args.follow:
        async for entry in client.follow(args.log_id, args.from_lsn, limit=args.limit):
            writer.write([entry])
        return 0
    next_lsn = args.from_lsn
    while True:
        result = await client.read(args.log_id, next_lsn, limit=args.limit)
        writer.write(list(result.entries()))
        if result.next_lsn <= next_lsn or result.next_lsn > result.release_lsn:
            writer.finish()
            return 0
        next_lsn = result.next_lsn


async def _read_direct(client: Client, args: argparse.Namespace, writer: EntryWriter) -> None:
    while True:
        try:
            reader = await client.reader(args.log_id, args.from_lsn, follow=args.follow)
        except LogError as exc:
            # A follower started before the log's first append waits for it.
            if not args.follow or exc.status is not Status.NOTFOUND:
                raise
            await asyncio.sleep(NOT_WRITTEN_POLL_S)
            continue
        async with reader:
            async for item in reader:
                writer.write([item])
        return


async def _tail(client: Client, args: argparse.Namespace) -> int:
    tail = await client.tail(args.log_id)
    _print(
        f"release_lsn {format_lsn(tail.release_lsn)} ({tail.release_lsn})  "
        f"trim_lsn {format_lsn(tail.trim_lsn)} ({tail.trim_lsn})  "
        f"epoch {tail.epoch}  sequencer {tail.sequencer}"
    )
    return 0


async def _trim(client: Client, args: argparse.Namespace) -> int:
    trim_lsn = await client.trim(args.log_id, args.lsn)
    _print(f"trim_lsn {format_lsn(trim_lsn)} ({trim_lsn})")
    return 0


async def _cluster(client: Client, args: argparse.Namespace) -> int:
    info = await client.cluster()
    _print(f"cluster {info.cluster}")
    for n in info.nodes:
        _print(f"{n.node_id}\t{','.join(n.roles)}\t{n.http}\t{n.state}")
    return 0


def format_cluster_table(info: ClusterInfo, observer: str) -> str:
    """``seqlog status``: one row per node, states as the answering node's failure detector
    sees them."""
    rows = [("NODE", "STATE", "ROLES", "HTTP", "SEQUENCER_WEIGHT", "STORAGE_CAPACITY")]
    rows += [(n.node_id, n.state, ",".join(n.roles), n.http, f"{n.sequencer_weight:g}",
              f"{n.storage_capacity:g}") for n in info.nodes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    counts = {state: sum(1 for n in info.nodes if n.state == state)
              for state in ("ALIVE", "SUSPECT", "DEAD")}
    summary = ", ".join(f"{count} {state}" for state, count in counts.items())
    return "\n".join([f"cluster {info.cluster} as seen by {observer}: {summary}", *lines])


async def _status(client: Client, args: argparse.Namespace) -> int:
    info = await client.cluster()
    _print(format_cluster_table(info, client.urls[0]))
    return 0


def _top_console() -> Console:
    """A terminal's width on a terminal; wide enough for every column in a pipe or file
    (rich would assume 80)."""
    console = Console()
    return console if console.is_terminal else Console(width=TOP_PIPE_WIDTH)


async def _top(client: Client, args: argparse.Namespace) -> int:
    return await cli_top.run_top(client, interval_ms=args.interval_ms,
                                 iterations=args.iterations, rows_max=args.rows,
                                 console=_top_console())


async def _demo(client: Client, args: argparse.Namespace) -> int:
    report = await run_demo(client, logs_count=args.logs, seed=args.seed)
    _print(f"demo: wrote to {len(report.log_ids)} fresh logs with random ids, so that runs "
           "never share a log: " + ", ".join(str(i) for i in report.log_ids))
    _print(
        f"demo: logs {report.log_ids}: appended {report.records_appended} records "
        f"({report.batches_appended} batches), read back {report.records_read} records and "
        f"{report.gaps_read} gaps in {report.elapsed_ms} ms"
    )
    for problem in report.problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    _print("demo: OK" if report.ok else f"demo: FAILED ({len(report.problems)} problems)")
    return 0 if report.ok else 1


Handler = Callable[[Client, argparse.Namespace], Coroutine[Any, Any, int]]


def target_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``SEQLOG_TOKEN``, else a local cluster's admin token."""
    token: str | None = getattr(args, "token", None) or os.environ.get(TOKEN_ENV)
    if token is None and getattr(args, "dir", None) is not None:
        token = token_cli.local_admin_token(args.dir)
    return token


async def _with_client(urls: list[str], handler: Handler, args: argparse.Namespace) -> int:
    async with Client(urls, ca=target_ca(args), token=target_token(args)) as client:
        return await handler(client, args)


def _local(args: argparse.Namespace) -> int:
    if args.action == "up":
        spec = lc.LocalClusterSpec(
            dir=args.dir, storage_nodes=args.storage_nodes, sequencers=args.sequencers,
            replication=args.replication, base_port=args.base_port,
            epoch_store=args.epoch_store, fsync=args.fsync, with_zookeeper=args.with_zookeeper,
            log_backlog_ms=args.log_backlog_ms, secure=args.secure,
            # --secure (TLS, docs/SECURITY.md) implies client authentication too.
            auth=(token_cli.write_local_auth(args.dir.resolve())
                  if args.auth or args.secure else AuthConfig()),
        )
        started_s = time.monotonic()
        state = lc.up(spec, ready_timeout_ms=args.ready_timeout_ms)
        _print(lc.format_table(state, args.dir.resolve()))
        _print(f"ready in {int((time.monotonic() - started_s) * 1000)} ms; "
               f"state in {args.dir.resolve() / lc.STATE_FILE}")
    elif args.action == "down":
        stopped = lc.down(args.dir)
        _print(f"stopped {', '.join(stopped) if stopped else 'nothing (no node was running)'}")
    elif args.action == "restart":
        node = lc.restart(args.dir, args.node_id)
        _print(f"restarted {node.node_id} as pid {node.pid}")
    elif args.action == "add-node":
        node = add_node(args.dir, args.role)
        _print(f"added {node.node_id} ({args.role}) at http://{node.http}, pid {node.pid}")
    else:
        recorded = lc.load_state(args.dir.resolve())
        if recorded is None:
            raise lc.LocalClusterError(f"no {lc.STATE_FILE} in {args.dir}")
        _print(lc.format_table(recorded, args.dir.resolve()))
    return 0


def _epochs(args: argparse.Namespace) -> int:
    url = args.epoch_store
    if args.dir is not None:
        recorded = lc.load_state(args.dir.resolve())
        if recorded is None:
            raise lc.LocalClusterError(f"no {lc.STATE_FILE} in {args.dir}")
        url = recorded.epoch_store
    try:
        state = read_log_state(url, LogId(args.log_id))
    except ValueError as exc:
        raise lc.LocalClusterError(str(exc)) from None
    meta, lce = state.metadata, state.last_clean_epoch
    if state.status != Status.OK or meta is None:
        print(f"seqlog: log {args.log_id} in {url}: {state.status.name} "
              f"({state.status.description})", file=sys.stderr)
        return 1
    _print(f"log {meta.log_id} in {url}")
    _print(f"next_epoch {meta.next_epoch} (last epoch handed out: {meta.next_epoch - 1})")
    _print(f"last_writer {meta.last_writer or '-'}")
    _print(f"nodeset {','.join(meta.nodeset)}  replication {meta.replication_factor}")
    _print(f"version {meta.version}")
    if lce is not None:
        _print(f"last_clean_epoch {lce.epoch}  tail_lsn {format_lsn(lce.tail_lsn)} "
               f"({lce.tail_lsn})  version {lce.version}")
    return 0


_HANDLERS: dict[str, Handler] = {
    "read": _read, "tail": _tail, "trim": _trim, "cluster": _cluster, "status": _status,
    "demo": _demo, "top": _top,
}


def _read_payloads(args: argparse.Namespace) -> list[bytes]:
    return [p.encode() for p in args.payloads]


def run(args: argparse.Namespace) -> int:
    if args.command == "local":
        return _local(args)
    if args.command == "epochs":
        return _epochs(args)
    if args.command == "ingest":
        return ingest_cli.run(args, DEFAULT_URL)
    if args.command == "token":
        return token_cli.run(args)
    if args.command == "completion":
        sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
        return 0
    if args.command == "node":
        return cli_rebuild.run(args, [])
    urls = target_urls(args)
    if args.command == "rebuild":
        return cli_rebuild.run(args, urls)
    if args.command == "append":
        if not args.payloads:
            return asyncio.run(_with_client(urls, _append_stdin, args))
        payloads = _read_payloads(args)

        async def handler(client: Client, ns: argparse.Namespace) -> int:
            return await _append(client, ns, payloads)

        return asyncio.run(_with_client(urls, handler, args))
    return asyncio.run(_with_client(urls, _HANDLERS[args.command], args))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse gives the payloads of `append LOG --dir D a b` nothing after the option, so
    # positionals that follow options are collected here.
    if extra and args.command == "append":
        cut = extra.index("--") if "--" in extra else len(extra)
        before, after = extra[:cut], extra[cut + 1 :]
        if not any(e.startswith("-") for e in before):
            args.payloads, extra = [*args.payloads, *before, *after], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _stdout_gone() -> None:
    """stdout's reader went away: point stdout at /dev/null so that the interpreter's final
    flush does not report the broken pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(argv)
        return run(args)
    except LogError as exc:
        print(f"seqlog: {exc}", file=sys.stderr)
        return 1
    except lc.LocalClusterError as exc:
        print(f"seqlog: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        _stdout_gone()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("seqlog: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
