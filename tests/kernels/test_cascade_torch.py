"""The torch decode path (in place over the paged cache, with cascade over shared prefixes) against a
float64 reference: groups of 1, 2 and 16, nested prefixes, prefixes ending mid-block and on a block
edge, scattered and consecutive block ids, short (batched) and long (in place) rows, 16-bit KV."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import TOL, new_generator

from kvloop.engine.cascade.plan import build_plan
from kvloop.engine.kernels import reference, torch_backend, torch_decode
from kvloop.engine.kernels.attention_meta import AttentionMetadata

BS, N_KV, HEADS, HD = 16, 2, 6, 64


class Cache:
    """A paged cache whose blocks are handed out like the KV manager's: shared blocks by identity."""

    def __init__(self, num_blocks: int, dtype: torch.dtype, gen: torch.Generator, scatter: bool):
        shape = (num_blocks, BS, N_KV, HD)
        self.k = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        self.v = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        order = torch.randperm(num_blocks - 1, generator=gen) + 1 if scatter else torch.arange(1, num_blocks)
        self.free = [int(b) for b in order]  # block 0 stays unused: a table padding entry

    def take(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        return out


def rows_from(cache: Cache, spec: list[tuple[list[int], int]]) -> list[list[int]]:
    """spec: per row (shared block lists it starts with, its context length); the rest of its blocks are
    its own."""
    tables = []
    for prefix, ctx in spec:
        need = -(-ctx // BS) - len(prefix)
        tables.append(prefix + cache.take(need))
    return tables


def float64_ref(q: torch.Tensor, cache: Cache, tables: list[list[int]], lens: list[int],
                scale: float) -> torch.Tensor:
    return reference.paged_decode(q, cache.k, cache.v, run_tables(tables), lens, scale)


def run(q, cache: Cache, tables, lens, scale, plan) -> torch.Tensor:
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(len(tables), dtype=torch.long), num_decode=len(tables),
        decode_block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        decode_context_lens=torch.tensor(lens), max_decode_context=max(lens), cascade=plan,
    )
    return torch_decode.decode_attention(q, cache.k, cache.v, meta, scale)


def always(members: int, tokens: int) -> bool:
    return members > 1


def group_of_16(c: Cache) -> list[tuple[list[int], int]]:
    """16 rows on one 300-token document (ends mid-block: 18 full blocks, then each row's own tokens)."""
    doc = c.take(18)
    return [(list(doc), 300 + 5 * i) for i in range(16)]


def group_of_2_block_edge(c: Cache) -> list[tuple[list[int], int]]:
    """A pair sharing exactly 4 blocks (the shared part ends on a block edge; the next token opens a new
    block) and a row alone."""
    doc = c.take(4)
    return [(list(doc), 65), (list(doc), 90), ([], 40)]


def group_of_1(c: Cache) -> list[tuple[list[int], int]]:
    """Nothing shared: a long row (read in place, beyond SHORT_TOKENS) and short ones (batched)."""
    return [([], 700), ([], 33), ([], 1)]


def nested(c: Cache) -> list[tuple[list[int], int]]:
    """A system prompt shared by all but one, a document shared by three, another by four."""
    system, doc_a, doc_b = c.take(2), c.take(20), c.take(5)
    return ([(system + doc_a, 340 + 7 * i) for i in range(3)] + [(system + doc_b, 120 + i) for i in range(4)]
            + [(list(system), 50), ([], 70)])


CASES = {f.__name__: f for f in (group_of_16, group_of_2_block_edge, group_of_1, nested)}


@pytest.mark.parametrize("scatter", [False, True], ids=["consecutive", "scattered"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cascade_and_in_place_match_float64(case, scatter):
    gen, seed = new_generator()
    cache = Cache(600, torch.float32, gen, scatter)
    spec = CASES[case](cache)
    tables = rows_from(cache, spec)
    lens = [ctx for _, ctx in spec]
    q = torch.randn(len(tables), HEADS, HD, generator=gen)
    scale = HD ** -0.5
    ref = float64_ref(q, cache, tables, lens, scale)
    plan = build_plan(tables, lens, BS, always)
    if case != "group_of_1":
        assert plan is not None and plan.groups, "the case must exercise cascade"
    for p in (None, plan):
        out = run(q, cache, tables, lens, scale, p)
        torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=2e-6, msg=lambda m: f"seed {seed}: {m}")


def run_tables(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def test_nested_plan_has_both_levels():
    gen, _ = new_generator()
    cache = Cache(600, torch.float32, gen, True)
    spec = nested(cache)
    tables = rows_from(cache, spec)
    plan = build_plan(tables, [ctx for _, ctx in spec], BS, always)
    assert plan is not None
    assert sorted(len(g.rows) for g in plan.groups) == [3, 4, 8]


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16], ids=["fp32_model", "bf16_model"])
def test_16bit_kv(model_dtype):
    """bf16 KV read at half the bytes and accumulated in fp32: under an fp32 model the only error is the
    K/V rounding itself, which the reference sees too."""
    gen, seed = new_generator()
    cache = Cache(600, torch.bfloat16, gen, True)
    spec = group_of_16(cache)[:6] + [([], 1100), ([], 500), ([], 20)]  # in place, copied, copied
    tables = rows_from(cache, spec)
    lens = [ctx for _, ctx in spec]
    q = torch.randn(len(tables), HEADS, HD, generator=gen).to(model_dtype)
    ref = float64_ref(q, cache, tables, lens, HD ** -0.5)
    atol, rtol = (2e-6, 2e-6) if model_dtype == torch.float32 else TOL[torch.bfloat16]
    for plan in (None, build_plan(tables, lens, BS, always)):
        out = run(q, cache, tables, lens, HD ** -0.5, plan)
        assert out.dtype == model_dtype
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol, msg=lambda m: f"seed {seed}: {m}")


