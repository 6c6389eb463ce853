"""Decode attention on the torch (CPU) path that reads the paged cache in place, with cascade over
shared prefixes.

A row's context is read as runs of consecutive block ids: k_cache[first:first + n] is a view of a run,
so no block is copied and no row is padded to another's length. Scores of all runs land in one fp32
buffer, so one exact softmax covers the whole span. A cascade group stacks its members' query heads
into one matrix against the shared blocks (a matrix product instead of one thin product per row); its
partial result is merged with each member's own suffix exactly, by log-sum-exp.

Products run in the model dtype (bf16 matmul is fast on CPUs with AVX512-BF16); a KV cache stored in
another dtype (16-bit KV under an fp32 model) is converted run by run, so it is read at half the bytes
and accumulated in fp32."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvloop.engine.cascade.cost import cost_for
from kvloop.engine.kernels.attention_meta import AttentionMetadata

Run = tuple[int, int, int]  # (first block id, blocks, tokens): a view k_cache[first:first + blocks]


def runs_of(table: list[int], start: int, end: int, block_size: int) -> list[Run]:
    """Tokens [start, end) of a row (start on a block edge) as runs of consecutive block ids."""
    runs: list[Run] = []
    first_blk = start // block_size
    last_blk = -(-end // block_size)
    j = first_blk
    while j < last_blk:
        k = j + 1
        while k < last_blk and table[k] == table[k - 1] + 1:
            k += 1
        tokens = min(end, k * block_size) - j * block_size
        runs.append((int(table[j]), k - j, tokens))
        j = k
    return runs


@dataclass
class GroupWork:
    rows: torch.Tensor  # int64 member rows
    runs: list[Run]


@dataclass
class ShortRows:
    """Rows whose own parts are short and of similar length: copied out together (a bounded copy, padded
    to the longest of the bucket) and attended as one batch."""
    rows: torch.Tensor  # int64 [R]
    tables: torch.Tensor  # int64 [R, W]: each row's blocks from its suffix start, padded with a real block
    lens: torch.Tensor  # int64 [R]: own tokens per row (>= 1)


@dataclass
class DecodeWork:
    """What every layer of one step does (built once per step from the metadata)."""
    # per row: its own part [suffix_start, context_len) read in place ([] if short/empty)
    own: list[list[Run]]
    short: list[ShortRows]  # length buckets
    groups: list[GroupWork]


# Short rows are bucketed so that padding stays under a quarter of a bucket's longest row (or one block).
BUCKET_SLACK = 1.25


def bucket_short_rows(rows: list[tuple[int, list[int], int]], device) -> list[ShortRows]:
    """rows: (row, its blocks from its suffix start, own tokens), each one a batch call per bucket."""
    buckets: list[list[tuple[int, list[int], int]]] = []
    for item in sorted(rows, key=lambda x: x[2]):
        if buckets and item[2] <= max(buckets[-1][0][2] * BUCKET_SLACK, buckets[-1][0][2] + 16):
            buckets[-1].append(item)
        else:
            buckets.append([item])
    out = []
    for bucket in buckets:
        width = max(len(t) for _, t, _ in bucket)
        out.append(ShortRows(torch.tensor([r for r, _, _ in bucket], dtype=torch.long, device=device),
                             torch.tensor([t + [t[0]] * (width - len(t)) for _, t, _ in bucket],
                                          dtype=torch.long,
                                          device=device),
                             torch.tensor([n for _, _, n in bucket], dtype=torch.long, device=device)))
    return out


def decode_work(meta: AttentionMetadata, block_size: int, copy_max_tokens: int) -> DecodeWork:
    """copy_max_tokens: own parts up to this long are copied and batched (per-call overhead of thin
    products outweighs the copy there; measured per KV dtype in cascade_cost), longer ones read in place."""
    if meta._decode_work is None:
        tables = meta.decode_block_tables.tolist()
        lens = meta.decode_context_lens.tolist()
        plan = meta.cascade
        starts = plan.suffix_start if plan is not None else [0] * len(lens)
        own: list[list[Run]] = []
        short = []
        for r, (t, s, n) in enumerate(zip(tables, starts, lens, strict=True)):
            if 0 < n - s <= copy_max_tokens:
                short.append((r, t[s // block_size: -(-n // block_size)], n - s))
                own.append([])
            else:
                own.append(runs_of(t, s, n, block_size))
        groups = []
        for g in plan.groups if plan is not None else ():
            table = [0] * (g.start_token // block_size) + list(g.block_ids)
            groups.append(GroupWork(torch.tensor(g.rows, dtype=torch.long, device=meta.slot_mapping.device),
                                    runs_of(table, g.start_token, g.start_token + g.num_tokens, block_size)))
        meta._decode_work = DecodeWork(own, bucket_short_rows(short, meta.slot_mapping.device), groups)
    return meta._decode_work


def span_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, runs: list[Run],
                   scale: float, need_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows q [R, heads, hd] all attend to the tokens of `runs` → (out [R, heads, hd] fp32, normalised;
    lse [R, heads] fp32, the log-sum-exp of the scaled scores, for merging with other partials).

    Per KV head, the R * group query heads form one [M, hd] matrix; a run's [n, hd] key slice has unit
    inner stride, so BLAS reads it in place."""
    rows, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    group = heads // n_kv
    m = rows * group
    cdt = q.dtype
    # [kv, M, hd]; the scale folded into q so the score buffer needs no extra pass
    qh = (q * scale).view(rows, n_kv, group, hd).transpose(0, 1).reshape(n_kv, m, hd)
    total = sum(r[2] for r in runs)
    views = []
    for first, blocks, tokens in runs:
        k = k_cache[first:first + blocks].view(-1, n_kv, hd)[:tokens]
        v = v_cache[first:first + blocks].view(-1, n_kv, hd)[:tokens]
        if k.dtype != cdt:  # 16-bit storage under a wider model dtype: read half the bytes, convert
            k, v = k.to(cdt), v.to(cdt)
        views.append((k, v))
    if len(views) == 1:
        k, v = views[0]
        scores = torch.stack([qh[h] @ k[:, h].T for h in range(n_kv)]).float()
    else:
        scores = torch.empty(n_kv, m, total, dtype=torch.float32, device=q.device)
        pos = 0
        for k, _ in views:
            n = k.shape[0]
            for h in range(n_kv):
                scores[h, :, pos:pos + n] = qh[h] @ k[:, h].T
            pos += n
    # torch's fused softmax is ~3x faster here than logsumexp + exp; the log-sum-exp is recovered
    # exactly from the largest probability: p_max = exp(s_max - lse) >= 1/n, so lse = s_max - log(p_max)
    probs = torch.softmax(scores, dim=-1)
    lse = scores.amax(-1) - probs.amax(-1).log() if need_lse else None
    probs = probs.to(cdt)
    if len(views) == 1:
        v = views[0][1]
        out = torch.stack([probs[h] @ v[:, h] for h in range(n_kv)]).float()
    else:
        out = torch.zeros(n_kv, m, hd, dtype=torch.float32, device=q.device)
        pos = 0
        for _, v in views:
            n = v.shape[0]
            for h in range(n_kv):
                out[h] += probs[h, :, pos:pos + n] @ v[:, h]
            pos += n
    out = out.view(n_kv, rows, group, hd).transpose(0, 1).reshape(rows, heads, hd)
    return out, None if lse is None else lse.view(n_kv, rows, group).transpose(0, 1).reshape(rows, heads)


