"""Prompt-lookup speculation (engine/scheduler/speculation.py, verified in runner/model_runner.py) is exact:
greedy outputs identical token for token with speculation ngram and off on prompts that copy (fp32, several
concurrent rows, cascade forced on), with stop strings, stop tokens and max_tokens landing mid-acceptance, a
JSON schema's grammar, seeded sampling, preemption under a tiny pool, a prefix-cache hit after speculation;
no block leaks. The proposals are accepted (the counters move)."""

from __future__ import annotations

import json

import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.scheduler.scheduler import SchedulerConfig

COPY_PROMPTS = [
    "Repeat this text exactly: The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Copy the list: apple, banana, cherry, date, elderberry, fig. Again: apple, banana,",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, **kw)


def run(engine, requests: list[tuple[str, list[int], SamplingParams]], max_steps: int = 400,
        preempt_at: dict[int, str] | None = None) -> dict:
    """Final outputs by request id, each with every step's logprobs gathered in new_logprobs."""
    for rid, ids, params in requests:
        engine.add_request(rid, ids, params)
    final, logprobs = {}, {}
    for step in range(max_steps):
        victim = (preempt_at or {}).get(step)
        running = [s for s in engine.scheduler.running if s.request_id == victim]
        if running:
            engine.scheduler.preempt(running[0])
        for out in engine.step():
            logprobs.setdefault(out.request_id, []).extend(out.new_logprobs)
            if out.finished:
                final[out.request_id] = out
        if not engine.has_unfinished():
            break
    for rid, out in final.items():
        out.new_logprobs = logprobs.get(rid, [])
    engine.scheduler.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    return final


def both(make_engine, requests, preempt_at=None, **kw) -> tuple[dict, dict, object]:
    off = run(make_engine(speculation="off", **kw), requests, preempt_at=preempt_at)
    spec_engine = make_engine(speculation="ngram", speculation_max_tokens=4, **kw)
    on = run(spec_engine, requests, preempt_at=preempt_at)
    return off, on, spec_engine


def engine_maker(model, dtype: torch.dtype, tokenizer, checkpoint):
    def make(**kwargs) -> EngineCore:
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs)
                                   if k in SchedulerConfig.__dataclass_fields__})
        cfg = EngineConfig(dtype=str(dtype).removeprefix("torch."), progress=False, scheduler=sched, **kwargs)
        return EngineCore(cfg, model=model, tokenizer=tokenizer, fingerprint=checkpoint.fingerprint)

    return make


@pytest.fixture(scope="module")
def make_fast(checkpoint, tokenizer):
    """fp32 arithmetic over bf16 weights through the bf16-weight kernel (--dtype auto on a CPU without
    native bf16): every step size rounds a row alike, so a single stream speculates too."""
    torch.set_num_threads(1)
    model = LlamaModel(checkpoint.config, checkpoint.weights, torch.float32, quantization="bf16")
    return engine_maker(model, torch.float32, tokenizer, checkpoint)


@pytest.fixture(scope="module", params=["fp32-kernel", "bf16"])
def make_kernel_engine(request, make_fast, checkpoint, tokenizer):
    """The serving paths: make_fast's, and a bf16 model whose linears switch to oneDNN past 12 rows."""
    if request.param == "fp32-kernel":
        return make_fast
    model = LlamaModel(checkpoint.config, checkpoint.weights, torch.bfloat16, quantization="bf16")
    return engine_maker(model, torch.bfloat16, tokenizer, checkpoint)


def same(off: dict, on: dict) -> None:
    assert off.keys() == on.keys()
    for rid in off:
        assert on[rid].token_ids == off[rid].token_ids, rid
        assert on[rid].text == off[rid].text, rid
        assert on[rid].finish_reason == off[rid].finish_reason, rid


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(p) for p in COPY_PROMPTS]


def test_greedy_identical_kernel_paths(make_kernel_engine, prompts):
    """Alone and four at once, cascade forced on: the serving paths' rows round alike at every step size
    up to the probe's bound, so a single stream speculates too."""
    accepted = 0
    for i, ids in enumerate(prompts[:2]):
        off, on, eng = both(make_kernel_engine, [(f"r{i}", ids, greedy(20, ignore_eos=True))],
                            kv_cache_tokens=2048)
        same(off, on)
        accepted += eng.scheduler.speculator.stats.num_accepted_tokens
    reqs = [(f"r{i}", ids, greedy(16, ignore_eos=True)) for i, ids in enumerate(prompts)]
    off, on, eng = both(make_kernel_engine, reqs, kv_cache_tokens=2048, cascade="always")
    same(off, on)
    assert accepted + eng.scheduler.speculator.stats.num_accepted_tokens > 0


