"""W5, memory pressure with shifting phases (../shared/WORKLOADS.md), deterministic by seed (pure Python).

Phases alternate every `phase_s` seconds: a chat phase (80% chat turns, 20% RAG) and a RAG phase (80% RAG,
a quarter of it over one-off unique documents). Each phase has its own arrival rate (requests/s, chat turns
and RAG questions together). RAG questions are open loop (Poisson within the phase); chat sessions are
closed loop (the bench's ChatSession: turn k+1 is sent when reply k ends plus a think time), and their first
turns arrive by Poisson at the phase's chat-turn rate / turns, so that once sessions are under way the
phase's chat turns arrive at about its chat share of the rate. Sessions started late in a phase finish
their turns in the next one (closed loop: a user does not stop because the mix changed).

The number of sessions and questions follows from the rates and the duration; `phases_of` gives the plan
(index, kind, window, rate) that the per-phase report splits on (engine.bench.phases)."""

from __future__ import annotations

import gc
import itertools
import random
from dataclasses import asdict, dataclass, replace

from kvloop.engine.bench.arrivals import arrivals_between, zipf_weights
from kvloop.engine.bench.workloads import VOCAB_HIGH, VOCAB_LOW, ChatSession, RequestSpec, Workload

CHAT, RAG = "chat", "rag"
LLAMA3_VOCAB = 128256


@dataclass(frozen=True)
class W5Params:
    """Defaults are W5's GPU scale (Llama-3.1-70B on an H200); `W5_CPU` is the CPU scale."""

    # Requests/s during chat / RAG phases. GPU defaults: 0.9 x continuous+lru's capacity in each phase alone
    # in the simulator (`bench/w5.py capacity --scale gpu --ttft-pct 50`: the highest rate whose median TTFT
    # stays <= 2 s, i.e. near saturation: chat 3.0, RAG 1.21 req/s). WORKLOADS.md's capacity SLO (TTFT P99 <=
    # 2 s, the default --ttft-pct 99) gives chat 2.42, RAG 0.51: there the pool stays 10-40% used and every
    # system ties, so W5 would not bind memory. Rerun after the engine or the simulator changes.
    chat_rate: float = 2.7
    rag_rate: float = 1.09
    duration_s: float = 3600.0  # arrivals stop here (closed-loop turns of live sessions still follow)
    phase_s: float = 300.0
    kinds: tuple[str, ...] = (CHAT, RAG)  # phase kinds, repeated in this order; (RAG,): a RAG phase alone
    chat_share: float = 0.8  # of a chat phase's requests that are chat turns
    rag_share: float = 0.8  # of a RAG phase's requests that are RAG questions
    oneoff_share: float = 0.25  # of RAG questions over a unique document
    num_docs: int = 400
    doc_tokens: int = 6000
    zipf_s: float = 0.8
    question_tokens: int = 80
    answer_tokens: int = 250
    num_systems: int = 10  # system/tool prompts, each shared by its sessions
    system_tokens: int = 1500
    turns: int = 6
    user_tokens: int = 150
    reply_tokens: int = 300
    think_mean_s: float = 5.0
    burstiness: float = 1.0  # 1.0: Poisson
    kv_cache_tokens: int | None = None  # the device pool W5 prescribes at this scale (None: the profile's)
    seed: int = 0
    vocab_low: int = VOCAB_LOW
    vocab_high: int = LLAMA3_VOCAB

    def rate(self, kind: str) -> float:
        return self.chat_rate if kind == CHAT else self.rag_rate

    def chat_fraction(self, kind: str) -> float:
        """Share of a phase's requests that are chat turns."""
        return self.chat_share if kind == CHAT else 1.0 - self.rag_share


W5_GPU = W5Params()
# CPU scale (embedded SmolLM2-135M): WORKLOADS.md's numbers; the question length (40) and the think time
# (5 s, as at GPU scale) are not stated there and are ours. Rates: 0.9 x the capacities the simulator's CPU
# profile gives (`bench/w5.py capacity --scale cpu --ttft-pct 50`: chat 0.52, RAG 0.25 req/s), a start
# until `--engine real` has measured them on the machine that runs the benchmark.
W5_CPU = W5Params(chat_rate=0.47, rag_rate=0.225, duration_s=720.0, phase_s=120.0, num_docs=48,
                  doc_tokens=1500,
                  question_tokens=40, answer_tokens=120, num_systems=6, system_tokens=400, turns=4,
                  user_tokens=60,
                  reply_tokens=120, kv_cache_tokens=12288, vocab_high=VOCAB_HIGH)
W5_SCALES = {"w5": W5_CPU, "w5-gpu": W5_GPU}  # the workload names (CLI choices come from here)


@dataclass(frozen=True)
class Phase:
    index: int
    kind: str
    start_s: float
    end_s: float
    rate: float

    @property
    def name(self) -> str:
        return f"{self.index}:{self.kind}"