def gathered_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, short: ShortRows,
                       scale: float, need_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The short rows (q [R, heads, hd]) over their own parts, copied out and padded to the longest of
    them → (out [R, heads, hd] fp32, lse [R, heads] fp32 or None)."""
    rows, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    group = heads // n_kv
    cdt = q.dtype
    span = short.tables.shape[1] * k_cache.shape[1]
    keys = k_cache.index_select(0, short.tables.view(-1)).view(rows, span, n_kv, hd)
    values = v_cache.index_select(0, short.tables.view(-1)).view(rows, span, n_kv, hd)
    if keys.dtype != cdt:
        keys, values = keys.to(cdt), values.to(cdt)
    qg = (q * scale).view(rows, n_kv, group, hd)
    scores = torch.empty(rows, n_kv, group, span, dtype=torch.float32, device=q.device)
    for h in range(n_kv):
        scores[:, h] = torch.bmm(qg[:, h], keys[:, :, h].transpose(1, 2))
    pad = torch.arange(span, device=q.device)[None, :] >= short.lens[:, None]
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    lse = scores.amax(-1) - probs.amax(-1).log() if need_lse else None
    probs = probs.to(cdt)
    out = torch.empty(rows, n_kv, group, hd, dtype=torch.float32, device=q.device)
    for h in range(n_kv):
        out[:, h] = torch.bmm(probs[:, h], values[:, :, h])
    return out.view(rows, heads, hd), None if lse is None else lse.view(rows, heads)


def merge_into(acc: torch.Tensor, acc_lse: torch.Tensor, rows: torch.Tensor | slice, out: torch.Tensor,
               lse: torch.Tensor) -> None:
    """acc[rows] ← the exact softmax combination of acc[rows] and a partial (out, lse) over other tokens."""
    a = acc_lse[rows]
    top = torch.logaddexp(a, lse)
    acc[rows] = acc[rows] * (a - top).exp_()[..., None] + out * (lse - top).exp_()[..., None]
    acc_lse[rows] = top


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float) -> torch.Tensor:
    """q [B, heads, hd] (the decode rows) → [B, heads, hd]: in place over the paged cache, with the
    step's cascade groups (meta.cascade) when there are any."""
    work = decode_work(meta, k_cache.shape[1], cost_for(str(k_cache.dtype)).copy_max_tokens)
    batch, heads, hd = q.shape
    if not work.groups:
        out = torch.empty_like(q)
        for short in work.short:
            out[short.rows] = gathered_attention(q[short.rows], k_cache, v_cache, short, scale,
                                                 False)[0].to(q.dtype)
        for r, runs in enumerate(work.own):
            if runs:
                out[r] = span_attention(q[r:r + 1], k_cache, v_cache, runs, scale, need_lse=False)[0][0]
        return out
    acc = torch.zeros(batch, heads, hd, dtype=torch.float32, device=q.device)
    acc_lse = torch.full((batch, heads), float("-inf"), device=q.device)
    # own parts first (a row whose context is all shared has none), then each group merged in
    for short in work.short:
        acc[short.rows], acc_lse[short.rows] = gathered_attention(q[short.rows], k_cache, v_cache, short,
                                                                  scale, True)
    for r, runs in enumerate(work.own):
        if runs:
            acc[r], acc_lse[r] = (t[0] for t in span_attention(q[r:r + 1], k_cache, v_cache, runs, scale))
    for g in work.groups:
        out, lse = span_attention(q.index_select(0, g.rows), k_cache, v_cache, g.runs, scale)
        merge_into(acc, acc_lse, g.rows, out, lse)
    return acc.to(q.dtype)
