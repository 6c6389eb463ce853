"""Turns logits into tokens: logits processors (bias, penalties), greedy, temperature, top-k, top-p,
per-request seeds, logprobs.

A row that fails (its processor, its generator, its probabilities) fails alone: each stage runs batched
first and, only when the batched call raises, again row by row to find the culprit; the failed rows get
an error instead of a token and every other row is sampled as usual."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence, TokenLogprob
from kvloop.engine.runner.logits_processors import LogitsProcessor, SampleRow, default_processors


@dataclass
class Sampled:
    tokens: list[int | None]  # None where the row failed
    logprobs: list[TokenLogprob | None]
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (stage, what went wrong)


class Sampler:
    def __init__(self, processors: list[LogitsProcessor] | None = None) -> None:
        self._generators: dict[str, torch.Generator] = {}  # per seeded request
        self.processors: list[LogitsProcessor] = default_processors() if processors is None else processors

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        for proc in self.processors:  # processors with per-request state (a grammar's matcher)
            if hasattr(proc, "forget"):
                proc.forget(request_id)

    def _generator(self, request_id: str, seed: int | None, device: torch.device) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            # multinomial needs it on the logits' device
            gen = torch.Generator(device=device).manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], request_ids: list[str],
               seqs: list[Sequence] | None = None) -> Sampled:
        """logits: float32 [B, vocab], the model's; the processors edit a copy. seqs: each row's sequence
        (processors read what it generated so far). Logprobs are the model's own, before any processor,
        temperature or truncation (as vLLM and OpenAI report them)."""
        rows = [SampleRow(rid, p, seqs[i] if seqs is not None else None)
                for i, (rid, p) in enumerate(zip(request_ids, params, strict=True))]
        errors: dict[int, tuple[str, str]] = {}
        raw = logits
        for proc in self.processors:
            wanted = [i for i, r in enumerate(rows) if i not in errors and proc.wants(r)]
            if wanted:
                if logits is raw:  # copied once, only in steps where some row is processed
                    logits = raw.clone()
                self._process(proc, logits, rows, wanted, errors)
        live = [i for i in range(len(rows)) if i not in errors]
        tokens: list[int | None] = [None] * len(rows)
        self._tokens(logits, rows, live, tokens, errors)
        self._accept(rows, tokens, errors)
        logprobs: list[TokenLogprob | None] = [None] * len(rows)
        wanted = [i for i in range(len(rows)) if i not in errors and params[i].logprobs is not None]
        _isolated(wanted, errors, "logprobs", lambda part: _logprobs(raw, params, part, tokens, logprobs))
        for i in errors:
            tokens[i], logprobs[i] = None, None
        return Sampled(tokens, logprobs, errors)

    @staticmethod
    def _process(proc: LogitsProcessor, logits: torch.Tensor, rows: list[SampleRow], wanted: list[int],
                 errors: dict[int, tuple[str, str]]) -> None:
        def run(part: list[int]) -> None:
            sub = logits[part]  # a copy: a processor that raises half-way leaves the batch untouched
            proc.apply(sub, [rows[i] for i in part])
            logits[part] = sub

        _isolated(wanted, errors, proc.name, run)

    def _tokens(self, logits: torch.Tensor, rows: list[SampleRow], live: list[int], tokens: list[int | None],
                errors: dict[int, tuple[str, str]]) -> None:
        """Greedy rows from one batched argmax; the others sampled one by one, each in its own try (a
        seeded generator must advance exactly once per step, so a row is never sampled twice)."""
        if not live:
            return
        sub = logits if len(live) == logits.shape[0] else logits[live]
        maxima, greedy = sub.max(dim=-1)  # one reduction: the values and the greedy tokens
        for j, (i, value, index) in enumerate(zip(live, maxima.tolist(), greedy.tolist(), strict=True)):
            if value != value or value == float("-inf"):  # nan from the model, or every token masked
                errors[i] = ("sampling", "no token can be sampled: the logits are not finite or every token "
                                         "is masked")
                continue
            p = rows[i].params
            if p.greedy:
                tokens[i] = index
                continue
            try:
                gen = self._generator(rows[i].request_id, p.seed, logits.device)
                tokens[i] = self._sample_row(sub[j], p, gen)
            except Exception as exc:  # noqa: BLE001 - this request's failure, reported to it alone
                errors[i] = ("sampling", f"{type(exc).__name__}: {exc}")

    def _accept(self, rows: list[SampleRow], tokens: list[int | None],
                errors: dict[int, tuple[str, str]]) -> None:
        """Processors with per-request state (a grammar) advance with each sampled token, row by row."""
        for proc in self.processors:
            if not hasattr(proc, "accept"):
                continue
            for i, row in enumerate(rows):
                if i in errors or tokens[i] is None or not proc.wants(row):
                    continue
                try:
                    proc.accept(row, tokens[i])
                except Exception as exc:  # noqa: BLE001 - this request's failure, reported to it alone
                    errors[i] = (proc.name, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        scores = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(scores, min(p.top_k, scores.shape[-1])).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_scores, order = scores.sort(descending=True)
            probs = sorted_scores.softmax(-1)
            # drop tokens once the mass before them already reaches top_p; the top token always stays, even
            # when top_p is below what float32 can hold
            drop = probs.cumsum(-1) - probs >= p.top_p
            drop[0] = False
            sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
        probs = scores.softmax(-1)
        return int(torch.multinomial(probs, 1, generator=gen))


def _logprobs(logits: torch.Tensor, params: list[SamplingParams], part: list[int], tokens: list[int | None],
              out: list[TokenLogprob | None]) -> None:
    lp = torch.log_softmax(logits[part], dim=-1)
    for j, i in enumerate(part):
        k = params[i].logprobs
        top = []
        if k:
            values, ids = lp[j].topk(min(k, lp.shape[-1]))
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        out[i] = TokenLogprob(tokens[i], float(lp[j, tokens[i]]), top)


def _isolated(part: list[int], errors: dict[int, tuple[str, str]], stage: str,
              run: Callable[[list[int]], None]) -> None:
    """Runs a stage (free of side effects) over rows `part` at once; if it raises, runs it row by row to
    record the failing rows in errors, so that the rest of the batch still goes through."""
    if not part:
        return
    try:
        run(part)
        return
    except Exception as exc:  # noqa: BLE001 - narrowed down row by row below
        if len(part) == 1:
            errors[part[0]] = (stage, f"{type(exc).__name__}: {exc}")
            return
    for i in part:
        _isolated([i], errors, stage, run)