def phase_plan(p: W5Params) -> list[Phase]:
    out, t, i = [], 0.0, 0
    while t < p.duration_s - 1e-9:
        kind = p.kinds[i % len(p.kinds)]
        end = min(t + p.phase_s, p.duration_s)
        out.append(Phase(i, kind, t, end, p.rate(kind)))
        t, i = end, i + 1
    return out


def phases_of(wl: Workload) -> list[Phase]:
    """The phase plan a W5 workload was built with ([] for workloads without phases)."""
    return [Phase(**d) for d in wl.params.get("phases", [])]


HEAD_TOKENS = 16  # fresh random tokens at the start of every generated sequence


class _Tokens:
    """Synthetic token ids drawn by the seed. A sequence is HEAD_TOKENS fresh draws followed by a slice (at a
    drawn offset) of one seeded random pool. Prefix caches key a block by everything before it (chained
    block hashes here, radix trees elsewhere), so a sequence whose first block is its own shares no cached
    block with any other sequence, exactly as if it were random throughout; a 6,000-token one-off document
    then costs a list slice, not 6,000 draws. Ids are shared int objects (a prompt costs its pointers)."""

    def __init__(self, rng: random.Random, low: int, high: int, longest: int):
        self.rng, self.population = rng, list(range(low, high))
        self.pool = rng.choices(self.population, k=max(65536, 4 * longest))

    def __call__(self, n: int) -> list[int]:
        head = self.rng.choices(self.population, k=min(n, HEAD_TOKENS))
        body = n - len(head)
        if body <= 0:
            return head
        off = self.rng.randrange(len(self.pool) - body + 1)
        return head + self.pool[off:off + body]


def build_w5(p: W5Params, name: str = "W5") -> Workload:
    # The cyclic GC would walk every prompt list built so far at each collection (minutes at GPU scale);
    # nothing here makes cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build_w5(p, name)
    finally:
        if enabled:
            gc.enable()


def _build_w5(p: W5Params, name: str) -> Workload:
    rng = random.Random(p.seed)
    tok = _Tokens(rng, p.vocab_low, p.vocab_high, max(p.doc_tokens, p.system_tokens, p.user_tokens,
                                                       p.question_tokens))
    docs = [tok(p.doc_tokens) for _ in range(p.num_docs)]
    systems = [tok(p.system_tokens) for _ in range(p.num_systems)]
    cum_weights = list(itertools.accumulate(zipf_weights(p.num_docs, p.zipf_s)))
    plan = phase_plan(p)
    wl = Workload(name, params={"generator": "w5", **asdict(p), "phases": [asdict(ph) for ph in plan]})
    q = s = 0
    for ph in plan:
        chat = p.chat_fraction(ph.kind)
        rag_times = arrivals_between(ph.start_s, ph.end_s, ph.rate * (1.0 - chat), rng, p.burstiness)
        start_times = arrivals_between(ph.start_s, ph.end_s, ph.rate * chat / p.turns, rng, p.burstiness)
        for t in rag_times:
            if rng.random() < p.oneoff_share:
                doc, group, kind = tok(p.doc_tokens), f"unique{q}", "oneoff"
            else:
                d = rng.choices(range(p.num_docs), cum_weights=cum_weights)[0]
                doc, group, kind = docs[d], f"doc{d}", "doc"
            wl.requests.append(RequestSpec(f"q{q}", kind, t, doc + tok(p.question_tokens), p.answer_tokens,
                                           group))
            q += 1
        for t in start_times:
            system = systems[rng.randrange(p.num_systems)]
            users = [tok(p.user_tokens) for _ in range(p.turns)]
            think = [rng.expovariate(1.0 / p.think_mean_s) if p.think_mean_s > 0 else 0.0
                     for _ in range(p.turns - 1)]
            wl.sessions.append(ChatSession(f"c{s}", t, system, users, p.reply_tokens, think))
            s += 1
    wl.requests.sort(key=lambda r: r.arrival_s)
    wl.sessions.sort(key=lambda x: x.start_s)
    return wl


def w5(name: str = "w5", phase_rates: tuple[float, float] | None = None, **overrides) -> Workload:
    """W5 at a named scale ('w5': CPU, 'w5-gpu': GPU), optionally at other (chat, RAG) phase rates."""
    p = W5_SCALES[name.lower()]
    if phase_rates is not None:
        overrides.update(chat_rate=float(phase_rates[0]), rag_rate=float(phase_rates[1]))
    p = replace(p, **overrides)
    return build_w5(p, "W5-gpu" if name.lower() == "w5-gpu" else "W5")


def parse_phase_rates(text: str | None) -> tuple[float, float] | None:
    """'chat,rag' in requests/s -> (chat, rag); None/empty -> None."""
    if not text:
        return None
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 2 or min(parts) <= 0:
        raise ValueError(f"--phase-rates wants two positive rates 'chat,rag', got {text!r}")
    return parts[0], parts[1]
