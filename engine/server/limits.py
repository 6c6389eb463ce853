"""What slow and idle clients may hold (enforced by http_guard.py); here alone, so that building the CLI
parser, which shows the defaults, imports neither uvicorn nor FastAPI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0  # request line and headers, from connecting (or the request's first byte)
    body_timeout_s: float = 30.0  # the whole body, from the end of the headers
    max_connections: int = 1024  # open at once; beyond: 503 with Retry-After
