"""W1 (the article's mix) and W2 (its no-reuse control), per ../shared/WORKLOADS.md.

Own minimal generator: no shared one was importable from bench/ when this was written. Document
questions and first chat turns arrive in one Poisson stream at `rate_open` (interleaved in a seeded
shuffle); later turns follow the previous reply after an exponential think time."""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvloop.engine.sim.workload import RequestSpec


@dataclass
class W1Params:
    num_docs: int = 8
    doc_tokens: int = 2000
    zipf_s: float = 1.1
    num_questions: int = 60
    question_tokens: int = 50
    answer_tokens: int = 150
    num_sessions: int = 15
    turns: int = 4
    system_tokens: int = 100
    user_tokens: int = 70
    reply_tokens: int = 200
    think_mean_s: float = 2.0
    rate: float = 1.0  # open-loop arrivals per second (questions + first turns)
    vocab: int = 49152
    seed: int = 0
    no_reuse: bool = False  # W2: a document per question, a system prompt per session

    @classmethod
    def smoke(cls, **kw) -> W1Params:
        base = dict(num_docs=2, doc_tokens=256, num_questions=6, num_sessions=3, turns=2, answer_tokens=16,
                    reply_tokens=16)
        return cls(**{**base, **kw})

    @classmethod
    def gpu_hour(cls, rate: float, duration_s: float = 3600.0, **kw) -> W1Params:
        """WORKLOADS.md 'GPU scale': 200 documents, Llama-3 vocabulary; the counts fill duration_s
        at `rate` requests/s in all (half questions, half chat turns)."""
        total = rate * duration_s
        turns = kw.pop("turns", 4)
        base = dict(num_docs=200, vocab=128256, num_questions=int(total / 2), turns=turns,
                    num_sessions=max(1, int(total / 2 / turns)))
        base.update(kw)
        p = cls(**base)
        p.rate = (p.num_questions + p.num_sessions) / duration_s  # open-loop stream over the hour
        return p

    @property
    def total_requests(self) -> int:
        return self.num_questions + self.num_sessions * self.turns


class W1:
    def __init__(self, params: W1Params):
        self.p = p = params
        self.name = "w2" if p.no_reuse else "w1"
        self.rng = random.Random(p.seed)
        rng = random.Random(p.seed * 7919 + 1)
        self._rand = lambda n: [rng.randrange(3, p.vocab) for _ in range(n)]
        self.docs = [self._rand(p.doc_tokens) for _ in range(p.num_docs)] if not p.no_reuse else []
        self.system = self._rand(p.system_tokens)
        weights = [1.0 / (k + 1) ** p.zipf_s for k in range(p.num_docs)]
        total = sum(weights)
        self.zipf = [w / total for w in weights]
        self.history: dict[str, list[int]] = {}

    def initial(self) -> list[RequestSpec]:
        p, rng = self.p, self.rng
        kinds = ["doc"] * p.num_questions + ["chat"] * p.num_sessions
        rng.shuffle(kinds)
        out, t, nq, ns = [], 0.0, 0, 0
        for kind in kinds:
            t += rng.expovariate(p.rate)
            if kind == "doc":
                doc = self._rand(p.doc_tokens) if p.no_reuse else self.docs[self._pick_doc()]
                out.append(RequestSpec(f"q{nq}", doc + self._rand(p.question_tokens), p.answer_tokens, t, "doc"))
                nq += 1
            else:
                sid = f"s{ns}"
                system = self._rand(p.system_tokens) if p.no_reuse else self.system
                self.history[sid] = list(system)
                out.append(self._turn(sid, 0, t))
                ns += 1
        return out

    def _pick_doc(self) -> int:
        x, acc = self.rng.random(), 0.0
        for i, w in enumerate(self.zipf):
            acc += w
            if x < acc:
                return i
        return len(self.zipf) - 1

    def _session_rng(self, sid: str, turn: int) -> random.Random:
        """Per (session, turn), so user turns and think times do not depend on completion order."""
        return random.Random(f"{self.p.seed}:{sid}:{turn}")

    def _turn(self, sid: str, turn: int, t: float) -> RequestSpec:
        hist = self.history[sid]
        rng = self._session_rng(sid, turn)
        hist.extend(rng.randrange(3, self.p.vocab) for _ in range(self.p.user_tokens))
        return RequestSpec(f"{sid}t{turn}", list(hist), self.p.reply_tokens, t, "chat", session=sid, turn=turn)

    def on_finish(self, spec: RequestSpec, output: list[int], now: float) -> list[RequestSpec]:
        if spec.kind != "chat":
            return []
        hist = self.history[spec.session]
        hist.extend(output)  # the reply as generated
        if spec.turn + 1 >= self.p.turns:
            del self.history[spec.session]
            return []
        return [self._turn(spec.session, spec.turn + 1, now + self._session_rng(spec.session, -1 - spec.turn).expovariate(1.0 / self.p.think_mean_s))]
