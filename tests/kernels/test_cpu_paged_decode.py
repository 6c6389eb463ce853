"""The CPU paged decode kernel (engine/kernels/cpu) against the float64 torch reference: fp32, bf16 and
fp16 KV, grouped-query heads, contexts ending mid-block and on a block edge, rows of different lengths,
context splits merged inside the kernel, and cascade: shared prefixes (groups of 1, 2 and 16, nested ones)
and each row's own part, their partial results merged by log-sum-exp inside the kernel (paged_decode);
and decode_layer, a decode-only layer's K/V write and decode in one call, against the composed path.

The kernel computes in fp32 from the values the cache holds, and the reference reads the same values, so
every dtype is held to fp32 reassociation error. The build is cached in the virtual environment (built at
install time); a missing one is built here once."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import (
    bf16_probs_atol,
    load_attention_kernel,
    make_paged,
    new_generator,
    poisoned_alloc,
    strided_rows,
)

from kvloop.engine.cascade.plan import build_plan
from kvloop.engine.core.cpu import cpu_capabilities
from kvloop.engine.kernels import reference
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.kernels.backend import AttentionBackend
from kvloop.engine.kernels.cpu import backend, build
from kvloop.engine.kernels.cpu import paged_decode as pd
from kvloop.engine.kernels.torch_decode import merge_into

ATOL = RTOL = 1e-5  # fp32 accumulation over the dtype-rounded values the reference sees too
KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BS = 16


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    load_attention_kernel()


def reference_lse(q, paged, tables, lens, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (out, lse) of row b over its first lens[b] tokens."""
    outs, lses = [], []
    for b, n in enumerate(lens):
        k = reference.gather(paged.k_cache, tables[b], n)
        v = reference.gather(paged.v_cache, tables[b], n)
        out, lse = reference.attention_lse(q[b : b + 1], k, v, scale)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


def check(out, ref, seed, atol=ATOL, rtol=RTOL) -> None:
    assert not out.isnan().any(), f"NaN in output (seed {seed})"
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=rtol,
                               msg=lambda m: f"seed {seed}: {m}")


def stacked_tolerance(values: torch.Tensor, atol: float = ATOL, rtol: float = RTOL) -> dict[str, float]:
    """The tolerance of outputs whose items stack several rows' queries (a group's
    shared prefix) over `values`:
    kernel_ref.bf16_probs_atol's where the blocked bf16 routine rounds their
    probabilities, else the given one."""
    bound = bf16_probs_atol(values.dtype, values)
    return {"atol": atol, "rtol": rtol} if bound is None else {"atol": max(atol, bound), "rtol": rtol}


# 1: a lone token; 15/16/17: one short of, on and one past a block edge; 700 and 1100: several context
# splits (512 tokens) merged inside the kernel, ending mid-block
LENS = [1, 15, 16, 17, 700, 1100, 48]


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(6, 2, 64), (4, 4, 128), (6, 3, 40)],
                         ids=["gqa3_hd64", "mha_hd128", "gqa2_hd40_scalar_tail"])
def test_plain_decode_matches_float64(kv_dtype, heads, kv_heads, head_dim):
    gen, seed = new_generator()
    dtype = KV_DTYPES[kv_dtype]
    paged = make_paged(LENS, BS, kv_heads, head_dim, dtype, gen)  # unused slots NaN: a stray read shows
    q = strided_rows(len(LENS), heads, head_dim, torch.float32, gen)  # a view of a wider projection
    scale = head_dim ** -0.5
    out, lse = pd.attend(q, paged.k_cache, paged.v_cache,
                         pd.plain_segments(paged.block_tables, torch.tensor(LENS)),
                         scale)
    ref_out, ref_lse = reference_lse(q, paged, paged.block_tables, LENS, scale)
    assert out.dtype == lse.dtype == torch.float32 and out.shape == q.shape and lse.shape == q.shape[:2]
    check(out, ref_out, seed)
    check(lse, ref_lse, seed)


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16_q", "fp16_q"])
def test_16bit_queries(q_dtype):
    gen, seed = new_generator()
    paged = make_paged(LENS, BS, 2, 64, torch.bfloat16, gen)
    q = strided_rows(len(LENS), 6, 64, q_dtype, gen)
    out, _ = pd.attend(q, paged.k_cache, paged.v_cache,
                       pd.plain_segments(paged.block_tables, torch.tensor(LENS)),
                       0.125)
    check(out, reference_lse(q, paged, paged.block_tables, LENS, 0.125)[0], seed)


