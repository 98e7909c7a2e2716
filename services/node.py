"""The node runner: ``python -m services.node --config FILE`` runs one Seqlog node process.

It refuses to run with ``-O`` (assertions are part of the safety design), serves the HTTP API
and the node-to-node transport, and on SIGTERM or SIGINT drains its sequencers, stops serving
and closes its stores before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import signal
import sys

from aiohttp import web

from services.app import MEMBERSHIP_KEY, create_app
from shared.config import ProcessConfig, process_from_dict

HTTP_SHUTDOWN_TIMEOUT_S = 10.0
GC_GEN0_THRESHOLD = 50_000
"""Every append allocates many short-lived objects; collecting generation 0 every 700
allocations (the default) costs several percent of a node's CPU under load for nothing, since
the hot path creates no reference cycles."""


def load_config(path: str) -> ProcessConfig:
    with open(path, encoding="utf-8") as f:
        return process_from_dict(json.load(f))


async def serve(config: ProcessConfig, config_path: str | None = None) -> None:
    app = create_app(config)
    runner = web.AppRunner(app, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S, access_log=None,
                           handle_signals=False)
    await runner.setup()
    # Long-lived start-up objects never need scanning again.
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    me = config.me
    site = web.TCPSite(runner, me.host, me.http_port, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if config_path is not None:
        # Membership changes (added nodes, weights) apply without a restart.
        loop.add_signal_handler(signal.SIGHUP, app[MEMBERSHIP_KEY].reload, config_path)
    try:
        await stop.wait()
    finally:
        logging.getLogger(__name__).info("node %s shutting down", config.node_id)
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    if sys.flags.optimize:
        raise SystemExit("refusing to run with -O: assertions are part of Seqlog's safety design")
    parser = argparse.ArgumentParser(prog="seqlog-node", description=__doc__)
    parser.add_argument("--config", required=True, help="the node's JSON config file")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except (OSError, ValueError, TypeError) as exc:
        print(f"bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(config, args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