def test_fp32_gemm_size_classes(make_engine):
    """torch's fp32 GEMM rounds a row differently at 1, 2-3 and 4+ rows here: a lone fp32 row never
    speculates (its exactness would rest on luck), four rows do."""
    classes = make_engine(speculation="ngram").scheduler.speculator.size_classes
    assert classes is not None and classes[1] != classes[4]


def test_greedy_identical_concurrent_cascade(make_engine, prompts):
    reqs = [(f"r{i}", ids, greedy(20, ignore_eos=True)) for i, ids in enumerate(prompts)]
    # a shared prefix, so cascade groups form among the rows' own entries
    shared = prompts[1]
    reqs += [(f"s{i}", shared + prompts[i][:5], greedy(16, ignore_eos=True)) for i in range(2)]
    off, on, eng = both(make_engine, reqs, kv_cache_tokens=4096, cascade="always",
                        max_num_batched_tokens=64)
    same(off, on)
    assert eng.scheduler.speculator.stats.num_accepted_tokens > 0


def test_stops_mid_acceptance(make_fast, tokenizer, prompts):
    ids = prompts[3]  # counts on: proposals accepted several at a time
    reqs = [("len", ids, greedy(7, ignore_eos=True)),
            ("str", ids, greedy(24, ignore_eos=True, stop=[" 17,"])),
            ("tok", ids, greedy(24, ignore_eos=True, stop_token_ids=tokenizer.encode(" 16")[:1]))]
    off, on, eng = both(make_fast, reqs, kv_cache_tokens=2048)
    same(off, on)
    assert on["str"].finish_reason == "stop" and on["len"].finish_reason == "length"
    assert eng.scheduler.speculator.stats.num_accepted_tokens > 0


def test_logprobs_and_seeded_sampling(make_fast, prompts):
    reqs = [("lp", prompts[0], greedy(16, ignore_eos=True, logprobs=2)),
            ("seed", prompts[1], SamplingParams(max_tokens=20, temperature=0.8, seed=5, ignore_eos=True)),
            ("pen", prompts[2], greedy(16, ignore_eos=True, frequency_penalty=0.5)),
            ("extra", prompts[3], greedy(16, ignore_eos=True))]
    off, on, _ = both(make_fast, reqs, kv_cache_tokens=2048)
    same(off, on)
    assert [lp.token_id for lp in on["lp"].new_logprobs] == on["lp"].token_ids
    assert [(lp.token_id, lp.logprob) for lp in on["lp"].new_logprobs] == \
        [(lp.token_id, lp.logprob) for lp in off["lp"].new_logprobs]


@pytest.mark.parametrize("host", [0, 1024])
def test_preemption_no_leak(make_fast, prompts, host):
    """A speculating row preempted (recompute, or swap to the host tier) between steps resumes exactly."""
    reqs = [(f"r{i}", ids, greedy(16, ignore_eos=True)) for i, ids in enumerate(prompts)]
    kv = KVConfig(min_prefix_tokens=16, admit_min_requests=1, host_cache_tokens=host)
    off, on, eng = both(make_fast, reqs, preempt_at={4: "r3", 6: "r2"}, kv=kv, kv_cache_tokens=2048)
    same(off, on)
    assert eng.scheduler.num_preemptions == 2 and eng.scheduler.speculator.stats.num_accepted_tokens > 0


CACHE = KVConfig(min_prefix_tokens=16, admit_min_requests=1)  # every finished block cached at once


def test_prefix_cache_hit_after_speculation(make_fast, prompts):
    ids = prompts[1]
    answer = [("a", ids, greedy(24, ignore_eos=True))]
    off = run(make_fast(speculation="off", kv_cache_tokens=2048, kv=CACHE), answer)
    eng = make_fast(speculation="ngram", kv_cache_tokens=2048, kv=CACHE)
    first = run(eng, answer)
    same(off, first)
    # the whole first answer as a prompt: its blocks (accepted tokens only) come from the cache
    again = ids + first["a"].token_ids
    follow_up = [("b", again, greedy(16, ignore_eos=True))]
    cold = run(make_fast(speculation="off", kv_cache_tokens=2048, kv=CACHE), follow_up)
    hit = run(eng, follow_up)
    assert hit["b"].num_cached_tokens > len(ids)
    same(cold, hit)
    assert eng.scheduler.speculator.stats.num_accepted_tokens > 0


