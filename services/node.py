"""The node runner: ``python -m services.node --config FILE`` runs one Seqlog node process;
``python -m services.node --from-env`` runs the same node configured from ``SEQLOG_*``
environment variables (``services.env_config``; how a Kubernetes pod starts it).

It refuses to run with ``-O`` (assertions are part of the safety design), serves the HTTP API
and the node-to-node transport, and on SIGTERM or SIGINT shuts down gracefully within a bound
(``--shutdown-timeout-ms``, or ``SEQLOG_SHUTDOWN_TIMEOUT_MS`` with ``--from-env``): it stops
taking requests and lets in-flight ones finish, tells its gossip peers that it is going away,
drains its sequencers (in-flight appends finish, drained epochs are marked clean) and closes
its stores. A shutdown
that overruns the bound is cut short and the process exits with status 1, so that it never
outlives a pod's ``terminationGracePeriodSeconds`` into a SIGKILL.
SIGHUP re-reads the config file and applies membership changes (services.membership), and
re-reads the TLS certificates and cluster secrets (docs/SECURITY.md), also when configured from
the environment.
``--log-format json`` (or ``SEQLOG_LOG_FORMAT=json``) writes JSON lines (services.log_format).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys

from aiohttp import web

from services.app import (
    AUTH_KEY,
    DRAIN_TIMEOUT_S,
    MEMBERSHIP_KEY,
    SECURITY_KEY,
    create_app,
    create_runner,
)
from services.env_config import DEFAULT_SHUTDOWN_TIMEOUT_MS, EnvConfigError, config_from_env
from services.log_format import LOG_FORMATS
from services.log_format import configure as configure_logging
from services.membership import Membership
from services.node_security import SecurityConfigError, node_security
from shared import malloc_tuning
from shared.config import ProcessConfig, process_from_dict

HTTP_SHUTDOWN_TIMEOUT_S = 10.0
EVENT_LOOP_ENV = "SEQLOG_EVENT_LOOP"
"""``asyncio``: run on asyncio's own event loop instead of uvloop (benchmarks)."""
SHUTDOWN_SHARE_HTTP = 0.2
SHUTDOWN_SHARE_DRAIN = 0.25
"""Shares of the shutdown bound for in-flight HTTP requests (long-poll reads, appends) and for
the sequencers' drain. aiohttp may spend its shutdown timeout twice (waiting for a handler,
then cancelling it and waiting again), so HTTP can take 40 %; the rest of the bound is for
marking epochs clean and closing. A shutdown that still overruns is cut short."""
GC_GEN0_THRESHOLD = 50_000
"""Every append allocates many short-lived objects; collecting generation 0 every 700
allocations (the default) costs several percent of a node's CPU under load for nothing, since
the hot path creates no reference cycles."""

log = logging.getLogger(__name__)


def load_config(path: str) -> ProcessConfig:
    with open(path, encoding="utf-8") as f:
        return process_from_dict(json.load(f))


async def serve(config: ProcessConfig, *, listen_host: str | None = None,
                shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS,
                config_path: str | None = None) -> int:
    """Run the node until SIGTERM/SIGINT; returns the exit status (1: shutdown overran).
    SIGHUP re-reads ``config_path`` for membership changes (services.membership)."""
    bound_s = shutdown_timeout_ms / 1000
    app = create_app(config, listen_host=listen_host,
                     drain_timeout_s=min(DRAIN_TIMEOUT_S, bound_s * SHUTDOWN_SHARE_DRAIN))
    security = app[SECURITY_KEY]
    runner = create_runner(
        app, shutdown_timeout=min(HTTP_SHUTDOWN_TIMEOUT_S, bound_s * SHUTDOWN_SHARE_HTTP),
        access_log=None, handle_signals=False)
    await runner.setup()
    # Long-lived start-up objects never need scanning again.
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    me = config.me
    site = web.TCPSite(runner, listen_host or me.host, me.http_port, reuse_address=True,
                       ssl_context=None if security.tls is None else security.tls.http_listener)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if config_path is not None:
        # Membership changes (added nodes, weights) apply without a restart; the file is read
        # off the loop (aiofiles), one reload at a time.
        reloads = ConfigReloads(app[MEMBERSHIP_KEY], config_path)
        auth = app[AUTH_KEY]

        def on_sighup() -> None:
            reloads.request()
            security.reload()
            # Credentials too (docs/SECURITY.md); they are also re-read when they change.
            auth.request_reload()

        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    else:
        # Configured from the environment: only certificates, secrets and credentials to
        # re-read, and SIGHUP must not kill.
        auth = app[AUTH_KEY]

        def on_sighup_env() -> None:
            log.warning("SIGHUP: a node configured from the environment changes membership "
                        "by a restart; re-reading certificates, secrets and credentials only")
            security.reload()
            auth.request_reload()

        loop.add_signal_handler(signal.SIGHUP, on_sighup_env)
    status = 1
    try:
        await site.start()
        await stop.wait()
    finally:
        status = await _shutdown(runner, config, shutdown_timeout_ms)
    return status


