"""The Triton attention backend (the default on CUDA; on CPU tensors only under TRITON_INTERPRET=1, where
the kernels are checked). The kernels take the metadata in packed int32 form, built once per step by
AttentionMetadata.packed() and reused by every layer. Importing this module does not import triton."""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata
from kvloop.engine.kernels.backend import AttentionBackend


def runnable(device: torch.device) -> bool:
    """Triton runs on CUDA tensors, and on CPU tensors when this process's kernels are interpreted."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return True
    if device.type != "cpu" or ("triton" not in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"):
        return False  # known without importing triton: it will not be interpreted
    from kvloop.engine.kernels import triton as tk

    return tk.is_interpreted()


class TritonBackend(AttentionBackend):
    name = "triton"

    def __init__(self, device: torch.device | None = None):
        from kvloop.engine.kernels import triton as tk

        self.tk = tk

    def write_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        self.tk.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if meta.prefills and not _cascades(meta):
            # One launch for the whole step: a decode row is a one-token extend.
            packed = meta.packed()
            return self.tk.paged_extend_attention(q, k_cache, v_cache, packed["block_tables"],
                                                  packed["query_start_loc"], packed["seq_lens"], scale)
        return super().forward(q, k_cache, v_cache, meta, scale)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        packed = meta.packed()
        tables, lens = packed["decode_block_tables"], packed["decode_context_lens"]
        if not _cascades(meta):
            return self.tk.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
        if "cascade" not in packed:  # the plan packed once per step, reused by every layer
            packed["cascade"] = self.tk.pack_for(self.tk.segments_from_groups(meta.cascade.groups), q,
                                                 k_cache)
        return self.tk.cascade_decode_attention(q, k_cache, v_cache, tables, lens, scale, packed["cascade"])

    def extend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        packed = meta.packed()
        n = meta.num_decode
        if "prefill_query_start_loc" not in packed:
            packed["prefill_query_start_loc"] = packed["query_start_loc"][n:] - n
        return self.tk.paged_extend_attention(q, k_cache, v_cache, packed["block_tables"][n:],
                                              packed["prefill_query_start_loc"], packed["seq_lens"][n:],
                                              scale)


def _cascades(meta: AttentionMetadata) -> bool:
    return meta.cascade is not None and bool(meta.cascade.groups) and meta.num_decode > 0
