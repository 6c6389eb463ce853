"""Cascade groups over a paged cache for the stacked-item tests (test_cpu_stacked_flash.py,
test_cpu_stacked_tiles.py):
a pool of bf16 or fp32 blocks handed out in order or scattered, groups of rows sharing documents (nested,
ending mid-block), and float64 attention of each row over its segments."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from kernel_ref import new_generator

from kvloop.engine.kernels import reference

BS, HEADS, KV_HEADS, HD = 16, 9, 3, 64
SCALE = HD ** -0.5


@contextmanager
def stacked_flash(on: bool) -> Iterator[None]:
    """The kernel's stacked flash (csrc/stacked_flash.h) switched on or off for the block."""
    before = torch.ops.kvloop_cpu.set_stacked_flash(on)
    try:
        yield
    finally:
        torch.ops.kvloop_cpu.set_stacked_flash(before)


@contextmanager
def stacked_tiles(on: bool) -> Iterator[bool]:
    """The kernel's AMX tile routine for stacked items (csrc/tile_amx.h) switched on or off for the block;
    yields whether it is on (it stays off where the build or the OS has no tiles)."""
    before = torch.ops.kvloop_cpu.stacked_tiles()
    try:
        yield torch.ops.kvloop_cpu.set_stacked_tiles(on)
    finally:
        torch.ops.kvloop_cpu.set_stacked_tiles(before)


class Pool:
    """A paged cache whose blocks are handed out in order (runs of adjacent ids) or scattered."""

    def __init__(self, num_blocks: int, dtype: torch.dtype, gen: torch.Generator):
        shape = (num_blocks, BS, KV_HEADS, HD)
        self.k = torch.randn(shape, generator=gen).to(dtype)
        self.v = torch.randn(shape, generator=gen).to(dtype)
        self.free = list(range(1, num_blocks))
        self.gen = gen

    def adjacent(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        return out

    def scattered(self, n: int) -> list[int]:
        picks = sorted(torch.randperm(len(self.free), generator=self.gen)[:n].tolist(), reverse=True)
        out = [self.free.pop(i) for i in picks]
        return out[::-1] if len(out) > 1 and out[0] + 1 == out[1] else out


def reference_rows(q, pool: Pool, parts, rows: int) -> torch.Tensor:
    """float64 attention of each row over the tokens of every segment naming it."""
    out = []
    for r in range(rows):
        ks, vs = [], []
        for members, blocks, n in parts:
            if r in members:
                ks.append(reference.gather(pool.k, torch.tensor(blocks), n))
                vs.append(reference.gather(pool.v, torch.tensor(blocks), n))
        out.append(reference.attention(q[r : r + 1], torch.cat(ks), torch.cat(vs), SCALE)[0])
    return torch.stack(out)


def group_parts(pool: Pool, rows: int, layout: str) -> list:
    """A document shared by rows 0-15 (1,000 tokens, ending mid-block) laid out as `layout`, a nested section
    shared by rows 0-7 (1,100 tokens in one run), a group of 3 (too small for flash) and
    each row's own tokens."""
    doc = {"adjacent": lambda: pool.adjacent(63),
           "runs": lambda: pool.adjacent(35) + pool.scattered(3) + pool.adjacent(25),
           "scattered": lambda: pool.scattered(63)}[layout]()
    parts = [(list(range(16)), doc, 1000), (list(range(8)), pool.adjacent(69), 1100),
             (list(range(16, 19)), pool.adjacent(63), 1000)]
    parts += [([r], pool.scattered(3), 17 + r) for r in range(rows)]
    return parts


def group_case(layout: str, rows: int = 20) -> tuple[int, Pool, list, torch.Tensor]:
    """(seed, pool, parts, bf16 queries) of group_parts over a fresh bf16 pool."""
    gen, seed = new_generator()
    pool = Pool(400, torch.bfloat16, gen)
    parts = group_parts(pool, rows, layout)
    return seed, pool, parts, torch.randn(rows, HEADS, HD, generator=gen).to(torch.bfloat16)


def held_to_bf16_error(out: torch.Tensor, ref: torch.Tensor, pool: Pool, seed: int) -> None:
    """out within a few 2^-9 of |v| of the float64 reference: bf16 probabilities (or
    outputs) before the merge."""
    bound = 2.0**-7 * pool.v.float().abs().max().item()
    torch.testing.assert_close(out.double(), ref.double(), atol=bound, rtol=0,
                               msg=lambda m: f"seed {seed}: {m}")


def fp32_cases(gen: torch.Generator) -> Iterator[tuple[Pool, list, torch.Tensor]]:
    """group_parts with fp32 K/V and queries, then bf16 K/V and fp32 queries: where no
    bf16-only routine applies."""
    for kv_dtype, q_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
        pool = Pool(400, kv_dtype, gen)
        parts = group_parts(pool, 20, "adjacent")
        yield pool, parts, torch.randn(20, HEADS, HD, generator=gen).to(q_dtype)
