"""Paged inputs for the GPU check and float64 references computed from the pages gathered back into
contiguous per-sequence K/V (so the reference shares no indexing code with the kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def gather(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """One sequence's first n tokens, [n, n_kv, hd] in float64."""
    block_size = cache.shape[1]
    pages = cache[table_row[: -(-n // block_size)].long()]
    return pages.reshape(-1, *cache.shape[2:])[:n].double()


def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, first_pos: int | None) -> torch.Tensor:
    """float64 softmax attention; q [Tq, H, D], k/v [Tk, KV, D]; causal from first_pos when given."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if first_pos is not None:
        q_pos = first_pos + torch.arange(q.shape[0], device=q.device)
        hidden = torch.arange(k.shape[0], device=q.device)[None, :] > q_pos[:, None]
        scores = scores.masked_fill(hidden[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def decode_ref(q: torch.Tensor, kv: PagedKV, lens: list[int], scale: float) -> torch.Tensor:
    rows = [
        attention64(q[b : b + 1], gather(kv.k_cache, kv.block_tables[b], n), gather(kv.v_cache, kv.block_tables[b], n),
                    scale, None)
        for b, n in enumerate(lens)
    ]
    return torch.cat(rows)


def extend_ref(q: torch.Tensor, kv: PagedKV, seqs: list[tuple[int, int]], scale: float) -> torch.Tensor:
    """seqs: (cached prefix, new tokens) per sequence, queries packed in that order."""
    rows, start = [], 0
    for s, (prefix, n_new) in enumerate(seqs):
        total = prefix + n_new
        k = gather(kv.k_cache, kv.block_tables[s], total)
        v = gather(kv.v_cache, kv.block_tables[s], total)
        rows.append(attention64(q[start : start + n_new], k, v, scale, prefix))
        start += n_new
    return torch.cat(rows)


def share_pages(kv: PagedKV, segments: list, block_size: int) -> None:
    """Make each segment's rows hold its tokens in the same pages, as the prefix cache does: their table
    entries for the blocks covering [start, end) point to the first member's pages (levels in order)."""
    for seg in sorted(segments, key=lambda s: s.level):
        lo, hi = seg.start // block_size, -(-seg.end // block_size)
        rows = torch.tensor(seg.rows, device=kv.block_tables.device)
        kv.block_tables[rows, lo:hi] = kv.block_tables[seg.rows[0], lo:hi]
