"""Runs a workload against a target on the wall clock.

Open-loop requests are sent at their arrival times; chat turns are sent when the previous reply ends
plus the think time. A request's send time is when it was due, not when a blocking target let the
driver call submit, so time spent queued behind a busy target counts in its TTFT. Server counters are
sampled every `sample_every_s`."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from kvloop.engine.bench.guard import NoiseGuard, NoiseReport
from kvloop.engine.bench.metrics import RequestRecord, Sample
from kvloop.engine.bench.targets.base import Target
from kvloop.engine.bench.workloads import ChatSession, Workload


@dataclass
class RunResult:
    system: str
    workload: str
    records: list[RequestRecord]
    samples: list[Sample]
    noise: NoiseReport | None
    info: dict = field(default_factory=dict)
    wall_s: float = 0.0


@dataclass(order=True)
class _Due:
    t: float
    request_id: str
    kind: str = field(compare=False)
    prompt: list[int] = field(compare=False)
    max_tokens: int = field(compare=False)
    session: ChatSession | None = field(compare=False, default=None)
    turn: int = field(compare=False, default=0)


def run_workload(workload: Workload, target: Target, progress: bool = False, sample_every_s: float = 0.25,
                 timeout_s: float | None = None, guard: NoiseGuard | None = None,
                 last_send_s: float | None = None) -> RunResult:
    """Sends every request of `workload` to `target` and waits for all of them (or `timeout_s`: the
    unfinished ones are recorded as failed 'timeout'). `last_send_s`: nothing is sent after it (chat turns
    due later are not sent and not recorded), so a fixed window of traffic ends when it says."""
    due: list[_Due] = [_Due(r.arrival_s, r.request_id, r.kind, r.prompt,
                            r.max_tokens) for r in workload.requests]
    replies: dict[str, list[list[int]]] = {}
    for s in workload.sessions:
        replies[s.session_id] = []
        due.append(_Due(s.start_s, s.turn_id(0), "chat", s.prompt(0, []), s.reply_tokens, s, 0))
    heapq.heapify(due)
    records: dict[str, RequestRecord] = {}
    outputs: dict[str, list[int]] = {}
    chat_of: dict[str, _Due] = {}
    samples: list[Sample] = []
    bar = _bar(workload.num_requests, target.name) if progress else None
    guard = guard or NoiseGuard()
    target.start()
    with guard:
        t0 = time.monotonic()
        next_sample = 0.0
        finished = 0
        while due or not target.idle():
            now = time.monotonic() - t0
            if timeout_s is not None and now > timeout_s:
                break
            while due and due[0].t <= now:
                d = heapq.heappop(due)
                if last_send_s is not None and d.t > last_send_s:
                    continue
                records[d.request_id] = RequestRecord(d.request_id, d.kind, d.t, prompt_tokens=len(d.prompt))
                outputs[d.request_id] = []
                if d.session is not None:
                    chat_of[d.request_id] = d
                target.submit(d.request_id, d.prompt, d.max_tokens)
            if last_send_s is not None and now > last_send_s:
                due.clear()  # the window is over: what is still due is never sent
            if now >= next_sample:
                snap = target.snapshot()
                if snap is not None:
                    samples.append(Sample(now, snap))
                next_sample = now + sample_every_s
            wait = min(due[0].t - now if due else 0.05, 0.05, max(0.0, next_sample - now))
            for ev in target.poll(max(0.0, wait)):
                rec = records.get(ev.request_id)
                if rec is None:
                    continue
                t = ev.t - t0
                if ev.num_new_tokens:
                    if rec.first_token_s is None:
                        rec.first_token_s = t
                    rec.chunk_times.append(t)
                    outputs[ev.request_id] += ev.new_token_ids
                if not ev.done:
                    continue
                rec.end_s, rec.error = t, ev.error
                rec.prompt_tokens = ev.prompt_tokens or rec.prompt_tokens
                rec.cached_tokens = ev.cached_tokens
                rec.output_tokens = ev.output_tokens or len(outputs[ev.request_id])
                finished += 1
                if bar is not None:
                    bar.update(1)
                d = chat_of.pop(ev.request_id, None)
                if d is not None:
                    _next_turn(d, outputs.pop(ev.request_id), replies, due, t, rec.ok)
        wall = time.monotonic() - t0
        snap = target.snapshot()
        if snap is not None:
            samples.append(Sample(wall, snap))
    if bar is not None:
        bar.close()
    for rec in records.values():
        if rec.end_s is None and rec.error is None:
            rec.error = "timeout"
    return RunResult(target.name, workload.name, list(records.values()), samples, guard.report(),
                     target.info(), wall)


def _next_turn(d: _Due, reply: list[int], replies: dict[str, list[list[int]]], due: list[_Due], t: float,
               ok: bool) -> None:
    """Schedules the session's next turn with this reply in its history. A failed turn ends the session
    (a user whose request failed does not go on)."""
    s = d.session
    if not ok or d.turn + 1 >= s.num_turns:
        return
    # targets that return no token ids (text-only endpoints) get a deterministic stand-in of the right length
    reply = reply[: s.reply_tokens] if len(reply) >= s.reply_tokens else reply + s.user_turns[d.turn][:1] * (
        s.reply_tokens - len(reply))
    replies[s.session_id].append(reply)
    k = d.turn + 1
    heapq.heappush(due, _Due(t + s.think_s[d.turn], s.turn_id(k), "chat", s.prompt(k, replies[s.session_id]),
                             s.reply_tokens, s, k))


def _bar(total: int, name: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=name, unit="req", leave=False)
