"""Stacked flash (csrc/stacked_flash.h): a large cascade group's shared prefix over runs of adjacent blocks
through ATen's CPU flash attention, its partial results merged with the kernel's. Against float64 attention
over the same bf16 values (its outputs are rounded to bf16 before the merge: held to bf16 error), pieces mixed
with the kernel's (scattered blocks, short runs, nested groups, a prefix ending mid-block);
and where it must not run
(fp32 K/V, fp32 queries, small groups, switched off) the kernel's results bit for bit."""

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
    held_to_bf16_error,
    reference_rows,
    stacked_flash,
    stacked_tiles,
)

from kvloop.engine.kernels.cpu import amx, backend
from kvloop.engine.kernels.cpu import paged_decode as pd


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    load_attention_kernel()


@pytest.fixture(scope="module", autouse=True)
def no_stacked_tiles(kernel) -> None:
    """Where the AMX tile routine serves stacked items flash never runs
    (test_cpu_stacked_tiles.py): off here."""
    with stacked_tiles(False):
        yield


def decode(q, pool: Pool, parts, on: bool):
    with stacked_flash(on):
        return pd.decode(q, pool.k, pool.v, pd.pack_segments(parts), SCALE)


@pytest.mark.parametrize("layout", ["adjacent", "runs", "scattered"])
def test_flash_pieces_merged_with_the_kernels_equal_full_attention(layout):
    seed, pool, parts, q = group_case(layout)
    out, lse = decode(q, pool, parts, True)
    kernel_out, kernel_lse = decode(q, pool, parts, False)
    held_to_bf16_error(out, reference_rows(q, pool, parts, q.shape[0]), pool, seed)
    torch.testing.assert_close(lse, kernel_lse, atol=1e-4, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")
    if layout == "scattered":  # no run long enough: no flash piece, the kernel's own results
        assert torch.equal(out, kernel_out)
    else:  # the document's members took a flash piece (its bf16 rounding shows); the group of 3 did not
        assert not torch.equal(out[:16], kernel_out[:16])
        assert torch.equal(out[16:19], kernel_out[16:19])


def test_where_flash_does_not_apply_the_results_are_the_kernels_bit_for_bit():
    gen, _ = new_generator()
    for pool, parts, q in fp32_cases(gen):
        on, off = decode(q, pool, parts, True), decode(q, pool, parts, False)
        assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])
    pool = Pool(200, torch.bfloat16, gen)  # 3 members: below kFlashMinMembers however long
    parts = [([0, 1, 2], pool.adjacent(125), 2000)] + [([r], pool.scattered(2), 20) for r in range(3)]
    q = torch.randn(3, HEADS, HD, generator=gen).to(torch.bfloat16)
    on, off = decode(q, pool, parts, True), decode(q, pool, parts, False)
    assert torch.equal(on[0], off[0])


def test_a_member_with_no_other_part_gets_the_flash_result_directly():
    """Rows whose whole context is the shared run (no suffix segment) are written without a merge."""
    gen, seed = new_generator()
    pool = Pool(100, torch.bfloat16, gen)
    parts = [(list(range(16)), pool.adjacent(40), 630)]  # 16 x 630 (token, member) pairs: a flash piece
    q = torch.randn(16, HEADS, HD, generator=gen).to(torch.bfloat16)
    out, lse = decode(q, pool, parts, True)
    held_to_bf16_error(out, reference_rows(q, pool, parts, 16), pool, seed)
    assert torch.isfinite(lse).all()
    assert not torch.equal(out, decode(q, pool, parts, False)[0])  # the flash piece ran


def test_the_cpu_backend_switches_it_on_where_onednn_has_amx_tiles():
    with stacked_tiles(False), stacked_flash(False):
        backend.create("cpu")
        assert torch.ops.kvloop_cpu.set_stacked_flash(False) == amx.available()
