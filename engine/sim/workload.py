"""What the simulator's loop needs from a workload: requests with arrival times, and follow-ups that
depend on how earlier requests ended (closed-loop chat). `BenchWorkload` adapts the benchmark's
workloads (engine.bench.workloads / traces: the shared, seeded generators) to it."""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass
class RequestSpec:
    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival: float  # seconds from the start of the run
    kind: str = "doc"
    session: object | None = None  # the bench ChatSession of a chat turn
    turn: int = 0


class BenchWorkload:
    """engine.bench.workloads.Workload -> initial requests + next chat turns, as the bench driver does
    (turn k+1 is due at the end of turn k plus the session's think time; the reply as generated joins
    the history)."""

    def __init__(self, wl):
        self.wl = wl
        self.name = wl.name
        self._replies: dict[str, list[list[int]]] = {}

    @property
    def num_requests(self) -> int:
        return self.wl.num_requests

    def initial(self) -> list[RequestSpec]:
        out = [RequestSpec(r.request_id, r.prompt, r.max_tokens, r.arrival_s,
                           r.kind) for r in self.wl.requests]
        for s in self.wl.sessions:
            self._replies[s.session_id] = []
            out.append(RequestSpec(s.turn_id(0), s.prompt(0, []), s.reply_tokens, s.start_s, "chat", s, 0))
        return out

    def on_finish(self, spec: RequestSpec, output: list[int], now: float) -> list[RequestSpec]:
        s = spec.session
        if s is None:
            return []
        replies = self._replies[s.session_id]
        replies.append(list(output))
        k = spec.turn + 1
        if k >= s.num_turns:
            del self._replies[s.session_id]
            return []
        return [RequestSpec(s.turn_id(k), s.prompt(k, replies), s.reply_tokens, now + s.think_s[spec.turn],
                            "chat", s, k)]


def output_tokens(request_id: str, start: int, stop: int, vocab: int) -> list[int]:
    """The simulator's 'sampled' tokens at positions start..stop-1: deterministic in (request, position),
    independent of the batch, so a chat's history is the same in every mode and every run. Avoids ids
    below 100 (SmolLM2's special tokens), as the bench generators do."""
    token = OutputTokens(vocab)
    return [token(request_id, p) for p in range(start, stop)]


def output_token(request_id: str, position: int, vocab: int) -> int:
    return OutputTokens(vocab)(request_id, position)


class OutputTokens:
    """output_tokens for the requests of one run, each request's hash taken once (the simulator samples
    every token of every request; `forget` a finished one)."""

    def __init__(self, vocab: int):
        self.span = vocab - 100
        self._bases: dict[str, int] = {}

    STRIDE = 2654435761

    def __call__(self, request_id: str, position: int) -> int:
        return self.at(self.base(request_id), position)

    def base(self, request_id: str) -> int:
        """The request's hash, which with a position gives its token (`at`): callers that sample one request
        many times keep it."""
        base = self._bases.get(request_id)
        if base is None:
            base = self._bases[request_id] = zlib.crc32(request_id.encode())
        return base

    def at(self, base: int, position: int) -> int:
        return 100 + (base + self.STRIDE * position) % self.span

    def tokens(self, base: int, start: int, stop: int) -> list[int]:
        """at(base, p) for p in range(start, stop), in one loop (a row caught up after a window)."""
        stride, span = self.STRIDE, self.span
        # base + stride * p for each p, stepped by range in C rather than multiplied per token
        return [100 + x % span for x in range(base + stride * start, base + stride * stop, stride)]

    def forget(self, request_id: str) -> None:
        self._bases.pop(request_id, None)
