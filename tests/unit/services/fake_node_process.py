"""Stand-in for ``python -m services.node`` in launcher tests: serves ``/readyz`` on the
node's HTTP port until SIGTERM; exits at once with a message if ``FAKE_NODE_FAIL`` names it,
and ignores SIGTERM if ``FAKE_NODE_STUBBORN`` names it."""

from __future__ import annotations

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    with open(sys.argv[sys.argv.index("--config") + 1]) as f:
        config = json.load(f)
    me = next(n for n in config["cluster"]["nodes"] if n["node_id"] == config["node_id"])
    print(f"fake node {me['node_id']} starting", flush=True)
    if os.environ.get("FAKE_NODE_FAIL") == me["node_id"]:
        print("boom: cannot start", flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_NODE_STUBBORN") == me["node_id"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    HTTPServer((me["host"], me["http_port"]), Handler).serve_forever()


if __name__ == "__main__":
    main()
