"""Attention metadata for one flattened step, built in one place (ModelRunner.build_metadata).

The step's tokens are laid out decode tokens first (one per decoding sequence), then each prefill
chunk in turn. Every attention backend (backend.py) reads what it needs from this one object."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvloop.engine.cascade.plan import CascadePlan


@dataclass
class PrefillChunk:
    q_start: int  # first row of this chunk in the flattened batch
    q_len: int  # new tokens in this step
    seq_len: int  # total tokens after this step (cached prefix + earlier chunks + this chunk)
    block_table: torch.Tensor  # int64 [ceil(seq_len / block_size)]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [N]: where each new token's K/V goes
    num_decode: int
    decode_block_tables: torch.Tensor  # int64 [num_decode, max_blocks]
    decode_context_lens: torch.Tensor  # int64 [num_decode]: tokens to attend to, the new one included
    prefills: list[PrefillChunk] = field(default_factory=list)
    max_decode_context: int = 0
    # Decode rows that attend to shared prefixes once, as groups (None: every row reads its whole context).
    cascade: CascadePlan | None = None
    _packed: dict | None = None
    _decode_work: object = None  # the torch path's per-step work list, built once and reused by every layer

    def packed(self) -> dict:
        """The same information in the packed int32 form the Triton kernels take (built once, lazily)."""
        if self._packed is None:
            device = self.slot_mapping.device
            lens = [int(x) for x in self.decode_context_lens.tolist()] + [p.seq_len for p in self.prefills]
            q_lens = [1] * self.num_decode + [p.q_len for p in self.prefills]
            tables = [row for row in self.decode_block_tables] + [p.block_table for p in self.prefills]
            width = max((len(t) for t in tables), default=1)
            bt = torch.zeros(len(tables), max(width, 1), dtype=torch.int32, device=device)
            for i, t in enumerate(tables):
                bt[i, : len(t)] = t.to(torch.int32)
            starts = [0]
            for q in q_lens:
                starts.append(starts[-1] + q)
            self._packed = {
                "block_tables": bt,
                "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
                "query_start_loc": torch.tensor(starts, dtype=torch.int32, device=device),
                "decode_block_tables": bt[: self.num_decode],
                "decode_context_lens": torch.tensor(lens[: self.num_decode], dtype=torch.int32,
                                                    device=device),
            }
        return self._packed
