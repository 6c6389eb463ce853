"""What a workload hands the driver: requests with arrival times, and follow-ups that depend on
how earlier requests ended (closed-loop chat). Shared by the simulator and the real-engine driver."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class RequestSpec:
    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival: float  # seconds from the start of the run
    kind: str = "doc"  # "doc" | "chat" | "trace" ...
    session: str | None = None
    turn: int = 0
    meta: dict = field(default_factory=dict)


class Workload(Protocol):
    name: str

    def initial(self) -> list[RequestSpec]:
        """Requests known up front (open-loop arrivals and first turns), any order."""

    def on_finish(self, spec: RequestSpec, output: list[int], now: float) -> list[RequestSpec]:
        """Follow-ups released by spec's completion at time now (arrival >= now)."""


class OpenLoop:
    """A fixed list of requests (traces, W4): nothing follows from completions."""

    def __init__(self, name: str, specs: list[RequestSpec]):
        self.name = name
        self._specs = specs

    def initial(self) -> list[RequestSpec]:
        return list(self._specs)

    def on_finish(self, spec: RequestSpec, output: list[int], now: float) -> list[RequestSpec]:
        return []


def output_token(request_id: str, position: int, vocab: int) -> int:
    """The simulator's 'sampled' token: deterministic in (request, position), independent of the
    batch, so a chat's history is the same in every mode and every run. Avoids ids 0-2 (specials)."""
    return 3 + (zlib.crc32(request_id.encode()) + 2654435761 * position) % (vocab - 3)
