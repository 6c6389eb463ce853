"""The CPU paged decode kernel (csrc/paged_decode.cpp) from Python: segments packed for it, and a decode
step over AttentionMetadata, plain or with the step's cascade groups.

A segment is a set of query rows attending to the same tokens of the paged cache: a run of block ids and
a token count, starting on a block edge. Plain decode is one segment per row over its whole context (the
runner's block tables are handed over as they are). Cascade adds one segment per shared prefix, with its
members' queries stacked so that each K/V token is read once for all of them; each row's own part is a
segment of its own. `decode` gives each row the exact softmax over all its segments: the kernel merges a
row's partial results by log-sum-exp inside the call, so a cascade step is one operator call per layer, as a
plain one is. `attend` gives the partial results themselves, per (segment, row) pair (tests, calibration).
Needs the built kernel: build.load() first (it registers the operators' fakes for torch.compile too)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata

# Tokens per context split: a fixed length (not one derived from the batch or the thread count), so that a
# row's result is the same whatever else is in the batch. Long enough that a split's fixed cost (its queries,
# its partial result) is small against streaming its K/V, short enough to spread one long row over threads.
SPLIT_TOKENS = 512


@dataclass(frozen=True)
class Segments:
    """The kernel's work list: segment s attends with query rows rows[rows_ptr[s]:rows_ptr[s + 1]] to its
    first tokens[s] tokens, held in blocks[block_start[s]:]. Each (segment, row) pair is one output."""
    blocks: torch.Tensor  # int64: block ids, each segment's from its first token on
    block_start: torch.Tensor  # int64 [S]
    tokens: torch.Tensor  # int64 [S]
    rows_ptr: torch.Tensor  # int64 [S + 1]
    rows: torch.Tensor  # int64 [P]: query rows (indices into q), segment by segment

    @property
    def num_pairs(self) -> int:
        return self.rows.numel()


def _long(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.long).contiguous()


def plain_segments(block_tables: torch.Tensor, context_lens: torch.Tensor) -> Segments:
    """Row b over its first context_lens[b] tokens through block_tables[b] (tables used in place)."""
    batch, width = block_tables.shape
    return Segments(_long(block_tables).view(-1), torch.arange(batch, dtype=torch.long) * width,
                    _long(context_lens),
                    torch.arange(batch + 1, dtype=torch.long), torch.arange(batch, dtype=torch.long))


def pack_segments(parts: Sequence[tuple[Sequence[int], Sequence[int], int]]) -> Segments:
    """parts: (query rows, block ids from the segment's first token on, tokens) per segment."""
    blocks: list[int] = []
    starts, tokens, ptr, rows = [], [], [0], []
    for members, block_ids, n in parts:
        starts.append(len(blocks))
        blocks.extend(block_ids)
        tokens.append(n)
        rows.extend(members)
        ptr.append(len(rows))
    return Segments(_long(blocks), _long(starts), _long(tokens), _long(ptr), _long(rows))


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, segments: Segments, scale: float,
           split_tokens: int = SPLIT_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """q [R, heads, hd]; k_cache / v_cache [num_blocks, block_size, kv_heads, hd] (fp32, bf16 or fp16) →
    (out [P, heads, hd] fp32, normalised; lse [P, heads] fp32, natural log-sum-exp of the scaled scores)
    per (segment, row) pair, in segment order. A segment without tokens gives zeros and -inf."""
    return _run(torch.ops.kvloop_cpu.paged_attention, q, k_cache, v_cache, segments, scale, split_tokens)


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, segments: Segments, scale: float,
           split_tokens: int = SPLIT_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """q [R, heads, hd] → (out [R, heads, hd] fp32, lse [R, heads] fp32): row r attends to the tokens of every
    segment that names it, its partial results merged exactly inside the kernel (a row no segment names gets
    zeros and -inf). The segments of one row must cover disjoint tokens (its context, split up)."""
    return _run(torch.ops.kvloop_cpu.paged_decode, q, k_cache, v_cache, segments, scale, split_tokens)


def prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, segments: Segments, scale: float,
            split_tokens: int = SPLIT_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """decode with causal segments: a segment's rows are consecutive positions ending at its last token (a
    prefill chunk whose K/V are already in the cache), so its j-th of m rows sees its first tokens - (m - 1 -
    j) tokens. Rows of several segments are merged as in decode (a chunk's context split into runs, say)."""
    return _run(torch.ops.kvloop_cpu.paged_prefill, q, k_cache, v_cache, segments, scale, split_tokens)


def _run(op, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, segments: Segments, scale: float,
         split_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One of the three ops over the segments' index tensors (the kernel reads q's rows contiguously)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    return op(q, k_cache, v_cache, segments.blocks, segments.block_start, segments.tokens, segments.rows_ptr,
              segments.rows, float(scale), int(split_tokens))


def _pair_shapes(q, k_cache, v_cache, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens):
    """paged_attention's outputs without running it (one per (segment, row) pair)."""
    pairs, heads, hd = rows.shape[0], q.shape[1], q.shape[2]
    return q.new_empty(pairs, heads, hd, dtype=torch.float32), q.new_empty(pairs, heads, dtype=torch.float32)


def _row_shapes(q, k_cache, v_cache, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens):
    """paged_decode's outputs without running it (one per query row)."""
    return q.new_empty(q.shape, dtype=torch.float32), q.new_empty(q.shape[:2], dtype=torch.float32)


def register_fakes() -> None:
    """The operators' output shapes for torch.compile's tracing; build.load calls this once the library is
    loaded, so they are there whatever was imported first."""
    torch.library.register_fake("kvloop_cpu::paged_attention")(_pair_shapes)
    torch.library.register_fake("kvloop_cpu::paged_decode")(_row_shapes)
    torch.library.register_fake("kvloop_cpu::paged_prefill")(_row_shapes)


def decode_work(meta: AttentionMetadata, block_size: int) -> Segments:
    """One step's segments, built once and used by every layer. Groups come first: their items are the
    heaviest (many stacked queries), so the threads start them first and the rows' own parts fill in around
    them; a row's partial results merge in this order (its groups, parents first, then its own part)."""
    n = meta.num_decode
    plan = meta.cascade
    if plan is None or not plan.groups:
        return plain_segments(meta.decode_block_tables[:n], meta.decode_context_lens[:n])
    tables = meta.decode_block_tables.tolist()
    lens = meta.decode_context_lens.tolist()
    parts: list[tuple[Sequence[int], Sequence[int], int]] = [(g.rows, g.block_ids,
                                                              g.num_tokens) for g in plan.groups]
    for r in range(n):
        start = plan.suffix_start[r]
        parts.append(([r], tables[r][start // block_size: -(-lens[r] // block_size)], lens[r] - start))
    return pack_segments(parts)


def prefill_work(meta: AttentionMetadata, block_size: int) -> Segments:
    """One step's prefill chunks as causal segments over their whole context, rows counted from the first
    prefill row (extend's q holds the prefill rows only)."""
    first = meta.num_decode
    return pack_segments([(range(c.q_start - first, c.q_start - first + c.q_len),
                           c.block_table[: -(-c.seq_len // block_size)].tolist(),
                           c.seq_len) for c in meta.prefills])


class _StepKernel:
    """One of the kernel's step calls (decode or prefill) over a work list built on a step's first layer and
    reused by the others; q's rows → the same shape in q's dtype."""

    def __init__(self, build: Callable[[AttentionMetadata, int], Segments], run: Callable[..., tuple],
                 split_tokens: int = SPLIT_TOKENS):
        self.split_tokens = split_tokens
        self._build, self._run = build, run
        self._meta: AttentionMetadata | None = None  # kept alive while cached, so `is` cannot match a new one
        self._work: Segments | None = None

    def work(self, meta: AttentionMetadata, block_size: int) -> Segments:
        if meta is not self._meta or self._work is None:
            self._work = self._build(meta, block_size)
            self._meta = meta
        return self._work

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                 scale: float) -> torch.Tensor:
        out, _ = self._run(q, k_cache, v_cache, self.work(meta, k_cache.shape[1]), scale, self.split_tokens)
        return out.to(q.dtype)


class CpuDecode(_StepKernel):
    """Decode rows through the kernel, with the same contract as torch_decode.decode_attention (q [num_decode,
    heads, hd]): one kernel call per layer, cascade or not."""

    def __init__(self, split_tokens: int = SPLIT_TOKENS):
        super().__init__(decode_work, decode, split_tokens)


class CpuPrefill(_StepKernel):
    """Prefill rows through the kernel's causal segments, with the contract of AttentionBackend.extend (q [N -
    num_decode, heads, hd]): every chunk of the step in one call per layer, its context read in place (no
    gathered copy of it)."""

    def __init__(self, split_tokens: int = SPLIT_TOKENS):
        super().__init__(prefill_work, prefill, split_tokens)
