"""The chain that sets a makespan. A chat session is a closed loop: turn k+1 is sent when turn k's reply has
ended, plus the workload's think time. So a run cannot end before its last session has run its turns one after
another, and throughput over the makespan (first send to last finish) is bounded by that one session, however
fast the rest is served. `last_chain` finds, in one run's request records, the session that finished last and
splits its span into its first send, each turn's time to first token and decode, and the gaps between turns
(the think times, which the workload draws: the same for every system at one seed). A report shows it per run,
so that a reader sees which part of a makespan any scheduler could still win."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from kvloop.engine.bench.metrics import RequestRecord, run_span


@dataclass(frozen=True)
class Turn:
    send_s: float  # since the run's first send
    ttft_s: float
    decode_s: float  # first token to last
    output_tokens: int

    @property
    def end_s(self) -> float:
        return self.send_s + self.ttft_s + self.decode_s

    @property
    def ms_per_token(self) -> float | None:
        return 1000 * self.decode_s / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass(frozen=True)
class Chain:
    session: str
    makespan_s: float  # the run's: first send to last successful finish
    turns: tuple[Turn, ...]

    @property
    def end_s(self) -> float:
        return self.turns[-1].end_s

    @property
    def think_s(self) -> float:
        """The gaps between one turn's end and the next one's send."""
        return sum(b.send_s - a.end_s for a, b in zip(self.turns, self.turns[1:], strict=False))

    def as_dict(self) -> dict:
        return {"session": self.session, "makespan_s": round(self.makespan_s, 3), "first_send_s":
                round(self.turns[0].send_s, 3), "end_s": round(self.end_s, 3),
                "think_s": round(self.think_s, 3),
                "ttft_s": [round(t.ttft_s, 3) for t in self.turns],
                "decode_s": [round(t.decode_s, 3) for t in self.turns],
                "output_tokens": [t.output_tokens for t in self.turns],
                "ms_per_token": [None if t.ms_per_token is None else round(t.ms_per_token,
                                                                           1) for t in self.turns]}


def session_of(request_id: str) -> tuple[str, int] | None:
    """(session, turn) of a chat turn's id ("c13-t2": ChatSession.turn_id), None for any other id."""
    session, sep, turn = request_id.rpartition("-t")
    return (session, int(turn)) if sep and session and turn.isdigit() else None


def last_chain(records: Iterable[RequestRecord]) -> Chain | None:
    """The chat session that finished last in this run, turn by turn; None without a chat session that
    finished every turn it sent (a failed turn ends a session: its chain is not a closed loop to the end)."""
    records = list(records)
    if not records:
        return None
    start, end = run_span(records)
    makespan = end - start  # as the report's duration_s
    sessions: dict[str, list[tuple[int, RequestRecord]]] = defaultdict(list)
    for r in records:
        turn = session_of(r.request_id) if r.kind == "chat" else None
        if turn is not None:
            sessions[turn[0]].append((turn[1], r))
    chains = []
    for session, turns in sessions.items():
        if not all(r.ok for _, r in turns):
            continue
        turns.sort(key=lambda kr: kr[0])
        chains.append(Chain(session, makespan, tuple(
            Turn(r.send_s - start, r.ttft, r.end_s - r.first_token_s, r.output_tokens) for _, r in turns)))
    return max(chains, key=lambda c: c.end_s, default=None)
