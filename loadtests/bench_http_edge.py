"""Micro-benchmark of the HTTP edge alone: the real API app (``services.http_api``) over a
service that answers every append at once, driven by wrk (``loadtests/wrk_append.lua``).

It prints the server process's CPU per request, which is what the edge costs a sequencer node
on top of sequencing, for the lean edge (``services.http_edge``, what a node serves) and for
aiohttp alone (the edge before it), one after the other in the same run. Needs ``wrk`` on
PATH. Prints one JSON line per edge.

Run from the repo root:
``.venv/bin/python -m loadtests.bench_http_edge [--connections 256] [--edge lean|aiohttp|both]``.
``--auth both`` runs each edge without and with client authentication (docs/SECURITY.md: a
bearer token on every request, checked against a principal's grants), alternating, to
measure what authentication costs per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from frontend.outcomes import AppendOutcome
from services.http_api import create_api_app
from services.http_edge import EdgeRunner
from shared.config import ApiConfig, AuthConfig
from shared.security.auth import Authenticator
from shared.security.tokens import mint, new_key
from shared.status import Status
from shared.types import Lsn, NodeId

WRK_SCRIPT = Path(__file__).with_name("wrk_append.lua")


class _InstantService:
    """Answers every append OK with the next LSNs; nothing else is called by this bench."""

    node_id = NodeId("bench")
    cluster_name = "bench"

    def __init__(self) -> None:
        self._next_lsn = 1

    async def append(self, log_id: int, payloads: tuple[bytes, ...], key: str | None,
                     **_: object) -> AppendOutcome:
        return self._outcome(payloads)

    def append_nowait(self, log_id: int, payloads: tuple[bytes, ...], key: str | None, *,
                      done: Callable[[AppendOutcome], None], **_: object) -> None:
        done(self._outcome(payloads))

    def _outcome(self, payloads: tuple[bytes, ...]) -> AppendOutcome:
        first = self._next_lsn
        self._next_lsn += len(payloads)
        return AppendOutcome(status=Status.OK, first_lsn=Lsn(first),
                             last_lsn=Lsn(self._next_lsn - 1), timestamp_ms=1,
                             sequencer_node=self.node_id)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _authenticator(tmp: Path) -> tuple[Authenticator, str]:
    key = new_key()
    (tmp / "keys.txt").write_text(key + "\n")
    (tmp / "permissions.json").write_text(json.dumps(
        {"principals": {"bench": {"grants": ["append:1-1000", "read:*"]}}}))
    auth = Authenticator(AuthConfig(enabled=True, key_file=str(tmp / "keys.txt"),
                                    permissions_file=str(tmp / "permissions.json")))
    auth.load()
    return auth, mint(key.encode(), "bench", ttl_s=3600)


async def bench(args: argparse.Namespace, edge: str, secure: bool = False
                ) -> dict[str, object]:
    token = ""
    auth = None
    if secure:
        auth, token = _authenticator(Path(tempfile.mkdtemp(prefix="bench-auth-")))
    app = create_api_app(_InstantService(), ApiConfig(), CollectorRegistry(),  # type: ignore[arg-type]
                         auth=auth)
    runner_type = EdgeRunner if edge == "lean" else web.AppRunner
    runner = runner_type(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    env = dict(os.environ, SEQLOG_LOG="1", SEQLOG_SIZE=str(args.size),
               SEQLOG_BATCH=str(args.batch), SEQLOG_PIPELINE=str(args.pipeline),
               SEQLOG_TOKEN=token)
    try:
        cpu0_s, t0_s = _cpu_s(), time.perf_counter()
        wrk = await asyncio.create_subprocess_exec(
            "wrk", "-t1", f"-c{args.connections}", f"-d{args.duration_s}s", "-s",
            str(WRK_SCRIPT), f"http://127.0.0.1:{args.port}", env=env,
            stdout=asyncio.subprocess.PIPE)
        out, _ = await wrk.communicate()
        cpu_s, elapsed_s = _cpu_s() - cpu0_s, time.perf_counter() - t0_s
    finally:
        await runner.cleanup()
    lines = [line for line in out.decode().splitlines() if "requests in" in line]
    if wrk.returncode != 0 or not lines:
        raise SystemExit(json.dumps({"error": f"wrk failed: {out.decode()[-500:]}"}))
    requests = int(lines[0].split()[0])
    return {"bench": "seqlog_http_edge", "edge": edge, "auth": secure,
            "connections": args.connections,
            "size": args.size,
            "batch": args.batch, "pipeline": args.pipeline, "requests": requests,
            "requests_per_s": round(requests / elapsed_s),
            "server_cpu_us_per_request": round(cpu_s / max(requests, 1) * 1e6, 1),
            "server_cpu_util": round(cpu_s / elapsed_s, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--duration-s", type=int, default=8)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--port", type=int, default=17999)
    p.add_argument("--pipeline", type=int, default=1,
                   help="requests each wrk connection writes back to back")
    p.add_argument("--edge", choices=("lean", "aiohttp", "both"), default="both")
    p.add_argument("--auth", choices=("off", "on", "both"), default="off")
    p.add_argument("--rounds", type=int, default=1, help="repeat the runs (interleaved)")
    args = p.parse_args(argv)
    if shutil.which("wrk") is None:
        print(json.dumps({"error": "wrk is not installed (apt-get install wrk)"}))
        return 2
    import uvloop

    edges = ("aiohttp", "lean") if args.edge == "both" else (args.edge,)
    modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.auth]
    for _ in range(args.rounds):
        for edge in edges:
            for secure in modes:
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    print(json.dumps(runner.run(bench(args, edge, secure))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
