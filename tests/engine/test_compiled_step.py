"""The compiled step (runner/compiled_step.py) against eager on a tiny random Llama in fp32: the same greedy
tokens and logits within float rounding over a mixed schedule (chunked prefill, decode batches of 1 to 6 rows,
prefill and decode in one step, a shared prefix decoded as a cascade group), with no step needing a second
graph after warm-up, and a request's tokens the same alone as among the others (batch invariance). The step
saved to disk (runner/step_artefact.py) loads in a fresh CompiledStep and gives the traced step's bits; a
damaged file is compiled again. Compiles of a small model only, so this stays a few
seconds with warm caches."""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.runner import compiled_step, step_artefact
from kvloop.engine.scheduler.scheduler import SchedulerConfig

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position=512)
SHARED = [random.Random(1).randrange(512) for _ in range(70)]  # 4 blocks and a bit: past min_prefix_tokens
compiles = pytest.mark.skipif(compiled_step.compiler_missing() is not None,
                              reason="no C++ compiler for inductor")


def schedule() -> dict[int, list[tuple[str, list[int], int]]]:
    """step -> requests (id, prompt, max_tokens) that arrive before it."""
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(512) for _ in range(n)]

    return {0: [("a", prompt(5), 9)], 1: [("b", prompt(40), 6)], 2: [("c", SHARED + prompt(3), 7)],
            3: [("d", SHARED + prompt(9), 7), ("e", prompt(1), 5)], 6: [("f", prompt(23), 4)]}


def engine(model: LlamaModel, compile: str) -> EngineCore:
    cfg = EngineConfig(dtype="float32", compile=compile, cascade="always", kv_cache_tokens=1024,
                       progress=False,
                       scheduler=SchedulerConfig(max_num_batched_tokens=24))
    return EngineCore(cfg, model=model)


