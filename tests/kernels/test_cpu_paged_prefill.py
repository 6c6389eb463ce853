"""The CPU kernel's causal segments (paged_prefill: prefill chunks read in place from the paged cache) against
float64: chunks with and without a cached prefix, ending mid-block and on a block edge, a one-token chunk,
chunks longer than a context split, several chunks in one call; fp32, bf16 and fp16 K/V, 16-bit and fp32
queries, grouped-query heads and head_dim 64, 128 and 40 (both of the kernel's tile routines where the CPU has
the blocked bf16 one, whose probabilities are bf16 here); and the cpu backend's extend, which takes this path
over bf16 K/V there, against the torch backend's (SDPA over a gathered copy)."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import bf16_probs_atol, load_attention_kernel, make_paged, new_generator, strided_rows
from stacked_cases import stacked_tiles

from kvloop.engine.kernels import reference
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.kernels.cpu import backend
from kvloop.engine.kernels.cpu import paged_decode as pd
from kvloop.engine.kernels.torch_backend import TorchBackend

ATOL = RTOL = 1e-5  # fp32 arithmetic over the values the cache holds, as the float64 reference reads them
# (the blocked bf16 routine's probabilities are bf16: see test_causal_segments_equal_float64)
BS = 16
# (cached prefix, new tokens): fresh prompts, a prefix ending mid-block and on a block edge, a single new
# token, and chunks and contexts longer than a 512-token context split
CHUNKS = [(0, 37), (21, 16), (32, 40), (100, 1), (0, 600), (555, 130)]


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    load_attention_kernel()


def chunk_reference(q: torch.Tensor, paged, chunks: list[tuple[int, int]], scale: float) -> torch.Tensor:
    """float64: chunk c's rows are positions cached .. cached + new - 1 of sequence c, causal."""
    outs, row = [], 0
    for c, (cached, new) in enumerate(chunks):
        seq = cached + new
        k = reference.gather(paged.k_cache, paged.block_tables[c], seq)
        v = reference.gather(paged.v_cache, paged.block_tables[c], seq)
        outs.append(reference.attention_lse(q[row : row + new], k, v, scale, first_pos=cached)[0])
        row += new
    return torch.cat(outs)


