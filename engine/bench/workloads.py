"""Reference workloads W1, W1-smoke, W2 and W4 (../shared/WORKLOADS.md), deterministic by seed (pure Python);
W5 (phases) is in w5_workload.py, built by name here too.

A workload is open-loop requests (document questions, trace rows) with fixed prompts and arrival times,
plus closed-loop chat sessions: turn k's prompt is the whole history (system prompt, earlier user turns,
earlier replies as generated) plus the new user turn, sent when the previous reply ends plus a think time.
Text is synthetic: token ids drawn by the seed from the vocabulary above the special tokens."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace

from kvloop.engine.bench.arrivals import arrival_times, zipf_weights

VOCAB_LOW = 100  # SmolLM2's special and control tokens sit below this
VOCAB_HIGH = 49152


@dataclass
class RequestSpec:
    """One open-loop request: fixed prompt, fixed arrival time (seconds from the start of the run)."""

    request_id: str
    kind: str  # "doc", "oneoff" (W4 unique document), "trace"
    arrival_s: float
    prompt: list[int]
    max_tokens: int
    group: str = ""  # document or trace prefix it shares


@dataclass
class ChatSession:
    """A closed-loop multi-turn chat."""

    session_id: str
    start_s: float  # first turn's arrival
    system: list[int]
    user_turns: list[list[int]]
    reply_tokens: int
    think_s: list[float]  # think time after reply k (k = 0 .. turns-2), drawn by the seed

    @property
    def num_turns(self) -> int:
        return len(self.user_turns)

    def turn_id(self, k: int) -> str:
        return f"{self.session_id}-t{k}"

    def prompt(self, k: int, replies: list[list[int]]) -> list[int]:
        """Turn k's prompt from the replies to turns 0..k-1 as generated."""
        out = list(self.system)
        for i in range(k):
            out += self.user_turns[i] + list(replies[i])
        return out + self.user_turns[k]


@dataclass
class Workload:
    name: str
    requests: list[RequestSpec] = field(default_factory=list)
    sessions: list[ChatSession] = field(default_factory=list)
    params: dict = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.requests) + sum(s.num_turns for s in self.sessions)

    @property
    def output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests) + sum(s.reply_tokens * s.num_turns
                                                              for s in self.sessions)


@dataclass
class W1Params:
    """W1 and its variants. Defaults are the full-size W1 of WORKLOADS.md."""

    num_docs: int = 8
    doc_tokens: int = 2000
    zipf_s: float = 1.1
    num_doc_questions: int = 60
    question_tokens: int = 50
    answer_tokens: int = 150
    num_sessions: int = 15
    turns: int = 4
    system_tokens: int = 100
    user_tokens: int = 70
    reply_tokens: int = 200
    think_mean_s: float = 2.0
    rate: float = 1.0  # requests/s of the open-loop stream (questions and first turns)
    burstiness: float = 1.0  # 1.0: Poisson
    seed: int = 0
    unique_docs: bool = False  # W2: every question gets its own document
    unique_system: bool = False  # W2: every session its own system prompt
    oneoff_share: float = 0.0  # W4: share of questions over a unique document (one-off prompt)
    vocab_low: int = VOCAB_LOW
    vocab_high: int = VOCAB_HIGH

    def scaled(self, f: float) -> W1Params:
        """Every length (not the counts) scaled by f, at least 1 token; for CPU-sized runs."""
        def s(x: int) -> int:
            return max(1, round(x * f))
        return replace(self, doc_tokens=s(self.doc_tokens), question_tokens=s(self.question_tokens),
                       answer_tokens=s(self.answer_tokens), system_tokens=s(self.system_tokens),
                       user_tokens=s(self.user_tokens), reply_tokens=s(self.reply_tokens))


SMOKE = W1Params(num_docs=2, doc_tokens=256, num_doc_questions=6, answer_tokens=16, num_sessions=3, turns=2,
                 reply_tokens=16)


