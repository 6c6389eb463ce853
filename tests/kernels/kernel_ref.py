"""Paged-cache builders, tolerances and checks for the kernel tests. The attention they are checked
against is the one torch reference, engine/kernels/reference.py (float64, over the unpaged K/V kept here).

Tolerances (atol, rtol), per dtype. Under the interpreter the kernels compute in fp32 from the same
dtype-rounded inputs the reference sees, so what remains is fp32 reassociation (online softmax, exp2,
split merge: ~1e-6) plus rounding the output to the dtype once: half an ulp is 2^-11 relative for fp16
and 2^-8 for bf16. Outputs are convex combinations of N(0, 1) values (|out| < ~4), so allowing about
two output ulps at the largest magnitudes gives the numbers below; a real indexing or masking error
is off by O(1).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kvloop.engine.kernels import reference

TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def new_generator() -> tuple[torch.Generator, int]:
    """Fresh inputs for every case; the seed is printed in failures (set KVLOOP_TEST_SEED to replay)."""
    seed = int(os.environ.get("KVLOOP_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    return torch.Generator().manual_seed(seed), seed


@contextlib.contextmanager
def poisoned_alloc() -> Iterator[None]:
    """Every torch.empty inside (the kernels' outputs and split-K workspaces) comes back NaN-filled, so
    an element a kernel forgets to write cannot pass by holding a stale correct value."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, seed: int) -> None:
    atol, rtol = TOL[dtype]
    assert out.dtype == dtype
    assert not out.isnan().any(), f"NaN in output (seed {seed})"
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=rtol, msg=lambda m: f"seed {seed}: {m}")


@dataclass
class Paged:
    k_cache: torch.Tensor  # [num_blocks, block_size, n_kv, hd], unwritten slots NaN
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [S, max_blocks + 1], shuffled ids, padded with 0 (a NaN block)
    keys: list[torch.Tensor]  # per sequence [n, n_kv, hd] fp32, holding the dtype-rounded values
    values: list[torch.Tensor]


def make_paged(
    seq_lens: list[int], block_size: int, n_kv: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> Paged:
    """Contiguous per-sequence K/V scattered into randomly ordered pages. Block 0 is never used, so a
    kernel that follows a padding entry of the table reads NaN and fails loudly."""
    counts = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(counts) + 3
    ids = 1 + torch.randperm(num_blocks - 1, generator=gen)
    shape = (num_blocks, block_size, n_kv, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    tables = torch.zeros(len(seq_lens), max(counts, default=0) + 1, dtype=torch.int32)
    keys, values, used = [], [], 0
    for s, n in enumerate(seq_lens):
        k = torch.randn(n, n_kv, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, n_kv, head_dim, generator=gen).to(dtype)
        for j in range(counts[s]):
            blk = int(ids[used + j])
            tables[s, j] = blk
            chunk = slice(j * block_size, min(n, (j + 1) * block_size))
            k_cache[blk, : chunk.stop - chunk.start] = k[chunk]
            v_cache[blk, : chunk.stop - chunk.start] = v[chunk]
        used += counts[s]
        keys.append(k.float())
        values.append(v.float())
    return Paged(k_cache, v_cache, tables, keys, values)


def strided_rows(n: int, heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """[n, heads, head_dim] as a column slice of a wider fused-projection output (row stride larger than
    heads * head_dim), the way the runner hands q/k/v to the kernels."""
    wide = torch.randn(n, (heads + 5) * head_dim, generator=gen).to(dtype)
    return wide[:, 2 * head_dim : (heads + 2) * head_dim].view(n, heads, head_dim)


def cascade_ref(q: torch.Tensor, paged: Paged, scale: float) -> torch.Tensor:
    """What cascade attention must equal: each row's plain attention over its whole context, in float64."""
    return torch.cat([reference.attention(q[b : b + 1], paged.keys[b], paged.values[b], scale)
                      for b in range(q.shape[0])])


def make_cascade_paged(
    seq_lens: list[int], segments: list, block_size: int, n_kv: int, head_dim: int, dtype: torch.dtype,
    gen: torch.Generator,
) -> Paged:
    """Like make_paged, but the rows of each segment (objects with level, start, end, rows) hold equal K/V
    for its tokens. Pages are shared the way a prefix cache shares them: rows whose tokens in a block all
    come from the same owners (segments, or the row itself) point to one page; a block only partly in a
    segment (a prefix ending mid-block) is a separate page per row holding an equal copy of the shared
    tokens. Every page's unused slots stay NaN."""
    owner: dict[tuple[int, int], object] = {}  # (row, token) -> the deepest segment holding it (hashable)
    for seg in sorted(segments, key=lambda s: s.level):
        for r in seg.rows:
            for t in range(seg.start, seg.end):
                owner[(r, t)] = seg
    values_of: dict[tuple[int, object], tuple[torch.Tensor, torch.Tensor]] = {}

    def kv(r: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (t, owner.get((r, t), ("own", r)))
        if key not in values_of:
            pair = torch.randn(2, n_kv, head_dim, generator=gen).to(dtype)
            values_of[key] = (pair[0], pair[1])
        return values_of[key]

    pages: dict[tuple, int] = {}  # identity of a page's contents -> page id (0 is never used)
    tables = torch.zeros(len(seq_lens), max((-(-n // block_size) for n in seq_lens), default=0) + 1,
                         dtype=torch.int32)
    for r, n in enumerate(seq_lens):
        for j in range(-(-n // block_size)):
            tokens = range(j * block_size, min(n, (j + 1) * block_size))
            ident = (j, tuple(owner.get((r, t), ("own", r)) for t in tokens))
            tables[r, j] = pages.setdefault(ident, len(pages) + 1)
    num_blocks = len(pages) + 4
    ids = torch.cat([torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(num_blocks - 1, generator=gen)])
    tables = ids[tables.long()].to(torch.int32)  # shuffled page order; padding stays 0
    shape = (num_blocks, block_size, n_kv, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    keys, values = [], []
    for r, n in enumerate(seq_lens):
        pairs = [kv(r, t) for t in range(n)]
        k = torch.stack([p[0] for p in pairs]) if pairs else torch.zeros(0, n_kv, head_dim, dtype=dtype)
        v = torch.stack([p[1] for p in pairs]) if pairs else torch.zeros(0, n_kv, head_dim, dtype=dtype)
        for t in range(n):
            k_cache[tables[r, t // block_size], t % block_size] = k[t]
            v_cache[tables[r, t // block_size], t % block_size] = v[t]
        keys.append(k.float())
        values.append(v.float())
    return Paged(k_cache, v_cache, tables, keys, values)
