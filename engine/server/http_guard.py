"""Slow and idle clients cannot hold sockets. uvicorn (h11) arms its keep-alive timer only once a response is
sent, so a connection that sends half a request line, or its headers and then a trickle of body, was held
open forever. This protocol adds what it lacks:
- a header deadline: the request line and headers are due within header_timeout_s of the connection opening
  (or of the first byte of a later request on a kept-alive connection); a late client gets 408 and the close;
- a body deadline: the whole body is due within body_timeout_s of the headers; a late one is cut off (the
  app sees a disconnect, which frees what it held);
- a connection cap: beyond max_connections open at once, a new connection's request gets 503 with
  Retry-After and the close, so that stalled sockets cannot exhaust file descriptors.
Between requests uvicorn's own keep-alive timeout closes idle connections. Headers above h11's 16 KiB are a
400 from h11 itself."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from kvloop.engine.server.errors import RETRY_AFTER_S, error_body
from kvloop.engine.server.limits import ConnectionLimits

log = logging.getLogger("kvloop.server")


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn.Config(http=...), with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class GuardedH11Protocol(H11Protocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "headers" or "body": what the running deadline waits for
        self._served = False  # a response went out: between requests, uvicorn's keep-alive timer rules
        self._over_cap = len(self.connections) > self.limits.max_connections
        self._arm("headers")

    def data_received(self, data: bytes) -> None:
        if self._over_cap:
            self._refuse(data)
            return
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        self._served = True
        super().on_response_complete()
        self._follow()  # a pipelined request may already be half here

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Keeps the deadline in step with what h11 waits for from the client."""
        state = self.conn.their_state
        if self.transport.is_closing():
            self._disarm()
        elif state is h11.SEND_BODY:
            self._arm("body")
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm("headers")  # part of the next request is here: the rest is due
        elif state is not h11.IDLE or self._served:
            self._disarm()  # read in full, or idle after a response
        # else: a new connection that sent nothing yet; the header deadline from connection_made runs on

    def _arm(self, phase: str) -> None:
        if self._phase == phase:
            return  # the deadline runs from the start of the phase, however the bytes trickle in
        self._disarm()
        seconds = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
        self._phase = phase
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _expired(self) -> None:
        phase, self._timer, self._phase = self._phase, None, None
        if self.transport.is_closing():
            return
        log.debug("closing a connection from %s: its request %s did not arrive in time", self.client, phase)
        if phase == "headers" and self.conn.our_state is h11.IDLE:
            self._answer_and_close(408, f"the request headers did not arrive within "
                                        f"{self.limits.header_timeout_s:g} s", "request_timeout")
        else:  # the app is reading the body: it sees a disconnect
            self.transport.abort()

    def _refuse(self, data: bytes) -> None:
        """Over the connection cap: read the request's head only, then answer 503 and close."""
        self.conn.receive_data(data)
        try:
            event = self.conn.next_event()
        except h11.RemoteProtocolError:
            self.transport.close()
            return
        if isinstance(event, h11.Request):
            self._answer_and_close(503, f"the server has {self.limits.max_connections} connections open; "
                                        "retry later", "too_many_connections",
                                   [(b"retry-after", str(RETRY_AFTER_S).encode())])

    def _answer_and_close(self, status: int, message: str, code: str,
                          headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self._disarm()
        body = json.dumps(error_body(status, message, None, code)).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"), *(headers or [])]
        try:
            for event in (h11.Response(status_code=status, headers=head, reason=STATUS_PHRASES[status]),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:
            pass  # h11 cannot answer in this state: the close alone tells the client
        self.transport.close()