def test_context_splits_merge_exactly():
    """Splits of any length (here 7 tokens: not on block edges) give the single-pass result."""
    gen, seed = new_generator()
    paged = make_paged(LENS, BS, 2, 64, torch.float32, gen)
    q = torch.randn(len(LENS), 6, 64, generator=gen)
    segs = pd.plain_segments(paged.block_tables, torch.tensor(LENS))
    whole, whole_lse = pd.attend(q, paged.k_cache, paged.v_cache, segs, 0.125, split_tokens=1 << 20)
    split, split_lse = pd.attend(q, paged.k_cache, paged.v_cache, segs, 0.125, split_tokens=7)
    check(split, whole, seed)
    check(split_lse, whole_lse, seed)


def shared_prefix_rows(members: int, shared: int, dtype: torch.dtype, gen: torch.Generator):
    """`members` rows sharing their first `shared` tokens (the same block ids for its full blocks, as the KV
    manager shares them; a partly shared block is each row's own), then one row of its own: the paged cache,
    tables, lengths and the shared block ids."""
    lens = [shared + (1, 30, 300, 16)[i % 4] for i in range(members)] + [77]
    paged = make_paged(lens, BS, 2, 64, dtype, gen)
    prefix_blocks = shared // BS
    tables = paged.block_tables.clone()
    tables[1:members, :prefix_blocks] = tables[0, :prefix_blocks]
    return paged, tables, lens, tables[0, :prefix_blocks].tolist()


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize("shared", [40, 48], ids=["prefix_ends_mid_block", "prefix_ends_on_block_edge"])
@pytest.mark.parametrize("members", [1, 2, 16])
@pytest.mark.parametrize("split_tokens", [512, 7], ids=["one_split", "many_splits"])
def test_prefix_and_suffix_merged_in_the_kernel_equal_full_attention(kv_dtype, shared, members, split_tokens):
    """A group's shared full blocks attended once with its rows' queries stacked, each row's own tokens (the
    rest of a partly shared block included) separately, and the partial results (context splits too) merged
    by log-sum-exp inside the kernel: each row's output and log-sum-exp equal its attention over its whole
    context. A row outside the group is written directly beside the merged ones."""
    gen, seed = new_generator()
    paged, tables, lens, prefix = shared_prefix_rows(members, shared, KV_DTYPES[kv_dtype], gen)
    cut = len(prefix) * BS
    q = strided_rows(len(lens), 6, 64, torch.float32, gen)
    segs = pd.pack_segments([(list(range(members)), prefix, cut)]
                            + [([r], tables[r, len(prefix):].tolist(),
                                n - cut) for r, n in enumerate(lens[:members])]
                            + [([members], tables[members].tolist(), lens[members])])
    with poisoned_alloc():  # an output the kernel forgets to write would hold NaN
        out, lse = pd.decode(q, paged.k_cache, paged.v_cache, segs, 0.125, split_tokens)
    ref_out, ref_lse = reference_lse(q, paged, tables, lens, 0.125)
    assert out.shape == q.shape and lse.shape == q.shape[:2]
    tol = stacked_tolerance(paged.v_cache)
    check(out, ref_out, seed, **tol)
    check(lse, ref_lse, seed)  # the sums of the probabilities stay fp32
    # the partial results the kernel merged, and torch's merge of them, agree with it
    parts, parts_lse = pd.attend(q, paged.k_cache, paged.v_cache, segs, 0.125, split_tokens)
    acc, acc_lse = parts[members:], parts_lse[members:]
    merge_into(acc, acc_lse, torch.arange(members), parts[:members], parts_lse[:members])
    check(out, acc, seed, **tol)
    check(lse, acc_lse, seed)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 128)],
                         ids=["smollm2", "gqa8_hd128"])
