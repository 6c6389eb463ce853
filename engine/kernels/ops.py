"""One interface for the runner: CUDA tensors go to the Triton kernels, CPU tensors to the torch path.
`backend="triton"` forces Triton (used under TRITON_INTERPRET=1 to check the kernels on the CPU)."""

from __future__ import annotations

import torch
from kvloop.engine.kernels import torch_attention
from kvloop.engine.runner.attention_meta import AttentionMetadata

BACKENDS = ("auto", "torch", "triton")


def use_triton(backend: str, device: torch.device) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from {BACKENDS}")
    return backend == "triton" or (backend == "auto" and device.type == "cuda")


def write_kv(k, v, k_cache, v_cache, meta: AttentionMetadata, backend: str) -> None:
    if use_triton(backend, k.device):
        from kvloop.engine.kernels import triton as tk

        tk.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    else:
        torch_attention.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)


def paged_attention(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, backend: str) -> torch.Tensor:
    if not use_triton(backend, q.device):
        return torch_attention.paged_attention(q, k_cache, v_cache, meta, scale)
    from kvloop.engine.kernels import triton as tk

    packed = meta.packed()
    if meta.cascade is not None and meta.cascade.groups and meta.num_decode:
        return _cascade_step(tk, q, k_cache, v_cache, meta, packed, scale)
    if not meta.prefills:
        return tk.paged_decode_attention(q, k_cache, v_cache, packed["decode_block_tables"],
                                         packed["decode_context_lens"], scale)
    # Mixed or prefill-only steps: the extend kernel covers decode rows too (a decode is a 1-token extend).
    return tk.paged_extend_attention(q, k_cache, v_cache, packed["block_tables"], packed["query_start_loc"],
                                     packed["seq_lens"], scale)


def _cascade_step(tk, q, k_cache, v_cache, meta: AttentionMetadata, packed: dict, scale: float) -> torch.Tensor:
    """Decode rows through the cascade kernels (the plan packed once per step, reused by every layer);
    a mixed step's prefill rows through the extend kernel."""
    n = meta.num_decode
    if "cascade" not in packed:
        packed["cascade"] = tk.pack_for(tk.segments_from_groups(meta.cascade.groups), q[:n], k_cache)
    out = tk.cascade_decode_attention(q[:n], k_cache, v_cache, packed["decode_block_tables"],
                                      packed["decode_context_lens"], scale, packed["cascade"])
    if not meta.prefills:
        return out
    if "prefill_query_start_loc" not in packed:
        packed["prefill_query_start_loc"] = packed["query_start_loc"][n:] - n
    rest = tk.paged_extend_attention(q[n:], k_cache, v_cache, packed["block_tables"][n:],
                                     packed["prefill_query_start_loc"], packed["seq_lens"][n:], scale)
    return torch.cat([out, rest])