class ConfigReloads:
    """SIGHUP's reloads of the config file: run as a task (the read is aiofiles'), one at a
    time; a SIGHUP during a reload asks for one more after it, so the last change is read."""

    def __init__(self, membership: Membership, path: str) -> None:
        self.membership = membership
        self.path = path
        self.task: asyncio.Task[None] | None = None
        self.again = False

    def request(self) -> None:
        if self.task is not None and not self.task.done():
            self.again = True
            return
        self.again = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self.membership.reload_async(self.path)
            if not self.again:
                return
            self.again = False


async def _shutdown(runner: web.AppRunner, config: ProcessConfig, timeout_ms: int) -> int:
    log.info("node %s shutting down (at most %d ms)", config.node_id, timeout_ms)
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            await runner.cleanup()
    except TimeoutError:
        log.error("node %s: graceful shutdown overran %d ms; exiting without finishing it",
                  config.node_id, timeout_ms)
        return 1
    log.info("node %s stopped in %d ms", config.node_id, (loop.time() - started_s) * 1000)
    return 0


def main(argv: list[str] | None = None) -> int:
    if sys.flags.optimize:
        raise SystemExit("refusing to run with -O: assertions are part of Seqlog's safety design")
    parser = argparse.ArgumentParser(prog="seqlog-node", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="the node's JSON config file")
    source.add_argument("--from-env", action="store_true",
                        help="configure the node from SEQLOG_* environment variables")
    parser.add_argument("--shutdown-timeout-ms", type=int, default=None,
                        help="bound on the graceful shutdown (default "
                             f"{DEFAULT_SHUTDOWN_TIMEOUT_MS}; with --from-env, "
                             "SEQLOG_SHUTDOWN_TIMEOUT_MS)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=LOG_FORMATS,
                        default=os.environ.get("SEQLOG_LOG_FORMAT") or "text",
                        help="text, or json: one JSON object per line with node_id, log_id, "
                             "epoch and lsn as fields (default: SEQLOG_LOG_FORMAT, else text)")
    args = parser.parse_args(argv)
    if args.log_format not in LOG_FORMATS:
        print(f"SEQLOG_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}", file=sys.stderr)
        return 2
    listen_host: str | None = None
    shutdown_timeout_ms = DEFAULT_SHUTDOWN_TIMEOUT_MS
    if args.from_env:
        try:
            env_config = config_from_env(os.environ)
        except EnvConfigError as exc:
            print(f"bad environment: {exc}", file=sys.stderr)
            return 2
        config = env_config.config
        listen_host = env_config.listen_host
        shutdown_timeout_ms = env_config.shutdown_timeout_ms
    else:
        try:
            config = load_config(args.config)
        except (OSError, ValueError, TypeError) as exc:
            print(f"bad config {args.config}: {exc}", file=sys.stderr)
            return 2
    configure_logging(args.log_format, args.log_level, config.node_id)
    try:
        node_security(config.tls)  # unreadable certificates or secrets: refuse to start
    except SecurityConfigError as exc:
        print(f"bad tls settings: {exc}", file=sys.stderr)
        return 2
    if args.shutdown_timeout_ms is not None:
        if not 1_000 <= args.shutdown_timeout_ms <= 600_000:
            print("--shutdown-timeout-ms must be in [1000, 600000]", file=sys.stderr)
            return 2
        shutdown_timeout_ms = args.shutdown_timeout_ms
    # Batches are big allocations: keep their buffers in the heap (shared/malloc_tuning.py).
    malloc_tuning.tune()
    if os.environ.get(EVENT_LOOP_ENV, "uvloop") != "asyncio":
        # asyncio's own loop only when asked (loadtests.bench_tls compares their TLS).
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
    return asyncio.run(serve(config, listen_host=listen_host,
                             shutdown_timeout_ms=shutdown_timeout_ms,
                             config_path=None if args.from_env else args.config))


if __name__ == "__main__":
    sys.exit(main())
