"""Paged inputs for the GPU check, and its float64 references: the project's one torch reference
(engine/kernels/reference.py), which gathers the pages back into contiguous per-sequence K/V and shares
no indexing code with the kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvloop.engine.kernels import reference


@dataclass
class PagedKV:
    k_cache: torch.Tensor  # [num_blocks, block_size, n_kv, hd]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [S, max_blocks], shuffled, 0-padded


def make_paged(lens: list[int], block_size: int, n_kv: int, hd: int, dtype: torch.dtype,
               device: torch.device, gen: torch.Generator) -> PagedKV:
    counts = [-(-n // block_size) for n in lens]
    num_blocks = 1 + sum(counts)
    ids = (1 + torch.randperm(num_blocks - 1, generator=gen)).tolist()
    tables = torch.zeros(len(lens), max(counts) + 1, dtype=torch.int32)
    used = 0
    for s, c in enumerate(counts):
        tables[s, :c] = torch.tensor(ids[used : used + c], dtype=torch.int32)
        used += c
    shape = (num_blocks, block_size, n_kv, hd)
    k = torch.randn(shape, device=device, dtype=dtype)
    v = torch.randn(shape, device=device, dtype=dtype)
    return PagedKV(k, v, tables.to(device))


def decode_ref(q: torch.Tensor, kv: PagedKV, lens: list[int], scale: float) -> torch.Tensor:
    return reference.paged_decode(q, kv.k_cache, kv.v_cache, kv.block_tables, lens, scale)


def extend_ref(q: torch.Tensor, kv: PagedKV, seqs: list[tuple[int, int]], scale: float) -> torch.Tensor:
    """seqs: (cached prefix, new tokens) per sequence, queries packed in that order."""
    starts = [0]
    for _, n_new in seqs:
        starts.append(starts[-1] + n_new)
    return reference.paged_extend(q, kv.k_cache, kv.v_cache, kv.block_tables, starts,
                                  [p + n for p, n in seqs], scale)


def share_pages(kv: PagedKV, segments: list, block_size: int) -> None:
    """Make each segment's rows hold its tokens in the same pages, as the prefix cache does: their table
    entries for the blocks covering [start, end) point to the first member's pages (levels in order)."""
    for seg in sorted(segments, key=lambda s: s.level):
        lo, hi = seg.start // block_size, -(-seg.end // block_size)
        rows = torch.tensor(seg.rows, device=kv.block_tables.device)
        kv.block_tables[rows, lo:hi] = kv.block_tables[seg.rows[0], lo:hi]
