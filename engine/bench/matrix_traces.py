"""The robustness matrix's traces on the CPU (pure Python): one cell's workload from a trace name, a load
knob, a window of traffic and a seed (../shared/WORKLOADS.md W1, W2, W5, W3's Mooncake replay).

The knob is what a sweep moves, in each trace's own unit:
- w1, w2: requests/s of the open-loop stream (document questions and first chat turns; later turns follow
  their replies). Lengths scaled by `w1_scale`; counts follow from the knob and the window.
- w5-cpu: a multiple of W5's CPU phase rates (chat, RAG), its phases compressed to two per window.
- mooncake: requests/s; the trace's first rows, 32 tokens per hash id (length scale 1/16), arrivals
  time-scaled so that the rows span the window at that rate.

Every cell gets fresh token content from its seed, so a server that took an earlier cell holds none of it.
Rows longer than the served context are kept (the server refuses them and the cell counts the refusal) and
reported by `too_long`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvloop.engine.bench.traces import read_mooncake_jsonl
from kvloop.engine.bench.w5_workload import W5_CPU, build_w5
from kvloop.engine.bench.workloads import SMOKE, W1Params, Workload, build_w1
from kvloop.engine.core import defaults as D

TRACES = ("w1", "w2", "w5-cpu", "mooncake")
KNOB_UNIT = {"w1": "open-loop req/s", "w2": "open-loop req/s", "w5-cpu": "x W5-cpu phase rates",
             "mooncake": "req/s"}
MOONCAKE_PATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "mooncake_synthetic.jsonl"
MOONCAKE_LENGTH_SCALE = 1 / 16  # 32 tokens per 512-token hash id (WORKLOADS.md W3, CPU)
DOC_SHARE = 0.8  # W1's 60 questions : 15 sessions


@dataclass(frozen=True)
class TraceOptions:
    traffic_s: float = 45.0  # the window of arrivals per cell
    w1_scale: float = 0.5  # W1/W2 lengths (WORKLOADS.md's full W1 prefills 2,000-token documents)
    smoke: bool = False  # W1-smoke-sized prompts and outputs for every trace (tests, quick checks)
    mooncake_path: Path = MOONCAKE_PATH
    context: int = D.MAX_MODEL_LEN.value  # the served context (prompt + output) the rows are checked against
    # W5-cpu's and the Mooncake replay's token lengths, times WORKLOADS.md's CPU scale (1: as written there;
    # a CPU that prefills slower than the SLO's 1 s per 1,000 tokens meets no long prompt's TTFT bound)
    w5_scale: float = 1.0
    mooncake_scale: float = 1.0


def _w1_params(knob: float, seed: int, opts: TraceOptions) -> W1Params:
    n_open = max(2, round(knob * opts.traffic_s))
    q = max(1, round(n_open * DOC_SHARE))
    base = SMOKE if opts.smoke else W1Params().scaled(opts.w1_scale)
    return replace(base, num_doc_questions=q, num_sessions=max(1, n_open - q), rate=knob, seed=seed)


def build_cell(trace: str, knob: float, seed: int, opts: TraceOptions) -> Workload:
    """The workload of one cell; its params say how it was built."""
    if knob <= 0:
        raise ValueError(f"load knob must be > 0, got {knob}")
    if trace in ("w1", "w2"):
        p = _w1_params(knob, seed, opts)
        if trace == "w2":
            p = replace(p, unique_docs=True, unique_system=True)
        wl = build_w1(p, trace.upper())
    elif trace == "w5-cpu":
        p = replace(W5_CPU, chat_rate=W5_CPU.chat_rate * knob, rag_rate=W5_CPU.rag_rate * knob,
                    duration_s=opts.traffic_s, phase_s=opts.traffic_s / 2, seed=seed)
        if opts.w5_scale != 1.0:
            p = _scaled_w5(p, opts.w5_scale)
        if opts.smoke:
            p = replace(p, doc_tokens=SMOKE.doc_tokens, system_tokens=64, answer_tokens=SMOKE.answer_tokens,
                        reply_tokens=SMOKE.reply_tokens, turns=2)
        wl = build_w5(p, "W5-cpu")
    elif trace == "mooncake":
        wl = _mooncake(knob, seed, opts)
    else:
        raise ValueError(f"unknown trace {trace!r} (one of {', '.join(TRACES)})")
    wl.params.update(matrix_knob=knob, matrix_knob_unit=KNOB_UNIT[trace], matrix_seed=seed,
                     too_long=too_long(wl, opts.context))
    return wl


def _mooncake(knob: float, seed: int, opts: TraceOptions) -> Workload:
    n = max(2, round(knob * opts.traffic_s))
    native = read_mooncake_jsonl(opts.mooncake_path, limit=n,
                                 length_scale=MOONCAKE_LENGTH_SCALE * opts.mooncake_scale, seed=seed)
    span = max(r.arrival_s for r in native.requests)
    # rescale so that the n rows arrive over n / knob seconds (the trace's own gaps, stretched or squeezed)
    time_scale = (n / knob) / span if span > 0 else 1.0
    for r in native.requests:
        r.arrival_s *= time_scale
        if opts.smoke:
            r.prompt = r.prompt[: SMOKE.doc_tokens]
            r.max_tokens = min(r.max_tokens, SMOKE.answer_tokens)
    native.name = "mooncake"
    native.params.update(time_scale=time_scale, rows=n)
    return native


def _scaled_w5(p, f: float):
    """W5's token lengths (documents, system prompts, questions, turns, answers, replies) times f."""
    def n(x: int) -> int:
        return max(1, round(x * f))

    return replace(p, doc_tokens=n(p.doc_tokens), system_tokens=n(p.system_tokens),
                   question_tokens=n(p.question_tokens), answer_tokens=n(p.answer_tokens),
                   user_tokens=n(p.user_tokens), reply_tokens=n(p.reply_tokens))


def too_long(wl: Workload, context: int) -> list[str]:
    """Open-loop requests whose prompt + output exceed the served context (chat turns grow with replies and
    stay far below it at these lengths)."""
    return [r.request_id for r in wl.requests if len(r.prompt) + r.max_tokens > context]


def offered_rate(wl: Workload, window_s: float) -> float:
    """Requests per second the cell offers: the open-loop arrivals within the window plus every chat turn,
    over the window (later turns are sent only while the window lasts; this is the rate they would come at
    if every reply were instant)."""
    n = sum(1 for r in wl.requests if r.arrival_s <= window_s)
    n += sum(s.num_turns for s in wl.sessions if s.start_s <= window_s)
    return n / window_s
