"""Pure-ASGI guards in front of the app: a request-body size limit (413) and an optional API key (401).
Pure ASGI rather than BaseHTTPMiddleware, so streaming responses and disconnects pass through untouched."""

from __future__ import annotations

import hmac
import json

from kvloop.engine.server.errors import error_body

DRAIN_LIMIT = 64 << 20  # read and drop an oversize body up to this size, so the client sees the 413


async def _send_error(send, status: int, message: str, code: str | None = None,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > DRAIN_LIMIT:
            return await self._too_large(send)
        chunks, total, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            total += len(message.get("body", b""))
            if total <= self.max_bytes:
                chunks.append(message.get("body", b""))
            elif total > DRAIN_LIMIT:
                return await self._too_large(send)
            more = message.get("more_body", False)
        if total > self.max_bytes:
            return await self._too_large(send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # afterwards: the real channel, so disconnects are still seen

        await self.app(scope, replay, send)

    async def _too_large(self, send):
        await _send_error(send, 413, f"the request body is larger than the limit of {self.max_bytes} bytes",
                          "body_too_large")


class APIKey:
    """Bearer-token check for /v1/* (health, readiness and metrics stay open for probes and scrapers). The
    scheme is case-insensitive (RFC 9110: `bearer KEY` and `BEARER KEY` too); the key is not."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    def _accepts(self, given: bytes) -> bool:
        scheme, _, token = given.partition(b" ")
        # constant time on the key: no timing oracle on it (the scheme is no secret)
        return hmac.compare_digest(token.lstrip(b" "), self.key) and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not self._accepts(given):
                return await _send_error(send, 401, "invalid or missing API key", "invalid_api_key",
                                         [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)