@pytest.mark.parametrize("members", [1, 2, 3, 5, 7])
def test_stacked_queries_of_any_count_equal_full_attention(heads, kv_heads, head_dim, members):
    """bf16 K/V with bf16 queries, the engine's case on CPUs with native bf16 (where
    the kernel scores a tile's
    16 tokens for blocks of up to 6 queries, 3 at head_dim 128): every count of queries per KV head, a block's
    remainder included (3 to 21 at the embedded model's 3-query groups, 8 to 56 at 8), over a shared prefix
    ending mid-block and each row's own tokens, equal float64 attention over the same values."""
    gen, seed = new_generator()
    lens = [45 + 13 * i for i in range(members)]
    paged = make_paged(lens, BS, kv_heads, head_dim, torch.bfloat16, gen)
    tables = paged.block_tables.clone()
    tables[1:, :2] = tables[0, :2]  # the first 32 tokens shared
    q = strided_rows(members, heads, head_dim, torch.bfloat16, gen)
    scale = head_dim ** -0.5
    segs = pd.pack_segments([(list(range(members)), tables[0, :2].tolist(), 32)]
                            + [([r], tables[r, 2:].tolist(), n - 32) for r, n in enumerate(lens)])
    out, lse = pd.decode(q, paged.k_cache, paged.v_cache, segs, scale)
    ref_out, ref_lse = reference_lse(q, paged, tables, lens, scale)
    check(out, ref_out, seed, **stacked_tolerance(paged.v_cache))
    check(lse, ref_lse, seed)


def test_the_kernel_reports_the_blocked_bf16_path_where_the_cpu_has_it():
    """Built with -march=native: on a CPU with AVX-512 and AVX512-BF16 the bf16 K/V
    path is the blocked one."""
    assert build.blocked_bf16() == cpu_capabilities().avx512_bf16, build.simd()


def meta_for(tables: list[list[int]], lens: list[int], plan=None) -> AttentionMetadata:
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.zeros(len(tables), dtype=torch.long), num_decode=len(tables),
        decode_block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        decode_context_lens=torch.tensor(lens), max_decode_context=max(lens), cascade=plan)