def run(eng: EngineCore, plan: dict[int, list[tuple[str, list[int], int]]],
        sampled: list[dict[str, list[int]]] | None = None) -> tuple[dict, list[torch.Tensor]]:
    """Runs the plan: each request's final tokens and every step's logits (all rows); in `sampled`, each
    step's tokens so far per request."""
    eng.runner.keep_all_logits = True
    final, logits = {}, []
    for step in range(200):
        for rid, ids, n in plan.get(step, []):
            eng.add_request(rid, ids, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        outs = eng.step()
        final.update({o.request_id: o.token_ids for o in outs if o.finished})
        if sampled is not None:
            sampled.append({o.request_id: o.token_ids for o in outs})
        logits.append(eng.runner.last_logits)
        if step > max(plan) and not eng.has_unfinished():
            return final, logits
    raise AssertionError("the schedule did not finish")


@compiles
# the suite turns torch.compile off for every other test (conftest)
@torch._dynamo.config.patch(disable=False)
def test_compiled_step_equals_eager():
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.2), torch.float32)
    compiled = engine(model, "on")
    step = compiled.runner.compiled
    assert step is not None and step.warm, "compiling the tiny model failed (see the log)"
    step.stance_when_warm = "fail_on_recompile"  # any step needing a second graph fails the test
    try:
        got, got_logits = run(compiled, schedule())
        alone, _ = run(engine(model, "on"), {0: [("alone", SHARED + [7, 7, 7], 7)]})
        among, _ = run(engine(model, "on"), {**schedule(), 4: [("alone", SHARED + [7, 7, 7], 7)]})
    finally:
        step.stance_when_warm = "eager_on_recompile"
    expected, expected_logits = run(engine(model, "off"), schedule())
    assert got == expected
    assert all(len(v) == n for reqs in schedule().values() for rid, _, n in reqs for v in [got[rid]])
    for a, b in zip(got_logits, expected_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    assert alone["alone"] == among["alone"]
    assert compiled.runner.cascade_group_sizes, "no step decoded the shared prefix as a group"


@compiles
@torch._dynamo.config.patch(disable=False)
@pytest.mark.parametrize("pairs,tiles", [(False, False), (True, False), (True, True)])
def test_a_bf16_model_with_the_bf16_weight_kernel_compiles_a_graph_for_each_of_its_branches(monkeypatch,
                                                                                            pairs, tiles):
    """Built without bf16 pairs, a bf16 model's linears take the kernel up to DENSE_ABOVE_ROWS rows and
    torch's GEMM over the dense copy above: two graphs, compiled at warm-up, serve decode steps of
    1-6 rows (the kernel's) and
    24-token prefill chunks (the GEMM's) with no other graph, with eager's logits. So do
    bf16 pairs with AMX tiles
    (AMX_DENSE_ABOVE_ROWS). With bf16 pairs (AVX512-BF16) and no AMX the kernel serves both from one graph,
    and no dense copy is kept."""
    from kvloop.engine.kernels.cpu import amx, linear_bf16w

    if not linear_bf16w.available() or (pairs and not linear_bf16w.native()):
        pytest.skip("the bf16-weight kernel is not built (with bf16 pairs)")
    monkeypatch.setattr(linear_bf16w, "native", lambda: pairs)
    monkeypatch.setattr(amx, "available", lambda: tiles)
    # the pairs' bound under AMX: with the kernel's own tiles (bound 64) both would take the kernel's graph
    monkeypatch.setattr(linear_bf16w, "tiles", lambda: False)
    # the schedule's decodes (1-6 rows) and chunks (24 tokens) fall on either side
    assert 6 <= linear_bf16w.AMX_DENSE_ABOVE_ROWS < 24 and 6 < linear_bf16w.DENSE_ABOVE_ROWS < 24
    one_graph = pairs and not tiles  # the kernel serves every step: one graph, no dense copy
    # bf16 logits tie often (0.03 apart near 4), and bf16 noise (about 0.06 here) flips such a greedy tie; the
    # runs then feed different tokens. So logits compare up to and including the first step whose sampled
    # tokens differ (within the bound below, a flip there is a tie). Which weight seeds flip
    # depends on the CPU's kernels:
    # the first seed whose runs share step 0's token (a 5-row prefill, the kernel's
    # branch) compares step 1 too (a
    # 24-token chunk, the GEMM's branch) and more.
    for seed in (6, 7, 8, 9):
        model = LlamaModel(TINY, random_weights(TINY, seed=seed, std=0.2), torch.bfloat16,
                           quantization="bf16")
        # a dense copy for oneDNN?
        assert model.lm_head.fmt == "bf16" and (model.lm_head.weight is None) == one_graph
        compiled_logits, eager_logits, parted = compiled_and_eager_bf16(model)
        if parted >= 1:
            break
    assert parted >= 1, "every seed's runs parted at the first token"
    # inductor fuses the bf16 elementwise ops anew (each op rounded to bf16 in eager,
    # not inside a fused loop):
    # the same tiny model with dense bf16 weights differs from eager as much (mean |diff| 0.011-0.015, max
    # 0.05-0.11); a wrong branch or weight would be off by O(1) almost everywhere
    for a, b in zip(compiled_logits[: parted + 1], eager_logits[: parted + 1], strict=True):
        diff = (a.float() - b.float()).abs()
        assert diff.max() <= 0.2 and diff.mean() <= 0.03


def compiled_and_eager_bf16(model: LlamaModel) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The schedule through the compiled step (one graph: any recompile fails) and eager: each run's logits
    per step, and the first step whose sampled tokens differ (the last step where none does)."""

    def bf16_engine(compile: str) -> EngineCore:
        cfg = EngineConfig(dtype="bfloat16", compile=compile, kv_cache_tokens=1024, progress=False,
                           scheduler=SchedulerConfig(max_num_batched_tokens=24))
        return EngineCore(cfg, model=model)

    compiled = bf16_engine("on")
    step = compiled.runner.compiled
    assert step is not None and step.warm, "compiling the tiny model failed (see the log)"
    two = model.lm_head.weight is not None
    assert (step.dense_above is not None) == two and [g.dense for g in step._graphs] == ([False,
                                                                                          True] if two
                                                                                          else [None])
    step.stance_when_warm = "fail_on_recompile"
    got_tokens: list[dict[str, list[int]]] = []
    try:
        got, got_logits = run(compiled, schedule(), got_tokens)
    finally:
        step.stance_when_warm = "eager_on_recompile"
    expected_tokens: list[dict[str, list[int]]] = []
    expected, expected_logits = run(bf16_engine("off"), schedule(), expected_tokens)
    assert got.keys() == expected.keys()
    # (once they part, the runs may not even take as many steps)
    parted = next((i for i, (a, b) in enumerate(zip(got_tokens, expected_tokens, strict=False)) if a != b),
                  min(len(got_tokens), len(expected_tokens)) - 1)
    return got_logits, expected_logits, parted


def prefill_then_decode(step, model: LlamaModel) -> list[torch.Tensor]:
    """A 3-token prefill and a 1-token decode after it, through `step` (model.forward's signature)."""
    kv = model.new_kv_cache(1, 16, torch.float32)
    table = torch.zeros(1, 1, dtype=torch.long)
    prefill = AttentionMetadata(torch.arange(3), 0, table[:0], torch.tensor([], dtype=torch.long),
                                [PrefillChunk(0, 3, 3, table[0])])
    decode = AttentionMetadata(torch.tensor([3]), 1, table, torch.tensor([4]), max_decode_context=4)
    return [step(torch.tensor([5, 17, 300]), torch.arange(3), prefill, kv).clone(),
            step(torch.tensor([42]), torch.tensor([3]), decode, kv).clone()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[LlamaModel, Path, list[torch.Tensor]]:
    """The tiny model's step compiled ahead of time and saved, and what it gives for N = 3 and N = 1: the same
    bits as torch.compile's own (traced) path, which the engine takes where it saves no step."""
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.2), torch.float32)
    artefact = tmp_path_factory.mktemp("steps") / "tiny.step"
    outputs, steps = [], []
    for path in (artefact, None):
        step = compiled_step.CompiledStep(model, path)
        with torch._dynamo.config.patch(disable=False):
            step.warm_up(16, torch.float32)
            step.stance_when_warm = "fail_on_recompile"
            outputs.append(prefill_then_decode(step, model))
        steps.append(step)
    assert artefact.exists() and not steps[0].loaded  # compiled ahead of time and saved, not loaded
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))
    return model, artefact, outputs[0]


