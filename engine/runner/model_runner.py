"""Runs one scheduled batch through the model: builds the flattened inputs and attention metadata,
runs the forward pass, computes logits only where a token is sampled, and samples."""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from kvloop.engine.cascade.cost import cost_for
from kvloop.engine.cascade.plan import CascadePlan, CascadePlanner
from kvloop.engine.core.batch import ScheduledBatch, ScheduledSeq, StepResult
from kvloop.engine.core.cascade_scope import NESTED
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.runner import compiled_step
from kvloop.engine.runner.sampler import Sampler


def resolve_kv_dtype(kv_dtype: str, dtype_option: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV storage dtype: see EngineConfig.kv_dtype."""
    if kv_dtype != "auto":
        return getattr(torch, kv_dtype)
    if model_dtype == torch.float32 and dtype_option == "auto":
        # fp32 chosen for compute speed: KV still stored in 16 bits, read at half the bytes
        return torch.bfloat16
    return model_dtype


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 kv_dtype: torch.dtype | None = None,
                 cascade: str = "auto", cascade_groups: str = NESTED, compile: bool = False,
                 fingerprint: str = ""):
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache = model.new_kv_cache(num_blocks, block_size, kv_dtype)
        self.cascade = cascade
        # the decode path the model runs (its attention backend), whose trade-off the
        # scheduler prices steps with too
        self.attention_cost_name = model.attention.cost_name(model.cfg.head_dim, model.dtype, block_size)
        self.attention_cost = cost = cost_for(str(self.kv_cache.dtype), self.attention_cost_name)
        worth = (lambda members, tokens: members > 1) if cascade == "always" else cost.worth
        # cascade_groups: nested (any shared prefix) or common (only the prefix of all rows: continuous+lru)
        self.planner = CascadePlanner(block_size, worth, nested=cascade_groups == NESTED)
        self.cascade_group_sizes: Counter[int] = Counter()  # members per cascaded group, counted per step
        self.sampler = Sampler()
        self.device = model.device
        self.keep_all_logits = False  # tests: keep every row's logits of the last step in last_logits
        self.last_logits: torch.Tensor | None = None
        # the model's step compiled here (start-up); None: eager (not asked for, or compiling failed)
        # (fingerprint: the checkpoint's, which keys the compiled step saved for the next start)
        self.compiled = (compiled_step.compile_or_none(model, block_size, self.kv_cache.dtype, fingerprint)
                         if compile else None)

    def build_metadata(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        # decode entries: each row's own token first (the rows as a step without proposals lays them out),
        # then every proposal as a decode row of its own at the next position, over the row's blocks: the
        # arithmetic of an ordinary decode step at that position (the layer writes the whole step's K/V
        # before any row attends, so a proposal sees the ones before it)
        entries = [(item.seq, item.start, item.seq.token_ids[item.start]) for item in batch.decodes]
        entries += [(item.seq, item.start + 1 + j, t)
                    for item in batch.decodes for j, t in enumerate(item.draft)]
        for seq, pos, token in entries:
            ids.append(token)
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
        dev = self.device
        context_lens = [pos + 1 for _, pos, _ in entries]
        max_ctx = max(context_lens, default=0)
        width = max(1, (max_ctx + bs - 1) // bs)
        tables = [seq.block_table[:width] + [0] * (width - min(width, len(seq.block_table)))
                  for seq, _, _ in entries]
        prefills = []
        for item in batch.prefills:
            start, n = item.start, item.num_tokens
            end = start + n
            table = torch.tensor(item.seq.block_table[: (end + bs - 1) // bs], dtype=torch.long)
            pos = torch.arange(start, end)
            ids.extend(item.seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend((table[pos // bs] * bs + pos % bs).tolist())
            prefills.append(PrefillChunk(len(ids) - n, n, end, table.to(dev)))
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode=len(entries),
            decode_block_tables=torch.tensor(tables, dtype=torch.long, device=dev).view(len(tables), width),
            decode_context_lens=torch.tensor(context_lens, dtype=torch.long, device=dev),
            prefills=prefills,
            max_decode_context=max_ctx,
        )
        n = len(batch.decodes)
        if self.cascade != "off" and n > 1:
            key = tuple(item.seq.stint for item in batch.decodes)  # the rows' stints: a resumed row is new
            # planned over the rows' own entries only, as without proposals; proposals attend plain
            meta.cascade = with_plain_rows(self.planner.plan(key, tables[:n], context_lens[:n]),
                                           len(entries) - n)
            if meta.cascade is not None:
                self.cascade_group_sizes.update(len(g.rows) for g in meta.cascade.groups)
        return (torch.tensor(ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev),
                meta)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        input_ids, positions, meta = self.build_metadata(batch)
        forward = self.model.forward if self.compiled is None else self.compiled
        hidden = forward(input_ids, positions, meta, self.kv_cache)
        n_decode = len(batch.decodes)
        rows, sampling = [], []
        offset = meta.num_decode  # prefill rows follow every decode entry
        for i, item in enumerate(batch.decodes):
            if item.samples:
                rows.append(i)
                sampling.append(item)
        for item in batch.prefills:
            offset += item.num_tokens
            if item.samples:
                rows.append(offset - 1)
                sampling.append(item)
        # the proposals' entries: row n_decode + (proposals before this row's) + j is position start + 1 + j
        draft_rows: dict[str, int] = {}
        first = n_decode
        for item in batch.decodes:
            if item.draft:
                draft_rows[item.seq.request_id] = len(rows)
                rows.extend(range(first, first + len(item.draft)))
                first += len(item.draft)
        if self.keep_all_logits:
            self.last_logits = self.model.logits(hidden)
            logits = self.last_logits[rows]
        elif not rows:
            return StepResult({})
        else:  # every row sampled (a decode-only step): rows is 0..N-1, and indexing would copy for nothing
            logits = self.model.logits(hidden if rows == list(range(hidden.shape[0])) else hidden[rows])
        if not rows:
            return StepResult({})
        result = self._sample(logits[: len(sampling)], sampling)
        if draft_rows:
            verify(self.sampler, logits, batch.decodes, draft_rows, result)
        return result

    def _sample(self, logits: torch.Tensor, items: list[ScheduledSeq]) -> StepResult:
        seqs = [item.seq for item in items]
        out = self.sampler.sample(logits, [s.params for s in seqs], [s.request_id for s in seqs],
                                  seqs)
        ids = [s.request_id for s in seqs]
        result = StepResult({rid: t for rid, t in zip(ids, out.tokens, strict=True) if t is not None})
        result.logprobs = {rid: lp for rid, lp in zip(ids, out.logprobs, strict=True) if lp is not None}
        result.errors = {ids[row]: message for row, message in out.errors.items()}
        return result


def with_plain_rows(plan: CascadePlan | None, extra: int) -> CascadePlan | None:
    """The plan extended by `extra` decode rows that no group covers (the proposals' entries)."""
    if plan is None or not extra:
        return plan
    return dataclasses.replace(plan, suffix_start=plan.suffix_start + (0,) * extra)


def verify(sampler: Sampler, logits: torch.Tensor, decodes: list[ScheduledSeq], draft_rows: dict[str, int],
           result: StepResult) -> None:
    """Speculating rows' proposals, position by position: while a row's latest sampled token equals the
    proposal at the next position, the logits there (computed over that proposal) are sampled as the next
    step would sample them: the row's sampler state as if each token had been accepted alone (its outputs
    so far for the penalties, its grammar advanced by each, its seeded generator advanced once per token).
    Emits the matching proposals and the first sample that differs (or follows the last proposal): for
    greedy rows the tokens of plain decoding; for sampled rows each token is drawn from the target
    distribution given the ones before it, as one step would draw it. A row whose later sample fails (a
    processor, its probabilities) stops there, keeping what came before."""
    live = [item for item in decodes if item.draft and item.seq.request_id in result.tokens]
    emitted = {item.seq.request_id: [result.tokens[item.seq.request_id]] for item in live}
    lps: dict[str, list] = {item.seq.request_id: [] for item in live}
    j = 0
    while True:
        # rows whose latest token equals their j-th proposal: their logits at position start + 1 + j
        # (a row that stopped earlier has fewer tokens than j + 1: it never resumes)
        going = [item for item in live if j < len(item.draft) and len(emitted[item.seq.request_id]) == j + 1
                 and emitted[item.seq.request_id][-1] == item.draft[j]]
        if not going:
            break
        seqs = [item.seq for item in going]
        added = [emitted[s.request_id] for s in seqs]
        for s, e in zip(seqs, added, strict=True):  # the outputs so far, as the processors read them
            s.token_ids.extend(e)
        try:
            rows = [draft_rows[s.request_id] + j for s in seqs]
            out = sampler.sample(logits[rows], [s.params for s in seqs], [s.request_id for s in seqs], seqs)
        finally:
            for s, e in zip(seqs, added, strict=True):
                del s.token_ids[len(s.token_ids) - len(e):]
        for s, token, lp in zip(seqs, out.tokens, out.logprobs, strict=True):
            if token is None:  # failed at this position: keep what came before
                live = [item for item in live if item.seq is not s]
                continue
            emitted[s.request_id].append(token)
            if lp is not None:
                lps[s.request_id].append(lp)
        j += 1
    for rid, tokens in emitted.items():
        if len(tokens) > 1:
            result.more_tokens[rid] = tokens[1:]
            if lps[rid]:
                result.more_logprobs[rid] = lps[rid]
