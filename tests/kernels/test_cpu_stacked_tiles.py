"""The AMX tile routine for stacked items (csrc/tile_amx.h): a cascade group's shared prefix scored and
weighted as tile products, 16 queries at a time. Against float64 attention over the same bf16
values, held to bf16 error
(the probabilities are rounded to bf16 for the values' product): groups of 2 to 16 members (queries past 16
take a second block of lanes), nested, ending mid-block (a partial last tile), over adjacent, split and
scattered blocks, with every KV head in one item or one head an item; where it must not run (fp32 K/V or
queries, a split that is not a multiple of 16 tokens) the other routines' results bit for bit."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import load_attention_kernel, new_generator
from stacked_cases import (
    HD,
    HEADS,
    SCALE,
    Pool,
    fp32_cases,
    group_case,
    group_parts,
    held_to_bf16_error,
    reference_rows,
    stacked_flash,
    stacked_tiles,
)

from kvloop.engine.kernels.cpu import amx, backend
from kvloop.engine.kernels.cpu import paged_decode as pd


@pytest.fixture(scope="module", autouse=True)
def tiles() -> None:
    load_attention_kernel()
    with stacked_tiles(True) as on:
        if not on:
            pytest.skip("the kernel has no AMX tiles on this machine")
    with stacked_flash(False):  # the tiles' results, not flash's, where both could apply
        yield


def decode(q, pool: Pool, parts, on: bool, split: int = pd.SPLIT_TOKENS):
    with stacked_tiles(on):
        return pd.decode(q, pool.k, pool.v, pd.pack_segments(parts), SCALE, split)


@pytest.mark.parametrize("layout", ["adjacent", "runs", "scattered"])
def test_stacked_items_through_the_tiles_equal_full_attention(layout):
    seed, pool, parts, q = group_case(layout)
    out, lse = decode(q, pool, parts, True)
    pairs_out, pairs_lse = decode(q, pool, parts, False)
    held_to_bf16_error(out, reference_rows(q, pool, parts, q.shape[0]), pool, seed)
    torch.testing.assert_close(lse, pairs_lse, atol=1e-4, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")
    assert not torch.equal(out[:19], pairs_out[:19])  # the groups took the tiles


@pytest.mark.parametrize("members", [2, 5, 6, 16])  # 6 members: 18 queries a head, a second block of 16 lanes
@pytest.mark.parametrize("tokens", [16, 250, 1000])  # one tile; partial last tiles; two context splits
def test_groups_of_every_size_with_and_without_their_own_tokens(members, tokens):
    gen, seed = new_generator()
    pool = Pool(200, torch.bfloat16, gen)
    parts = [(list(range(members)), pool.adjacent(-(-tokens // 16)), tokens)]
    parts += [([r], pool.scattered(2), 5 + r) for r in range(0, members, 2)]  # half the members have a suffix
    q = torch.randn(members, HEADS, HD, generator=gen).to(torch.bfloat16)
    out, lse = decode(q, pool, parts, True)
    held_to_bf16_error(out, reference_rows(q, pool, parts, members), pool, seed)
    assert torch.isfinite(lse).all()


def test_one_kv_head_an_item_gives_the_same_results():
    """A lone group spreads over the threads by KV head (one head an item) where it has too few splits for
    them: the tiles' lanes and the merge come out the same as with every head in one item."""
    gen, seed = new_generator()
    pool = Pool(200, torch.bfloat16, gen)
    parts = [(list(range(8)), pool.adjacent(125), 2000)]
    q = torch.randn(8, HEADS, HD, generator=gen).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        outs = []
        # 4 splits of 512: with 1 thread (at least 4 items a thread) every KV head in one item, with 4 threads
        # (fewer than 4 items a thread) one head an item (paged_decode.cpp, per_item)
        for n in (1, 4):
            torch.set_num_threads(n)
            outs.append(decode(q, pool, parts, True)[0])
    finally:
        torch.set_num_threads(threads)
    held_to_bf16_error(outs[0], reference_rows(q, pool, parts, 8), pool, seed)
    assert torch.equal(outs[0], outs[1])


def test_where_the_tiles_do_not_apply_the_results_are_the_other_routines_bit_for_bit():
    gen, _ = new_generator()
    for pool, parts, q in fp32_cases(gen):
        on, off = decode(q, pool, parts, True), decode(q, pool, parts, False)
        assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])
    pool = Pool(400, torch.bfloat16, gen)  # splits of 500 tokens: a tile would cross a block
    parts = group_parts(pool, 20, "adjacent")
    q = torch.randn(20, HEADS, HD, generator=gen).to(torch.bfloat16)
    on, off = decode(q, pool, parts, True, split=500), decode(q, pool, parts, False, split=500)
    assert torch.equal(on[0], off[0])


def test_the_cpu_backend_switches_the_tiles_on_where_onednn_has_amx_tiles():
    with stacked_tiles(False):
        backend.create("cpu")
        assert torch.ops.kvloop_cpu.stacked_tiles() == amx.available()
