"""The network nemesis's instruments (R-Q-11): proxies in the harness process between one
qimpl process and PostgreSQL or Temporal.

- ``TcpProxy`` forwards one TCP endpoint and, on command, adds latency, black-holes one
  direction or both (what is sent that way is held, a close too, and delivered only when
  the hole heals, as TCP delivers after a partition; or never, if the connection is reset
  first), refuses new connections, or resets every open one (RST). Its counters are the
  evidence that a fault struck: bytes held back while it held, connections reset.
- ``GrpcProxy`` forwards every unary gRPC call (Temporal's whole frontend API is unary)
  byte for byte, and answers the next call that matches a method and a substring of its
  request with an error once (``NOT_FOUND``, ``UNAVAILABLE``), recording the call it
  struck.

A userspace proxy cannot lose packets: its kernel acknowledges what it drops, so a
black hole here is "the peer stopped answering" (a hung server, a stalled middlebox), not
a routing loss that TCP's own timers (``tcp_user_timeout``) would detect. Each proxy runs
in a daemon thread and ``stop`` closes everything it opened.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GrpcProxy", "ProxyStats", "TcpProxy"]

DIRECTIONS = ("up", "down", "both", "")  # up: client -> server; down: server -> client
_CHUNK = 65536


@dataclass
class ProxyStats:
    """What a ``TcpProxy`` moved and held back (bytes; ``up`` = client -> server)."""

    opened: int = 0
    open: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    held_up: int = 0
    held_down: int = 0
    reset: int = 0
    refused: int = 0
    delayed_chunks: int = 0


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` (``host:port``). Thread-safe controls:
    ``delay``, ``blackhole``, ``refuse``, ``reset``, ``heal``; ``stats`` for evidence."""

    def __init__(self, name: str, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.name = name
        self.upstream = (host or "127.0.0.1", int(port))
        self.port = 0
        self.stats = ProxyStats()
        self._delay_s = 0.0
        self._hole = ""
        self._refuse = False
        self._flowing: dict[str, asyncio.Event] = {}
        self._conns: set[_Conn] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{name}", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        self._flowing = {d: asyncio.Event() for d in ("up", "down")}
        for e in self._flowing.values():
            e.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    # -- controls ------------------------------------------------------------
    def delay(self, ms: float) -> None:
        """Hold every chunk ``ms`` milliseconds before forwarding it (both directions)."""
        self._delay_s = ms / 1000.0

    def blackhole(self, direction: str = "both") -> None:
        """Hold what flows ``up``, ``down`` or ``both`` ways (``""``: nothing) until
        ``heal``; with ``both``, new connections are accepted and reach the server only then."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}")
        self._hole = direction
        self._call(self._set_flowing(direction))

    def refuse(self, on: bool = True) -> None:
        """Close new connections at once (a server that is down)."""
        self._refuse = on

    def heal(self) -> None:
        """Forward everything again, with no delay; held closes are delivered now."""
        self._delay_s = 0.0
        self._refuse = False
        self.blackhole("")

    def reset(self) -> int:
        """Reset every open connection (RST to the client, close to the server); returns how many."""
        n: int = self._call(self._reset())
        return n

    async def _set_flowing(self, hole: str) -> None:
        for d, event in self._flowing.items():
            if hole in (d, "both"):
                event.clear()
            else:
                event.set()

    async def _reset(self) -> int:
        conns = list(self._conns)
        for c in conns:
            sock = c.client.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.client.transport.abort()
            if c.server is not None:
                c.server.transport.abort()
            for t in c.tasks:
                t.cancel()
        self.stats.reset += len(conns)
        return len(conns)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset()

    # -- forwarding ----------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refuse:
            self.stats.refused += 1
            writer.transport.abort()
            return
        conn = _Conn(writer)
        self._conns.add(conn)
        self.stats.opened += 1
        self.stats.open += 1
        try:
            for event in self._flowing.values():  # a connection made during a full black hole waits
                await event.wait()
            try:
                up_reader, conn.server = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            conn.tasks = [asyncio.ensure_future(self._pump(reader, conn.server, "up")),
                          asyncio.ensure_future(self._pump(up_reader, writer, "down"))]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in conn.tasks:
                t.cancel()
            for w in (writer, conn.server):
                if w is not None:
                    w.transport.abort()
            self._conns.discard(conn)
            self.stats.open -= 1

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        flowing = self._flowing[direction]
        while True:
            data = await reader.read(_CHUNK)
            if not flowing.is_set():  # held (a close too) until the hole heals; the kernel buffers the rest
                setattr(self.stats, f"held_{direction}", getattr(self.stats, f"held_{direction}") + len(data))
                await flowing.wait()
            if not data:
                return
            if self._delay_s:
                self.stats.delayed_chunks += 1
                await asyncio.sleep(self._delay_s)
            setattr(self.stats, f"bytes_{direction}", getattr(self.stats, f"bytes_{direction}") + len(data))
            writer.write(data)
            await writer.drain()


@dataclass
class _Rule:
    method: str
    needle: bytes
    code: Any
    struck: dict[str, Any] | None = None


class GrpcProxy:
    """A unary gRPC pass-through to ``upstream`` (``host:port``) that can answer one
    matching call with an error (``fail_once``). Needs ``grpcio``."""

    def __init__(self, name: str, upstream: str, *, max_workers: int = 64) -> None:
        import grpc

        self.name = name
        self.upstream = upstream
        self.port = 0
        self.calls: list[dict[str, Any]] = []
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(upstream)
        self._server = grpc.server(ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"grpc-{name}"))
        self._server.add_generic_rpc_handlers((_Handler(self),))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> GrpcProxy:
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)
        self._channel.close()

    def fail_once(self, method: str, contains: str, code: str = "NOT_FOUND") -> _Rule:
        """Answer the next call of ``method`` (its last path segment, e.g.
        ``DescribeWorkflowExecution``) whose request bytes contain ``contains`` with
        ``code``; the rule's ``struck`` then holds the call (method, time)."""
        import grpc

        rule = _Rule(method, contains.encode(), getattr(grpc.StatusCode, code))
        with self._lock:
            self._rules.append(rule)
        return rule

    def _strike(self, method: str, request: bytes) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.struck is None and method.endswith("/" + rule.method) and rule.needle in request:
                    rule.struck = {"method": method, "t": time.time(), "code": rule.code.name}
                    return rule
        return None

    def forward(self, method: str) -> Callable[[bytes, Any], bytes]:
        call = self._channel.unary_unary(method)

        def handle(request: bytes, context: Any) -> bytes:
            import grpc

            rule = self._strike(method, request)
            with self._lock:
                self.calls.append({"method": method.rsplit("/", 1)[-1], "t": time.time(),
                                   "struck": rule is not None, "request": request})
            if rule is not None:
                context.abort(rule.code, f"injected by the harness ({self.name})")
            metadata = [(k, v) for k, v in context.invocation_metadata()
                        if not k.startswith((":", "grpc-")) and k not in ("user-agent", "content-type", "te")]
            remaining = context.time_remaining()
            try:
                response, outcome = call.with_call(request, metadata=metadata,
                                                   timeout=remaining if remaining and remaining < 1e6 else None)
            except grpc.RpcError as exc:
                trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
                if trailing:
                    context.set_trailing_metadata(tuple(trailing))
                context.abort(exc.code(), exc.details() or "")
            if outcome.trailing_metadata():
                context.set_trailing_metadata(tuple(outcome.trailing_metadata()))
            result: bytes = response
            return result

        return handle


class _Handler:
    """grpcio's generic handler: every method forwarded as raw bytes."""

    def __init__(self, proxy: GrpcProxy) -> None:
        self.proxy = proxy

    def service(self, details: Any) -> Any:
        import grpc

        return grpc.unary_unary_rpc_method_handler(self.proxy.forward(details.method))