def test_16bit_kv_write_and_prefill():
    """K/V written from an fp32 model into a bf16 cache, and prefill reading it back, match fp32 math on
    the rounded values."""
    gen, seed = new_generator()
    n = 40
    k = torch.randn(n, N_KV, HD, generator=gen)
    v = torch.randn(n, N_KV, HD, generator=gen)
    q = torch.randn(n, HEADS, HD, generator=gen)
    k_cache = torch.zeros(4, BS, N_KV, HD, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    torch_backend.write_kv(k, v, k_cache, v_cache, torch.arange(n))
    assert torch.equal(k_cache.view(-1, N_KV, HD)[:n], k.bfloat16())
    out = torch_backend.prefill_attention(q, k_cache, v_cache, torch.arange(3), n, HD ** -0.5)
    ref = reference.attention(q, k.bfloat16(), v.bfloat16(), HD ** -0.5, first_pos=0)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=2e-6, msg=lambda m: f"seed {seed}: {m}")


@pytest.mark.parametrize("native_bf16", [True, False], ids=["sdpa", "matmul_softmax"])
def test_bf16_prefill_both_paths(monkeypatch, native_bf16):
    """A bf16 model's prefill chunk over a paged prefix: SDPA's fused kernel (CPUs with native bf16) and the
    matmul + fp32 softmax path (CPUs without) both match float64 within bf16's tolerance."""
    monkeypatch.setattr(torch_backend, "cpu_has_native_bf16", lambda: native_bf16)
    gen, seed = new_generator()
    seq_len, q_len = 150, 40  # the chunk's last 40 tokens: causal over a 110-token prefix, ending mid-block
    k = torch.randn(seq_len, N_KV, HD, generator=gen).bfloat16()
    v = torch.randn(seq_len, N_KV, HD, generator=gen).bfloat16()
    q = torch.randn(q_len, HEADS, HD, generator=gen).bfloat16()
    cache = Cache(12, torch.bfloat16, gen, True)
    table = cache.take(-(-seq_len // BS))
    slots = torch.tensor([table[i // BS] * BS + i % BS for i in range(seq_len)])
    torch_backend.write_kv(k, v, cache.k, cache.v, slots)
    out = torch_backend.prefill_attention(q, cache.k, cache.v, torch.tensor(table), seq_len, HD ** -0.5)
    ref = reference.attention(q, k, v, HD ** -0.5, first_pos=seq_len - q_len)
    atol, rtol = TOL[torch.bfloat16]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol, msg=lambda m: f"seed {seed}: {m}")


def test_long_rows_are_read_in_place_and_short_ones_bucketed(monkeypatch):
    """Rows longer than the cost model's copy limit never go through the copying path; copied rows are
    bucketed so that a bucket's padding stays small."""
    gen, _ = new_generator()
    cache = Cache(600, torch.float32, gen, True)
    lens = [1100, 700, 30, 33, 40, 200, 210, 1]
    tables = rows_from(cache, [([], n) for n in lens])
    limit = torch_decode.cost_for("float32").copy_max_tokens
    copied: list[list[int]] = []
    real = torch_decode.gathered_attention

    def spy(q, k_cache, v_cache, short, scale, need_lse):
        copied.append(short.lens.tolist())
        return real(q, k_cache, v_cache, short, scale, need_lse)

    monkeypatch.setattr(torch_decode, "gathered_attention", spy)
    q = torch.randn(len(lens), HEADS, HD, generator=gen)
    out = run(q, cache, tables, lens, HD ** -0.5, None)
    torch.testing.assert_close(out.double(), float64_ref(q, cache, tables, lens, HD ** -0.5), atol=2e-6,
                               rtol=2e-6)
    flat = sorted(n for bucket in copied for n in bucket)
    assert flat == sorted(n for n in lens if n <= limit)
    for bucket in copied:
        assert max(bucket) <= max(min(bucket) * torch_decode.BUCKET_SLACK, min(bucket) + 16)
