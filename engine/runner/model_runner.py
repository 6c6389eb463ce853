"""Runs one scheduled batch through the model: builds the flattened inputs and attention metadata,
runs the forward pass, computes logits only where a token is sampled, and samples."""

from __future__ import annotations

from collections import Counter

import torch

from kvloop.engine.cascade.cost import cost_for
from kvloop.engine.cascade.plan import CascadePlanner
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
        for item in batch.decodes:
            pos = item.start
            ids.append(item.seq.token_ids[pos])
            positions.append(pos)
            slots.append(item.seq.block_table[pos // bs] * bs + pos % bs)
        dev = self.device
        context_lens = [item.start + 1 for item in batch.decodes]
        max_ctx = max(context_lens, default=0)
        width = max(1, (max_ctx + bs - 1) // bs)
        tables = [item.seq.block_table[:width] + [0] * (width - min(width, len(item.seq.block_table)))
                  for item in batch.decodes]
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
            num_decode=len(batch.decodes),
            decode_block_tables=torch.tensor(tables, dtype=torch.long, device=dev).view(len(tables), width),
            decode_context_lens=torch.tensor(context_lens, dtype=torch.long, device=dev),
            prefills=prefills,
            max_decode_context=max_ctx,
        )
        if self.cascade != "off" and len(batch.decodes) > 1:
            key = tuple(item.seq.stint for item in batch.decodes)  # the rows' stints: a resumed row is new
            meta.cascade = self.planner.plan(key, tables, context_lens)
            if meta.cascade is not None:
                self.cascade_group_sizes.update(len(g.rows) for g in meta.cascade.groups)
        return (torch.tensor(ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev),
                meta)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        input_ids, positions, meta = self.build_metadata(batch)
        forward = self.model.forward if self.compiled is None else self.compiled
        hidden = forward(input_ids, positions, meta, self.kv_cache)
        rows, sampling = [], []
        offset = 0
        for item in batch.decodes + batch.prefills:
            offset += item.num_tokens
            if item.samples:
                rows.append(offset - 1)
                sampling.append(item)
        if self.keep_all_logits:
            self.last_logits = self.model.logits(hidden)
            logits = self.last_logits[rows]
        elif not rows:
            return StepResult({})
        else:  # every row sampled (a decode-only step): rows is 0..N-1, and indexing would copy for nothing
            logits = self.model.logits(hidden if len(rows) == hidden.shape[0] else hidden[rows])
        if not rows:
            return StepResult({})
        return self._sample(logits, sampling)

    def _sample(self, logits: torch.Tensor, items: list[ScheduledSeq]) -> StepResult:
        seqs = [item.seq for item in items]
        out = self.sampler.sample(logits, [s.params for s in seqs], [s.request_id for s in seqs],
                                  seqs)
        ids = [s.request_id for s in seqs]
        result = StepResult({rid: t for rid, t in zip(ids, out.tokens, strict=True) if t is not None})
        result.logprobs = {rid: lp for rid, lp in zip(ids, out.logprobs, strict=True) if lp is not None}
        result.errors = {ids[row]: message for row, message in out.errors.items()}
        return result
