"""The network nemesis's TCP proxy (R-Q-11) against a local echo server: it forwards,
holds what a partition cuts off and delivers it after the heal (as TCP does), resets
connections, refuses new ones, and counts what it held as the evidence that it struck."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from qualify.proxy import TcpProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    p = TcpProxy("echo", f"127.0.0.1:{server.server_address[1]}").start()
    try:
        yield p
    finally:
        p.stop()
        server.shutdown()
        server.server_close()


def _client(p: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", p.port), timeout=5)


def _recv(sock: socket.socket, n: int, timeout_s: float = 5.0) -> bytes:
    sock.settimeout(timeout_s)
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


@pytest.mark.req("R-Q-11")
def test_forwards_both_ways(proxy: TcpProxy) -> None:
    with _client(proxy) as c:
        c.sendall(b"hello")
        assert _recv(c, 5) == b"hello"
    assert proxy.stats.bytes_up == 5 and proxy.stats.bytes_down == 5


@pytest.mark.req("R-Q-11")
def test_a_partition_holds_the_bytes_and_the_heal_delivers_them(proxy: TcpProxy) -> None:
    with _client(proxy) as c:
        c.sendall(b"a")
        assert _recv(c, 1) == b"a"
        proxy.blackhole("both")
        c.sendall(b"held")
        c.settimeout(0.3)
        with pytest.raises(TimeoutError):
            c.recv(1)  # nothing comes back while it lasts
        deadline = time.monotonic() + 5
        while proxy.stats.held_up == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.stats.held_up == 4
        proxy.heal()
        assert _recv(c, 4) == b"held"  # delivered late, not lost


@pytest.mark.req("R-Q-11")
def test_a_full_partition_holds_new_connections_until_the_heal(proxy: TcpProxy) -> None:
    proxy.blackhole("both")
    with _client(proxy) as c:
        c.sendall(b"x")
        c.settimeout(0.3)
        with pytest.raises(TimeoutError):
            c.recv(1)
        proxy.heal()
        assert _recv(c, 1) == b"x"


@pytest.mark.req("R-Q-11")
def test_reset_and_refuse(proxy: TcpProxy) -> None:
    c = _client(proxy)
    c.sendall(b"a")
    assert _recv(c, 1) == b"a"
    assert proxy.reset() == 1
    try:
        got = _recv(c, 1)
    except ConnectionResetError:
        got = b""
    assert got == b""  # the connection is gone: reset (RST), never echoing again
    c.close()
    proxy.refuse()
    with _client(proxy) as d:
        assert _recv(d, 1, timeout_s=2) == b""  # closed at once
    assert proxy.stats.refused == 1 and proxy.stats.reset == 1


@pytest.mark.req("R-Q-11")
def test_delay_holds_each_chunk(proxy: TcpProxy) -> None:
    proxy.delay(200)
    with _client(proxy) as c:
        t0 = time.monotonic()
        c.sendall(b"slow")
        assert _recv(c, 4) == b"slow"
        assert time.monotonic() - t0 >= 0.35  # up and down, 200 ms each
    assert proxy.stats.delayed_chunks >= 2