@compiles
@torch._dynamo.config.patch(disable=False)
def test_a_saved_step_loads_and_gives_the_traced_steps_bits(saved):
    """A fresh CompiledStep loads the saved graph (no tracing) and, with the same unbacked N, serves N = 3 and
    N = 1 without another graph, bit for bit as the traced one; both match eager."""
    model, artefact, traced_out = saved
    loaded = compiled_step.CompiledStep(model, artefact)
    loaded.warm_up(16, torch.float32)
    assert loaded.loaded
    loaded.stance_when_warm = "fail_on_recompile"  # a step the loaded graph rejects fails the test
    for got, want, eager in zip(prefill_then_decode(loaded, model), traced_out,
                                prefill_then_decode(model.forward, model),
                                strict=True):
        assert torch.equal(got, want)
        torch.testing.assert_close(got, eager, rtol=0, atol=1e-4)


@compiles
@torch._dynamo.config.patch(disable=False)
def test_a_truncated_saved_step_is_compiled_again_with_a_warning(saved, tmp_path: Path, caplog):
    model, artefact, traced_out = saved
    bad = tmp_path / artefact.name
    # as a crash mid-write would leave it
    bad.write_bytes(artefact.read_bytes()[: artefact.stat().st_size // 2])
    step = compiled_step.CompiledStep(model, bad)
    with caplog.at_level(logging.WARNING, "kvloop.compile"):
        step.warm_up(16, torch.float32)
    assert not step.loaded and "unusable" in caplog.text
    step_artefact.payload(bad)  # saved again, whole (its checksum holds)
    assert all(torch.equal(a, b) for a, b in zip(prefill_then_decode(step, model), traced_out, strict=True))


@compiles
@torch._dynamo.config.patch(disable=False)
def test_a_bf16_models_two_graphs_are_saved_apart_and_both_load(tmp_path: Path, monkeypatch):
    """Built without bf16 pairs: the kernel's graph and the dense graph each go to a file of their own; a
    fresh CompiledStep loads both (no tracing) and gives the bits of the steps that saved them, for a 3-token
    prefill and a 1-row decode (the kernel's graph) and a 20-token prefill (the dense graph)."""
    from kvloop.engine.kernels.cpu import linear_bf16w

    if not linear_bf16w.available():
        pytest.skip("the bf16-weight kernel is not built")
    monkeypatch.setattr(linear_bf16w, "native", lambda: False)
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.2), torch.bfloat16, quantization="bf16")
    artefact = tmp_path / "tiny-bf16.step"

    def steps(step) -> list[torch.Tensor]:
        kv = model.new_kv_cache(2, 16, torch.bfloat16)
        table = torch.arange(2)
        none = torch.tensor([], dtype=torch.long)
        short = AttentionMetadata(torch.arange(3), 0, table[:0, None], none,
                                  [PrefillChunk(0, 3, 3, table[:1])])
        decode = AttentionMetadata(torch.tensor([3]), 1, table[None, :1], torch.tensor([4]),
                                   max_decode_context=4)
        long = AttentionMetadata(torch.arange(20), 0, table[:0, None], none, [PrefillChunk(0, 20, 20, table)])
        return [step(torch.tensor([5, 17, 300]), torch.arange(3), short, kv).clone(),
                step(torch.tensor([42]), torch.tensor([3]), decode, kv).clone(),
                step(torch.arange(20) + 7, torch.arange(20), long, kv).clone()]

    outputs = []
    for expect_loaded in (False, True):
        step = compiled_step.CompiledStep(model, artefact)
        step.warm_up(16, torch.bfloat16)
        assert step.loaded == expect_loaded
        step.stance_when_warm = "fail_on_recompile"
        outputs.append(steps(step))
    assert artefact.exists() and artefact.with_name("tiny-bf16-dense.step").exists()
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))