def test_json_schema_with_speculation(make_fast, tokenizer):
    """The grammar masks every verified position: the same constrained tokens, valid JSON, matchers gone."""
    from kvloop.engine.core.grammar_spec import parse_response_format

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
              "required": ["name", "city"]}
    spec = parse_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    text = tokenizer.render_chat([{"role": "user", "content": 'Copy this JSON: {"name": "Ada Lovelace", '
                                                              '"city": "London"}'}])
    reqs = [("j", tokenizer.encode(text), SamplingParams(max_tokens=32, temperature=0, grammar=spec))]
    off, on, eng = both(make_fast, reqs, kv_cache_tokens=2048)
    same(off, on)
    json.loads(on["j"].text)
    assert eng.runner.sampler.processors[-1]._matchers == {}


def test_sampling_keeps_the_target_distribution():
    """temperature 1 over fixed per-position distributions, a deterministic draft [0, 1]: the first token
    follows p0, the second (given the first was the draft's) p1, the third p2, by a chi-square bound
    (df 3, p = 0.001: 16.27) over 1,500 seeded requests."""
    from kvloop.engine.core.batch import ScheduledSeq, StepResult
    from kvloop.engine.core.sequence import Sequence
    from kvloop.engine.runner.model_runner import verify
    from kvloop.engine.runner.sampler import Sampler

    dists = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    logits = dists.log()
    sampler = Sampler()
    counts = torch.zeros(3, 4)
    for i in range(1500):
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=i)
        seq = Sequence(f"q{i}", [3, 3], params)
        item = ScheduledSeq(seq, 1, 1, draft=[0, 1])
        first = sampler.sample(logits[:1], [params], [seq.request_id], [seq]).tokens[0]
        result = StepResult({seq.request_id: first})
        verify(sampler, logits, [item], {seq.request_id: 1}, result)
        tokens = result.tokens_of(seq.request_id)
        for pos, t in enumerate(tokens):
            counts[pos, t] += 1
        assert all(a == b for a, b in zip(tokens[:-1], item.draft, strict=False))  # accepted = the draft's
        sampler.forget(seq.request_id)
    for pos in range(3):
        n = counts[pos].sum()
        expected = dists[pos] * n
        chi2 = float(((counts[pos] - expected) ** 2 / expected).sum())
        assert n > 100 and chi2 < 16.27, (pos, counts[pos].tolist(), chi2)


def test_auto_exact_and_yields_to_waiting(make_fast, prompts):
    """auto speculates on a small step (by the measured step and the attention cost model) and gives the same
    tokens; while a request waits for a row (batch cap 1) it proposes nothing."""
    reqs = [("a", prompts[3], greedy(16, ignore_eos=True))]
    off = run(make_fast(speculation="off", kv_cache_tokens=2048), reqs)
    eng = make_fast(speculation="auto", kv_cache_tokens=2048)
    same(off, run(eng, reqs))
    assert eng.scheduler.speculator.stats.num_accepted_tokens > 0
    eng = make_fast(speculation="auto", kv_cache_tokens=2048, max_num_seqs=1, mode="continuous")
    eng.add_request("first", prompts[3], greedy(8, ignore_eos=True))
    eng.add_request("second", prompts[1], greedy(2, ignore_eos=True))
    while eng.scheduler.waiting:
        eng.step()
        assert eng.scheduler.speculator.stats.num_draft_tokens == 0
    eng.drain(max_steps=100)


def test_process_backend_output_path(make_fast, tokenizer, prompts):
    """The process backend's path: the core sends token ids only (several per step when proposals are
    accepted), the API process detokenizes them and matches stop strings (server/front_output.py): the same
    text and tokens as the in-process engine's, the stop string mid-step included."""
    from kvloop.engine.server.front_output import FrontOutput, params_for_core

    params = greedy(24, ignore_eos=True, stop=[" 17,"])
    expected = run(make_fast(speculation="off", kv_cache_tokens=2048), [("p", prompts[3], params)])["p"]
    core = make_fast(speculation="ngram", kv_cache_tokens=2048)
    core.detokenize = False
    core.add_request("p", prompts[3], params_for_core(params))
    front = FrontOutput("p", params, tokenizer)
    result, stopped = None, False
    for _ in range(100):
        for out in core.step():
            result, stopped = front.apply(out)
        if stopped or (result is not None and result.finished):
            break
    if stopped:
        core.abort("p", "stop")
    assert result.text == expected.text and result.token_ids == expected.token_ids
    assert result.finish_reason == "stop"
    assert core.scheduler.speculator.stats.num_accepted_tokens > 0
    assert core.kv.num_free_blocks == core.kv.num_blocks
