"""A TCP proxy for fault injection: one listener per directed node-to-node link (src -> dst),
each forwarding to dst's data port, with a mode that can change at any time:

- ``pass``: forward both ways.
- ``delay``: forward both ways, every chunk ``delay_ms`` late (order kept), so a request/reply
  round trip takes ``2 * delay_ms`` more.
- ``drop``: abort every open connection (both sides see a reset) and abort new ones as soon
  as they are accepted: a peer that is down or refuses.
- ``blackhole``: accept and read, forward nothing, in either direction: packets vanish and
  the peers only learn it from their timeouts. A connection that lost bytes this way is
  aborted when the link leaves ``blackhole``, since TCP never delivers a stream with a hole
  in it; connections accepted during it are aborted too.

Node ``src`` reaches ``dst`` through the link's listener because its
``transport.peer_addresses`` names the listener instead of dst's data port. The node-to-node
transport answers on the connection that carried the request, so the link ``src>dst`` carries
src's requests and dst's replies; cutting both ``a>b`` and ``b>a`` partitions a from b.

Every buffer is bounded: a direction of a connection holds at most
``DIRECTION_QUEUE_CHUNKS_MAX`` chunks of at most ``CHUNK_BYTES_MAX`` bytes; a full queue
stops reading, so TCP's flow control pushes back on the sender.

``python -m tests.chaos.proxy`` runs the proxy as its own process (so that its event loop is
not slowed by the test harness), driven by JSON lines on stdin (see ``serve_stdio``). It exits
when stdin closes, so it never outlives the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["pass", "delay", "drop", "blackhole"]
MODES: tuple[Mode, ...] = ("pass", "delay", "drop", "blackhole")
CHUNK_BYTES_MAX = 64 * 1024
DIRECTION_QUEUE_CHUNKS_MAX = 64
"""Chunks one direction of one connection may hold (delay mode holds them for delay_ms)."""
CONNECT_TIMEOUT_S = 2.0
DELAY_MS_MAX = 60_000
LISTEN_BACKLOG = 64
CONTROL_LINE_BYTES_MAX = 1 << 20


@dataclass(frozen=True, slots=True)
class LinkMode:
    kind: Mode = "pass"
    delay_ms: int = 0

    def __post_init__(self) -> None:
        if self.kind not in MODES:
            raise ValueError(f"unknown link mode {self.kind!r}; known: {MODES}")
        if not 0 <= self.delay_ms <= DELAY_MS_MAX:
            raise ValueError(f"delay_ms={self.delay_ms} is outside [0, {DELAY_MS_MAX}]")


PASS = LinkMode()


@dataclass(slots=True)
class LinkStats:
    connections_accepted: int = 0
    connections_aborted: int = 0
    bytes_forwarded: int = 0
    bytes_blackholed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"connections_accepted": self.connections_accepted,
                "connections_aborted": self.connections_aborted,
                "bytes_forwarded": self.bytes_forwarded,
                "bytes_blackholed": self.bytes_blackholed}


@dataclass(eq=False)
class _Pipe:
    """One proxied connection: the accepted socket and (unless accepted in blackhole) the
    connection to the target, with one reader and one writer task per direction."""

    link: LinkProxy
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tainted: bool = False
    """Bytes were swallowed: the stream has a hole and must not carry anything again."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False

    def abort(self) -> None:
        """Reset both sides at once (nothing buffered is sent)."""
        if not self.closed:
            self.link.stats.connections_aborted += 1
        self._close(abort=True)

    def finish(self) -> None:
        """Both directions ended: close both sides normally."""
        self._close(abort=False)

    def _close(self, *, abort: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                if abort:
                    writer.transport.abort()
                else:
                    writer.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self.link.pipes.discard(self)

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                   queue: asyncio.Queue[tuple[float, bytes] | None]) -> None:
        """Read one direction; queue what the mode lets through (a full queue stops reading)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(CHUNK_BYTES_MAX)
                if not data:
                    await queue.put(None)
                    return
                mode = self.link.mode
                if mode.kind == "blackhole" or writer is None:
                    self.tainted = True
                    self.link.stats.bytes_blackholed += len(data)
                    continue
                await queue.put((loop.time() + mode.delay_ms / 1000, data))
        except (ConnectionError, OSError):
            self.abort()

    async def deliver(self, writer: asyncio.StreamWriter | None,
                      queue: asyncio.Queue[tuple[float, bytes] | None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    # Half-close like the sender did; the other direction may go on.
                    if writer is not None and writer.can_write_eof():
                        writer.write_eof()
                    return
                due_s, data = item
                if due_s > loop.time():
                    await asyncio.sleep(due_s - loop.time())
                if self.link.mode.kind == "blackhole" or writer is None:
                    # Queued before the link went dark: it vanishes too.
                    self.tainted = True
                    self.link.stats.bytes_blackholed += len(data)
                    continue
                writer.write(data)
                self.link.stats.bytes_forwarded += len(data)
                await writer.drain()
        except (ConnectionError, OSError):
            self.abort()


class LinkProxy:
    """The listener of one directed link and every connection through it."""

    def __init__(self, name: str, target_host: str, target_port: int) -> None:
        self.name = name
        self.target = (target_host, target_port)
        self.mode: LinkMode = PASS
        self.stats = LinkStats()
        self.pipes: set[_Pipe] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._on_client, host, port,
                                                  backlog=LISTEN_BACKLOG, reuse_address=True)
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def set_mode(self, mode: LinkMode) -> None:
        previous, self.mode = self.mode, mode
        if mode.kind == "drop":
            for pipe in list(self.pipes):
                pipe.abort()
        elif previous.kind == "blackhole" and mode.kind != "blackhole":
            for pipe in list(self.pipes):
                if pipe.tainted or pipe.upstream is None:
                    pipe.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self.pipes):
            pipe.abort()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), CONNECT_TIMEOUT_S)

    async def _on_client(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        self.stats.connections_accepted += 1
        pipe = _Pipe(self, writer)
        self.pipes.add(pipe)
        if self.mode.kind == "drop":
            pipe.abort()
            return
        upstream_reader: asyncio.StreamReader | None = None
        if self.mode.kind != "blackhole":
            try:
                upstream_reader, upstream = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError):
                pipe.abort()  # the target is down: the client sees its connection drop
                return
            if pipe.closed:  # dropped while connecting
                upstream.transport.abort()
                return
            pipe.upstream = upstream
        up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(DIRECTION_QUEUE_CHUNKS_MAX)
        down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(
            DIRECTION_QUEUE_CHUNKS_MAX)
        pipe.tasks = [asyncio.create_task(pipe.pump(reader, pipe.upstream, up)),
                      asyncio.create_task(pipe.deliver(pipe.upstream, up))]
        if upstream_reader is not None:
            pipe.tasks += [asyncio.create_task(pipe.pump(upstream_reader, writer, down)),
                           asyncio.create_task(pipe.deliver(writer, down))]
        await asyncio.gather(*pipe.tasks, return_exceptions=True)
        pipe.finish()


class ProxyServer:
    """Every link's ``LinkProxy`` in one event loop."""

    def __init__(self) -> None:
        self.links: dict[str, LinkProxy] = {}

    async def add_link(self, name: str, target_host: str, target_port: int,
                       listen_port: int = 0) -> int:
        if name in self.links:
            raise ValueError(f"link {name!r} exists")
        link = LinkProxy(name, target_host, target_port)
        port = await link.start(port=listen_port)
        self.links[name] = link
        return port

    def set_mode(self, names: Iterable[str], mode: LinkMode) -> None:
        for name in names:
            self.links[name].set_mode(mode)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: {"mode": link.mode.kind, "delay_ms": link.mode.delay_ms,
                       "connections_open": len(link.pipes), **link.stats.as_dict()}
                for name, link in self.links.items()}

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links.values()))