def chunk_segments(paged, chunks: list[tuple[int, int]]) -> pd.Segments:
    parts, row = [], 0
    for c, (cached, new) in enumerate(chunks):
        seq = cached + new
        parts.append((range(row, row + new), paged.block_tables[c, : -(-seq // BS)].tolist(), seq))
        row += new
    return pd.pack_segments(parts)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["fp32_q", "bf16_q"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 128), (6, 3, 40)],
                         ids=["smollm2", "gqa4_hd128", "gqa2_hd40"])
@pytest.mark.parametrize("split_tokens", [512, 7], ids=["splits_512", "splits_7"])
def test_causal_segments_equal_float64(kv_dtype, q_dtype, heads, kv_heads, head_dim, split_tokens):
    gen, seed = new_generator()
    chunks = CHUNKS if split_tokens == 512 else CHUNKS[:4]
    paged = make_paged([c + n for c, n in chunks], BS, kv_heads, head_dim, kv_dtype, gen)
    q = strided_rows(sum(n for _, n in chunks), heads, head_dim, q_dtype, gen)
    scale = head_dim ** -0.5
    out, lse = pd.prefill(q, paged.k_cache, paged.v_cache, chunk_segments(paged, chunks), scale, split_tokens)
    assert out.dtype == lse.dtype == torch.float32 and out.shape == q.shape and not out.isnan().any()
    atol, rtol = ATOL, RTOL
    # the blocked routine's head dims
    bound = bf16_probs_atol(kv_dtype, paged.values) if head_dim in (64, 128) else None
    if bound is not None:  # its probabilities are bf16 for the value product (as SDPA's bf16 path's are)
        atol, rtol = bound, 0.0
    torch.testing.assert_close(out.double(), chunk_reference(q, paged, chunks, scale), atol=atol, rtol=rtol,
                               msg=lambda m: f"seed {seed}: {m}")


def test_a_causal_segment_with_fewer_tokens_than_rows_is_refused():
    gen, _ = new_generator()
    paged = make_paged([10], BS, 1, 64, torch.float32, gen)
    segs = pd.pack_segments([(range(11), paged.block_tables[0, :1].tolist(), 10)])
    with pytest.raises(RuntimeError, match="fewer tokens than query rows"):
        pd.prefill(torch.randn(11, 2, 64), paged.k_cache, paged.v_cache, segs, 0.125)


def test_the_cpu_backend_extends_like_the_torch_backend():
    """A step with two decode rows and three chunks over bf16 K/V: the cpu backend's prefill rows
    (paged_prefill where the kernel has its blocked bf16 path, else SDPA as in the torch backend) match the
    torch backend's within the 16-bit rounding of its SDPA, and every row (decode rows too) is float64's,
    rounded to bf16."""
    gen, seed = new_generator()
    chunks = [(0, 40), (48, 33), (555, 130)]
    paged = make_paged([c + n for c, n in chunks] + [70, 90], BS, 3, 64, torch.bfloat16, gen)
    width = paged.block_tables.shape[1]
    prefills, row = [], 2
    for c, (cached, new) in enumerate(chunks):
        prefills.append(PrefillChunk(q_start=row, q_len=new, seq_len=cached + new,
                                     block_table=paged.block_tables[c].long()))
        row += new
    meta = AttentionMetadata(slot_mapping=torch.zeros(row, dtype=torch.long), num_decode=2,
                             decode_block_tables=paged.block_tables[3:].long().reshape(2, width),
                             decode_context_lens=torch.tensor([70, 90]), prefills=prefills,
                             max_decode_context=90)
    q = torch.randn(row, 9, 64, generator=gen).bfloat16()
    cpu = backend.create("cpu")
    ours = cpu.forward(q, paged.k_cache, paged.v_cache, meta, 0.125)
    assert ours.dtype == torch.bfloat16
    theirs = TorchBackend().extend(q[2:], paged.k_cache, paged.v_cache, meta, 0.125)
    torch.testing.assert_close(ours[2:].float(), theirs.float(), atol=2e-2, rtol=2e-2,
                               msg=lambda m: f"seed {seed}: {m}")
    # each row is its float64 result rounded once to bf16
    exact = torch.cat([reference.paged_decode(q[:2], paged.k_cache, paged.v_cache, meta.decode_block_tables,
                                              [70, 90], 0.125), chunk_reference(q[2:], paged, chunks, 0.125)])
    torch.testing.assert_close(ours.double(), exact, atol=1e-2, rtol=8e-3, msg=lambda m: f"seed {seed}: {m}")


@pytest.mark.parametrize("amx_tiles", [False, True])
def test_the_cpu_backend_prefills_through_the_kernel_where_its_routine_outruns_sdpa(monkeypatch, amx_tiles):
    """Over bf16 K/V the kernel's blocked routine takes the prefill chunks; with AMX tiles torch's bf16 SDPA
    outruns it, so there the kernel takes only what its tile routine takes (bf16 queries of head_dim 64), SDPA
    the rest. Its bf16 K/V decode is priced as the blocked routine's, or with the tiles, for bf16 queries of
    the tile routine's head_dim over blocks it can tile, as the blocked routine's plain rows with
    the tiles' stacked ones."""
    from kvloop.engine.kernels.cpu import amx, build

    has_tiles = amx.available()  # this CPU's answer, before the backend is told otherwise
    monkeypatch.setattr(amx, "available", lambda: amx_tiles)
    cpu = backend.create("cpu")
    tiles = cpu._tiles
    assert tiles == (amx_tiles and has_tiles)  # on exactly where asked and the CPU (and the OS) has them
    assert (cpu._prefill is not None) == build.blocked_bf16()
    blocked = "cpu/avx512bf16" if build.blocked_bf16() else "cpu"
    assert cpu.cost_name(64, torch.float32, BS) == cpu.cost_name(128, torch.bfloat16, BS) == blocked
    # tiles of 16 tokens cross blocks of 8: not the tiles
    assert cpu.cost_name(64, torch.bfloat16, 8) == blocked
    assert cpu.cost_name(64, torch.bfloat16, BS) == ("cpu/amx" if tiles and build.blocked_bf16() else blocked)
    took: list[torch.dtype] = []
    if cpu._prefill is not None:
        kernel = cpu._prefill
        cpu._prefill = lambda q, *rest: took.append(q.dtype) or kernel(q, *rest)
    gen, _ = new_generator()
    chunks = [(48, 33)]
    paged = make_paged([81], BS, 3, 64, torch.bfloat16, gen)
    meta = AttentionMetadata(slot_mapping=torch.zeros(33, dtype=torch.long), num_decode=0,
                             decode_block_tables=None,
                             decode_context_lens=None, max_decode_context=0,
                             prefills=[PrefillChunk(q_start=0, q_len=33, seq_len=81,
                                                    block_table=paged.block_tables[0])])
    for q_dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(33, 9, 64, generator=gen).to(q_dtype)
        out = cpu.extend(q, paged.k_cache, paged.v_cache, meta, 0.125)
        torch.testing.assert_close(out.double(), chunk_reference(q, paged, chunks, 0.125), atol=2e-2,
                                   rtol=2e-2)
    assert took == ([] if not build.blocked_bf16() else [torch.bfloat16] if tiles else [torch.bfloat16,
                                                                                        torch.float32])
    # blocks of 8 tokens: the tile routine cannot take the chunk, so with the tiles SDPA does (not the pairs)
    took.clear()
    small = make_paged([81], 8, 3, 64, torch.bfloat16, gen)
    meta8 = AttentionMetadata(slot_mapping=torch.zeros(33, dtype=torch.long), num_decode=0,
                              decode_block_tables=None,
                              decode_context_lens=None, max_decode_context=0,
                              prefills=[PrefillChunk(q_start=0, q_len=33, seq_len=81,
                                                     block_table=small.block_tables[0])])
    q = torch.randn(33, 9, 64, generator=gen).bfloat16()
    out = cpu.extend(q, small.k_cache, small.v_cache, meta8, 0.125)
    torch.testing.assert_close(out.double(), chunk_reference(q, small, chunks, 0.125), atol=2e-2, rtol=2e-2)
    assert took == ([torch.bfloat16] if build.blocked_bf16() and not tiles else [])


@pytest.mark.parametrize("split_tokens", [512, 7], ids=["splits_512", "splits_7"])
def test_causal_segments_through_the_amx_tiles_equal_float64(split_tokens):
    """The AMX tile routine's causal runs (csrc/tile_amx.h: bf16 queries over bf16 K/V, head_dim 64) against
    float64 at the bf16 probabilities' bound, over CHUNKS (600 rows: runs of 60, each lane masked past
    its own tokens, steps of
    32 tokens ending mid-step) and a chunk over a long cached prefix; they ran (their bits are not the
    pairs'). Where they cannot take the call (splits not a multiple of 16 tokens) the results are
    the pairs' bit for bit."""
    gen, seed = new_generator()
    chunks = [*CHUNKS, (1952, 112)]
    paged = make_paged([c + n for c, n in chunks], BS, 3, 64, torch.bfloat16, gen)
    q = strided_rows(sum(n for _, n in chunks), 9, 64, torch.bfloat16, gen)
    segments = chunk_segments(paged, chunks)
    with stacked_tiles(True) as on:
        if not on:
            pytest.skip("no AMX tiles on this CPU (or not granted)")
        out, lse = pd.prefill(q, paged.k_cache, paged.v_cache, segments, 0.125, split_tokens)
    with stacked_tiles(False):
        pairs, pairs_lse = pd.prefill(q, paged.k_cache, paged.v_cache, segments, 0.125, split_tokens)
    if split_tokens % 16:
        assert torch.equal(out, pairs) and torch.equal(lse, pairs_lse)
        return
    assert not torch.equal(out, pairs)
    torch.testing.assert_close(out.double(), chunk_reference(q, paged, chunks, 0.125), rtol=0.0,
                               atol=bf16_probs_atol(torch.bfloat16, paged.values),
                               msg=lambda m: f"seed {seed}: {m}")