def nested_rows(num_blocks: int, gen: torch.Generator) -> tuple[list[list[int]], list[int]]:
    """A system prompt shared by 9 rows, a document (ending mid-block) shared by 3 of them and another
    by 4, a pair on a block edge, a row alone: tables with shuffled block ids."""
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()

    def take(n: int) -> list[int]:
        nonlocal free
        out, free = free[:n], free[n:]
        return out

    system, doc_a, doc_b, pair = take(2), take(20), take(5), take(4)
    spec = ([(system + doc_a, 340 + 7 * i) for i in range(3)] + [(system + doc_b, 120 + i) for i in range(4)]
            + [(list(system), 50), (list(system), 33)] + [(list(pair), 65), (list(pair), 90)] + [([], 70)])
    tables = [prefix + take(-(-n // BS) - len(prefix)) for prefix, n in spec]
    return tables, [n for _, n in spec]


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
def test_decode_step_with_and_without_cascade(kv_dtype):
    """CpuDecode over a step's metadata, nested cascade groups from the runner's planner and without a
    plan, against float64 (and the same work list reused by a second layer)."""
    gen, seed = new_generator()
    dtype = KV_DTYPES[kv_dtype]
    k_cache = torch.randn(200, BS, 2, 64, generator=gen).to(dtype)
    v_cache = torch.randn(200, BS, 2, 64, generator=gen).to(dtype)
    tables, lens = nested_rows(200, gen)
    q = torch.randn(len(lens), 6, 64, generator=gen)
    ref = reference.paged_decode(q, k_cache, v_cache, meta_for(tables, lens).decode_block_tables, lens, 0.125)
    plan = build_plan(tables, lens, BS, lambda members, tokens: members > 1)
    assert plan is not None and sorted(len(g.rows) for g in plan.groups) == [2, 3, 4, 9]
    assert max(len(plan.row_groups(r)) for r in range(len(lens))) == 2  # nested: system prompt, then document
    decode = pd.CpuDecode()
    for p in (None, plan):
        meta = meta_for(tables, lens, p)
        out = decode(q, k_cache, v_cache, meta, 0.125)
        assert out.dtype == q.dtype
        check(out, ref, seed, **(stacked_tolerance(v_cache) if p is not None else {}))
        assert decode.work(meta, BS) is decode.work(meta, BS)  # built once per step
    bf16_out = decode(q.bfloat16(), k_cache, v_cache, meta_for(tables, lens, plan), 0.125)
    assert bf16_out.dtype == torch.bfloat16
    # a row's log-sum-exp over its nested groups and own part, merged in the kernel, is its whole context's
    _, lse = pd.decode(q, k_cache, v_cache, pd.decode_work(meta_for(tables, lens, plan), BS), 0.125)
    ref_lse = torch.stack([reference.attention_lse(q[b:b + 1], reference.gather(k_cache, torch.tensor(t), n),
                                                   reference.gather(v_cache, torch.tensor(t), n), 0.125)[1][0]
                           for b, (t, n) in enumerate(zip(tables, lens, strict=True))])
    check(lse, ref_lse, seed)


def test_cpu_backend_runs_a_mixed_step():
    """The "cpu" backend: decode rows (in cascade groups) through the kernel, a prefill chunk over a cached
    prefix through the kernel's causal segments (bf16 K/V with the blocked bf16 path; else the torch backend
    it composes, as for the K/V writes)."""
    gen, seed = new_generator()
    k_cache = torch.randn(200, BS, 2, 64, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(200, BS, 2, 64, generator=gen).to(torch.bfloat16)
    tables, lens = nested_rows(200, gen)
    plan = build_plan(tables, lens, BS, lambda members, tokens: members > 1)
    meta = meta_for(tables, lens, plan)
    chunk_blocks = torch.tensor([190, 191, 192])
    meta.prefills = [PrefillChunk(len(lens), 9, 41, chunk_blocks)]  # 9 new tokens over 32 cached ones
    q = torch.randn(len(lens) + 9, 6, 64, generator=gen)
    cpu = backend.create("cpu")
    assert cpu.name == "cpu" and backend.available("cpu") and not backend.available("meta")
    out = cpu.forward(q, k_cache, v_cache, meta, 0.125)
    ref = reference.paged_step(q, k_cache, v_cache, meta, 0.125)
    check(out[: len(lens)], ref[: len(lens)], seed, **stacked_tolerance(v_cache))
    # the prefill rows' probabilities are bf16 on the blocked path: off by at most 2^-9 of the largest |value|
    bound = bf16_probs_atol(v_cache.dtype, v_cache)
    check(out[len(lens):], ref[len(lens):], seed, atol=bound or ATOL, rtol=0 if bound else RTOL)


def test_rows_do_not_depend_on_the_batch_or_threads():
    """A row's result is bitwise the same alone, in a batch, and with 1 or 2 threads (fixed split length;
    items covering one or all KV heads compute the same operations)."""
    gen, _ = new_generator()
    paged = make_paged(LENS, BS, 2, 64, torch.bfloat16, gen)
    q = torch.randn(len(LENS), 6, 64, generator=gen)
    lens = torch.tensor(LENS)
    batch, _ = pd.attend(q, paged.k_cache, paged.v_cache, pd.plain_segments(paged.block_tables, lens), 0.125)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two, _ = pd.attend(q, paged.k_cache, paged.v_cache, pd.plain_segments(paged.block_tables, lens),
                           0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch, two)
    for r in (0, 5):
        alone, _ = pd.attend(q[r : r + 1], paged.k_cache, paged.v_cache,
                             pd.plain_segments(paged.block_tables[r : r + 1], lens[r : r + 1]), 0.125)
        assert torch.equal(alone[0], batch[r])


def test_cascade_rows_do_not_depend_on_the_threads_or_the_group_size():
    """With cascade, a row's merged result is bitwise the same with 1 or 2 threads, and in a group of 16 or
    of 2 (each stacked query is computed on its own; a row's partial results merge in a fixed order)."""
    gen, _ = new_generator()
    k_cache = torch.randn(200, BS, 2, 64, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(200, BS, 2, 64, generator=gen).to(torch.bfloat16)
    tables, lens = nested_rows(200, gen)
    q = torch.randn(len(lens), 6, 64, generator=gen)
    segs = pd.decode_work(meta_for(tables, lens, build_plan(tables, lens, BS, lambda m, t: m > 1)), BS)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(pd.decode(q, k_cache, v_cache, segs, 0.125, split_tokens=64))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    paged, tables, lens, prefix = shared_prefix_rows(16, 48, torch.bfloat16, gen)
    q = torch.randn(len(lens), 6, 64, generator=gen)

    def group_of(members: int) -> torch.Tensor:
        segs = pd.pack_segments([(list(range(members)), prefix, 48)]
                                + [([r], tables[r, 3:].tolist(), lens[r] - 48) for r in range(members)])
        return pd.decode(q[:members], paged.k_cache, paged.v_cache, segs, 0.125)[0]

    assert torch.equal(group_of(16)[:2], group_of(2))


def test_operator_traces_with_fake_tensors():
    """torch.compile can trace through the operator: its output shapes are registered (no data read)."""
    gen, _ = new_generator()
    paged = make_paged(LENS, BS, 2, 64, torch.bfloat16, gen)
    q = torch.randn(len(LENS), 6, 64, generator=gen)
    segs = pd.plain_segments(paged.block_tables, torch.tensor(LENS))
    args = (q, paged.k_cache, paged.v_cache, segs.blocks, segs.block_start, segs.tokens, segs.rows_ptr,
            segs.rows,
            0.125, 512)
    for op in (torch.ops.kvloop_cpu.paged_attention, torch.ops.kvloop_cpu.paged_decode):
        torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


def test_empty_segment_gives_zeros_and_minus_infinity():
    gen, _ = new_generator()
    paged = make_paged([20], BS, 2, 64, torch.float32, gen)
    q = torch.randn(1, 6, 64, generator=gen)
    out, lse = pd.attend(q, paged.k_cache, paged.v_cache, pd.pack_segments([([0], [], 0)]), 0.125)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_decode_rows_without_tokens_give_zeros_and_minus_infinity():
    """paged_decode: a row no segment names, or only empty ones, gets zeros and -inf; an empty segment
    beside a real one weighs nothing in the merge."""
    gen, seed = new_generator()
    paged = make_paged([20], BS, 2, 64, torch.float32, gen)
    q = torch.randn(3, 6, 64, generator=gen)
    table = paged.block_tables[0, :2].tolist()
    with poisoned_alloc():
        out, lse = pd.decode(q, paged.k_cache, paged.v_cache,
                             pd.pack_segments([([0, 1], [], 0), ([0], table, 20), ([1], [], 0)]), 0.125)
    assert torch.equal(out[1:], torch.zeros_like(out[1:])) and torch.isneginf(lse[1:]).all()
    ref_out, ref_lse = reference_lse(q[:1], paged, paged.block_tables, [20], 0.125)
    check(out[:1], ref_out, seed)
    check(lse[:1], ref_lse, seed)


def test_bad_indices_are_refused():
    gen, _ = new_generator()
    paged = make_paged([20], BS, 2, 64, torch.float32, gen)
    q = torch.randn(1, 6, 64, generator=gen)
    num_blocks = paged.k_cache.shape[0]
    for segs in (pd.pack_segments([([0], [num_blocks], 5)]),  # block id past the cache
                 pd.pack_segments([([0], [1], 17)]),  # more tokens than its blocks hold
                 pd.pack_segments([([3], [1], 5)])):  # a query row q does not have
        with pytest.raises(RuntimeError):
            pd.attend(q, paged.k_cache, paged.v_cache, segs, 0.125)


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cascade", [False, True])
def test_decode_layer_equals_the_composed_write_and_decode(kv_dtype, q_dtype, cascade):
    """The "cpu" backend's one-call layer (decode_layer: K/V write converted to the cache's dtype, then paged
    decode) against the composed path (the torch backend's index_copy_ write, then the kernel): the same cache
    bytes and the same outputs, bit for bit, for q, k and v as the model hands them over (strided views)."""
    gen, seed = new_generator()
    dtype = KV_DTYPES[kv_dtype]
    layers, heads, kv_heads, hd = 3, 6, 2, 64
    kv_cache = torch.randn(layers, 2, 120, BS, kv_heads, hd, generator=gen).to(dtype)
    free = (torch.randperm(119, generator=gen) + 1).tolist()
    shared = [free.pop() for _ in range(2)]  # 32 tokens, shared by rows 2-4
    lens = [1, 16, 40, 57, 700]
    tables = [[free.pop() for _ in range(-(-n // BS))] for n in lens[:2]]
    tables += [shared + [free.pop() for _ in range(-(-n // BS) - 2)] for n in lens[2:]]
    plan = build_plan(tables, lens, BS, lambda members, tokens: members > 1) if cascade else None
    assert (plan is not None) == cascade
    meta = meta_for(tables, lens, plan)
    meta.slot_mapping = torch.tensor([t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens,
                                                                                           strict=True)])
    qk = torch.randn(len(lens), heads + kv_heads, hd, generator=gen).to(q_dtype)
    wide = torch.randn(len(lens), 3 * kv_heads, hd, generator=gen).to(q_dtype)
    q, k, v = qk[:, :heads], qk[:, heads:], wide[:, kv_heads: 2 * kv_heads]
    cpu = backend.create("cpu")
    composed_cache, fused_cache = kv_cache.clone(), kv_cache.clone()
    composed = AttentionBackend.layer(cpu, 1, q, k, v, composed_cache, meta, 0.125)
    fused = cpu.layer(1, q, k, v, fused_cache, meta, 0.125)
    assert torch.equal(fused_cache, composed_cache), f"seed {seed}: the caches differ"
    assert not torch.equal(fused_cache, kv_cache)  # something was written
    assert fused.dtype == q_dtype and fused.shape == q.shape and fused.is_contiguous()
    assert torch.equal(fused, composed), f"seed {seed}: the outputs differ"
    ref = reference.paged_decode(q.float(), fused_cache[1, 0], fused_cache[1, 1], meta.decode_block_tables,
                                 lens, 0.125)
    tol = {"atol": ATOL, "rtol": RTOL} if q_dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    check(fused.float(), ref, seed, **(stacked_tolerance(fused_cache[1, 1], **tol) if cascade else tol))


def test_decode_layer_refuses_a_slot_outside_the_cache_and_writes_nothing():
    gen, _ = new_generator()
    kv_cache = torch.randn(2, 2, 4, BS, 2, 64, generator=gen)
    before = kv_cache.clone()
    meta = meta_for([[1]], [3])
    q, k, v = torch.randn(1, 6, 64), torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    work = pd.decode_work(meta, BS)
    for slot in (4 * BS, -1):
        with pytest.raises(RuntimeError, match="slot"):
            torch.ops.kvloop_cpu.decode_layer(q, k, v, kv_cache, 0, torch.tensor([slot]), work.blocks,
                                              work.block_start, work.tokens, work.rows_ptr, work.rows, 0.125,
                                              512)
    assert torch.equal(kv_cache, before)