async def _handle(server: ProxyServer, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "add":
        ports = {}
        for name, (host, port, *listen) in request["links"].items():
            ports[name] = await server.add_link(name, str(host), int(port),
                                                int(listen[0]) if listen else 0)
        return {"ok": True, "ports": ports}
    if op == "set":
        mode = LinkMode(request["mode"], int(request.get("delay_ms", 0)))
        unknown = [n for n in request["links"] if n not in server.links]
        if unknown:
            return {"ok": False, "error": f"unknown links {unknown}"}
        server.set_mode(request["links"], mode)
        return {"ok": True}
    if op == "stats":
        return {"ok": True, "stats": server.stats()}
    return {"ok": False, "error": f"unknown op {op!r}"}


async def serve_stdio() -> None:
    """The proxy process: one JSON request per stdin line, one JSON answer per stdout line.

    ``{"op": "add", "links": {"a>b": ["127.0.0.1", 7001, 7100]}}`` -> ``{"ok": true,
    "ports": {"a>b": 7100}}`` (target host and port, then the port to listen on, 0 or
    missing: any free one);
    ``{"op": "set", "links": ["a>b"], "mode": "delay", "delay_ms": 50}`` -> ``{"ok": true}``;
    ``{"op": "stats"}`` -> ``{"ok": true, "stats": {...}}``. EOF on stdin stops it.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CONTROL_LINE_BYTES_MAX)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    server = ProxyServer()
    try:
        while line := await reader.readline():
            try:
                answer = await _handle(server, json.loads(line))
            except (ValueError, KeyError, TypeError, OSError) as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        await server.close()


class ProxyProcess:
    """The harness's handle on a proxy process (``python -m tests.chaos.proxy``)."""

    REPLY_TIMEOUT_S = 10.0

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, cwd: str) -> ProxyProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.chaos.proxy", cwd=cwd,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=CONTROL_LINE_BYTES_MAX)
        return cls(process)

    async def request(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        async with self._lock:
            stdin.write(json.dumps(request).encode() + b"\n")
            await stdin.drain()
            line = await asyncio.wait_for(stdout.readline(), self.REPLY_TIMEOUT_S)
        if not line:
            raise RuntimeError(f"proxy process exited ({self._process.returncode})")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"proxy refused {request}: {answer.get('error')}")
        return answer

    async def add_links(self, targets: dict[str, tuple[str, int]],
                        listen_ports: dict[str, int] | None = None) -> dict[str, int]:
        """Add links ``name -> (target host, target port)``; returns their listening ports
        (``listen_ports[name]`` where given, else any free one)."""
        ports = listen_ports or {}
        answer = await self.request({"op": "add", "links": {
            name: [host, port, ports.get(name, 0)] for name, (host, port) in targets.items()}})
        return {name: int(port) for name, port in answer["ports"].items()}

    async def set_mode(self, links: Iterable[str], mode: LinkMode) -> None:
        await self.request({"op": "set", "links": sorted(links), "mode": mode.kind,
                            "delay_ms": mode.delay_ms})

    async def stats(self) -> dict[str, dict[str, Any]]:
        stats: dict[str, dict[str, Any]] = (await self.request({"op": "stats"}))["stats"]
        return stats

    async def close(self) -> None:
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(self._process.wait(), self.REPLY_TIMEOUT_S)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


def main() -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve_stdio())


if __name__ == "__main__":
    main()