def _tokens(rng: random.Random, n: int, p: W1Params) -> list[int]:
    return [rng.randrange(p.vocab_low, p.vocab_high) for _ in range(n)]


def build_w1(p: W1Params, name: str = "W1") -> Workload:
    """W1 (and W2/W4 through the flags): Zipf document QA plus closed-loop chat, one Poisson/gamma stream."""
    rng = random.Random(p.seed)
    docs = [_tokens(rng, p.doc_tokens, p) for _ in range(p.num_docs)]
    shared_system = _tokens(rng, p.system_tokens, p)
    weights = zipf_weights(p.num_docs, p.zipf_s)
    n_open = p.num_doc_questions + p.num_sessions
    times = arrival_times(n_open, p.rate, rng, p.burstiness)
    kinds = ["doc"] * p.num_doc_questions + ["chat"] * p.num_sessions
    rng.shuffle(kinds)  # questions and first turns interleave in the one stream
    wl = Workload(name, params={"generator": "w1", **asdict(p)})
    q = s = 0
    for t, kind in zip(times, kinds, strict=True):
        if kind == "doc":
            if p.unique_docs or (p.oneoff_share and rng.random() < p.oneoff_share):
                doc, group, k = _tokens(rng, p.doc_tokens,
                                        p), f"unique{q}", "oneoff" if not p.unique_docs else "doc"
            else:
                d = rng.choices(range(p.num_docs), weights)[0]
                doc, group, k = docs[d], f"doc{d}", "doc"
            wl.requests.append(RequestSpec(f"q{q}", k, t, doc + _tokens(rng, p.question_tokens, p),
                                           p.answer_tokens, group))
            q += 1
        else:
            system = _tokens(rng, p.system_tokens, p) if p.unique_system else shared_system
            users = [_tokens(rng, p.user_tokens, p) for _ in range(p.turns)]
            think = [rng.expovariate(1.0 / p.think_mean_s) if p.think_mean_s > 0 else 0.0
                     for _ in range(p.turns - 1)]
            wl.sessions.append(ChatSession(f"c{s}", t, system, users, p.reply_tokens, think))
            s += 1
    return wl


def w1(scale: float = 1.0, **overrides) -> Workload:
    p = W1Params(**overrides)
    return build_w1(p.scaled(scale) if scale != 1.0 else p)


def w1_smoke(**overrides) -> Workload:
    return build_w1(replace(SMOKE, **overrides), "W1-smoke")


def w2(scale: float = 1.0, **overrides) -> Workload:
    """W1's lengths and arrivals with no prefix shared across requests."""
    p = replace(W1Params(**overrides), unique_docs=True, unique_system=True)
    return build_w1(p.scaled(scale) if scale != 1.0 else p, "W2")


def w4(pool_tokens: int, ratio: float, oneoff_share: float = 0.0, scale: float = 1.0,
       **overrides) -> Workload:
    """Document QA only; the documents' KV is `ratio` x the device pool; `oneoff_share` of the questions
    use a unique document instead."""
    p = replace(W1Params(**overrides), num_sessions=0, oneoff_share=oneoff_share)
    if scale != 1.0:
        p = p.scaled(scale)
    p = replace(p, num_docs=max(1, round(ratio * pool_tokens / p.doc_tokens)))
    return build_w1(p, f"W4-x{ratio:g}-oneoff{oneoff_share:g}")


def by_name(name: str, scale: float = 1.0, **overrides) -> Workload:
    name = name.lower()
    if name in ("w1-smoke", "smoke"):
        return w1_smoke(**overrides)
    if name == "w1":
        return w1(scale, **overrides)
    if name == "w2":
        return w2(scale, **overrides)
    from kvloop.engine.bench.w5_workload import W5_SCALES, w5

    if name in W5_SCALES:  # phases with their own rates: overrides chat_rate=, rag_rate= (W5Params)
        return w5(name, **overrides)
    raise ValueError(f"unknown workload {name!r} (w1, w2, w1-smoke, {', '.join(W5_SCALES)}; W3 via traces, "
                     "W4 via w4())")
