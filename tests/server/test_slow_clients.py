"""Slow and idle clients cannot hold the server's sockets (engine.server.http_guard): connections that send
nothing, half a request's headers, a trickle of header bytes, or headers and half a body are all closed by
the server within the stated timeouts (408 when the headers are late) while normal requests are served
meanwhile, and the open file descriptors come back to their idle count. Beyond the connection cap, a new
connection's request gets 503 with Retry-After. Real sockets against the live server, short timeouts."""

from __future__ import annotations

import os
import select
import socket
import time

import httpx
import pytest

from kvloop.engine.server.launch import build_server
from kvloop.engine.server.limits import ConnectionLimits

from .conftest import _serve_args, serve_in_thread

TIMEOUT_S = 1.0  # header and body deadlines in these tests
SLACK_S = 1.5  # a loaded 2-core machine: timer, close and the client's read
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "temperature": 0}
HALF_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"
HALF_BODY = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 1000\r\n\r\n" b'{"model": "de')


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def connect(url: str, payload: bytes = b"") -> socket.socket:
    sock = socket.create_connection(address(url), timeout=5)
    if payload:
        sock.sendall(payload)
    return sock


def await_closed(socks: list[socket.socket], deadline: float, drip: socket.socket | None = None) -> dict:
    """Reads every socket until the server closes it (EOF or reset) or the deadline passes; returns
    {socket: (bytes received, seconds until closed)}. `drip` gets one header byte whenever it is quiet for
    0.2 s (a slowloris client): the header deadline must not restart with each byte."""
    start, got, closed = time.monotonic(), {s: b"" for s in socks}, {}
    while len(closed) < len(socks) and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.2)
        for s in readable:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            got[s] += data
            if not data:
                closed[s] = (got[s], time.monotonic() - start)
        if drip is not None and drip not in closed and not readable:
            try:
                drip.sendall(b"X")
            except OSError:  # the server closed it: the next select sees it
                pass
    return closed


@pytest.fixture
def short_timeouts(server, monkeypatch):
    monkeypatch.setattr(server.protocol, "limits", ConnectionLimits(TIMEOUT_S, TIMEOUT_S, 1024))


def test_stalled_connections_are_closed_in_time_while_requests_are_served(server, short_timeouts):
    with httpx.Client(base_url=server.url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        idle = open_fds()
        silent = [connect(server.url) for _ in range(5)]
        half_headers = [connect(server.url, HALF_HEADERS) for _ in range(7)]
        half_body = [connect(server.url, HALF_BODY) for _ in range(7)]
        drip = connect(server.url, b"GET /health HTTP/1.1\r\nX-Slow: ")
        stalled = silent + half_headers + half_body + [drip]
        start = time.monotonic()
        served = c.post("/v1/chat/completions", json=CHAT)  # while all 20 are held open
        assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"] is not None
        closed = await_closed(stalled, start + TIMEOUT_S + SLACK_S + 3, drip)
        assert len(closed) == len(stalled), f"{len(stalled) - len(closed)} of {len(stalled)} still open"
        late = [t for _, t in closed.values() if t > TIMEOUT_S + SLACK_S]
        assert not late, f"closed after {max(late):.2f} s, the timeout is {TIMEOUT_S} s"
        for s in silent + half_headers + [drip]:  # late headers: a 408 in the OpenAI error shape
            assert closed[s][0].startswith(b"HTTP/1.1 408"), closed[s][0][:80]
            assert b'"code": "request_timeout"' in closed[s][0]
        for s in half_body:  # cut off while the app read the body: nothing was sent
            assert closed[s][0] == b""
        for s in stalled:
            s.close()
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # and still serving after
        end = time.monotonic() + 10
        while open_fds() > idle:
            assert time.monotonic() < end, f"{open_fds()} fds open, {idle} when idle"
            time.sleep(0.05)
    server.assert_no_leak()


def get_health(sock: socket.socket) -> bytes:
    """One GET /health on a kept-alive socket; the whole response (its body is sized by content-length)."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"<closed>"
        assert not data.endswith(b"<closed>"), data
    head, _, body = data.partition(b"\r\n\r\n")
    sizes = [line.split(b":")[1] for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length")]
    length = int(sizes[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data + body
        body += chunk
    return head


def test_a_kept_alive_connection_is_not_cut_between_requests_by_the_header_deadline(server, short_timeouts):
    """Idle time between requests is the keep-alive timeout's (5 s), not the header deadline's."""
    with connect(server.url) as sock:
        assert get_health(sock).startswith(b"HTTP/1.1 200")
        time.sleep(TIMEOUT_S + 0.5)  # idle on purpose, past the header deadline
        assert get_health(sock).startswith(b"HTTP/1.1 200")


def test_over_the_connection_cap_a_request_gets_503_with_retry_after(core_engine):
    args = _serve_args(header_timeout=TIMEOUT_S, body_timeout=TIMEOUT_S, max_connections=4)
    app, _ = build_server(core_engine, args)  # never started: /health answers without the engine
    with serve_in_thread(app, args) as (url, _):
        held = [connect(url) for _ in range(4)]
        extra = connect(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await_closed([extra], time.monotonic() + 5)[extra][0]
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower(), answer
        assert b'"code": "too_many_connections"' in answer
        extra.close()
        await_closed(held, time.monotonic() + TIMEOUT_S + SLACK_S + 3)  # the held ones time out
        for s in held:
            s.close()
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # room again