def test_the_saved_steps_key_follows_the_model_and_its_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(step_artefact.ENV, str(tmp_path))
    fp32, bf16 = (LlamaModel(TINY, random_weights(TINY, seed=3, std=0.2), dtype) for dtype in (torch.float32,
                                                                                               torch.bfloat16))
    opts = compiled_step.INDUCTOR_OPTIONS

    def path(model=fp32, fingerprint="ckpt", kv=torch.float32, options=opts):
        return step_artefact.artefact_path(model, fingerprint, kv, options)

    assert path() == path() and path().parent == tmp_path
    assert len({path(), path(bf16), path(fingerprint="other"), path(kv=torch.bfloat16),
                path(options={**opts, "size_asserts": True})}) == 5
    threads, one_thread = torch.get_num_threads(), path()
    torch.set_num_threads(threads + 1)  # inductor writes the thread count into its loops
    try:
        assert path() != one_thread
    finally:
        torch.set_num_threads(threads)
    assert path(fingerprint="") is None  # a model built in-process: nothing tells its weights' layout
    monkeypatch.setenv(step_artefact.ENV, "off")
    assert path() is None


@compiles
@torch._dynamo.config.patch(disable=False)
def test_two_models_in_one_process_run_their_own_graphs():
    """The step keeps no guards on the model (compiled_step.keep_guard): each CompiledStep compiles its own
    copy of the step's code, so a second model of another shape runs its own graph, not the first one's."""
    other_cfg = dataclasses.replace(TINY, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=2,
                                    num_kv_heads=1)
    models = [LlamaModel(cfg, random_weights(cfg, seed=5, std=0.2), torch.float32) for cfg in (TINY,
                                                                                               other_cfg)]
    plan = {0: [("x", [3, 1, 4, 1, 5, 9, 2, 6], 6)], 1: [("y", [2, 7, 1, 8], 5)]}
    compiled = [engine(m, "on") for m in models]
    for eng in compiled:
        assert eng.runner.compiled is not None and eng.runner.compiled.warm
        eng.runner.compiled.stance_when_warm = "fail_on_recompile"
    try:
        for model, eng in zip(models, compiled, strict=True):
            got, _ = run(eng, plan)
            expected, _ = run(engine(model, "off"), plan)
            assert got == expected
    finally:
        for eng in compiled:
            eng.runner.compiled.stance_when_warm = "eager_on_recompile"
