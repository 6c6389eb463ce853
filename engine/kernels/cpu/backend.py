"""The "cpu" attention backend: decode rows, cascade groups included, through the CPU paged decode kernel
(paged_decode.py); K/V writes and prefill from the torch backend, by composition (backend.WithDecode); a
decode-only step's layer in one operator call.

It runs where the kernel's build is there (compiled at install time); it never compiles on a request.
Registered in backend.py with

    register_backend("cpu", "kvloop.engine.kernels.cpu.backend:create",
                     available="kvloop.engine.kernels.cpu.backend:available",
                     requires="a CPU and the CPU kernel built (python -m kvloop.engine.kernels.cpu.build)")
"""

from __future__ import annotations

import torch

from kvloop.engine.kernels.backend import AttentionBackend, WithDecode, get_backend
from kvloop.engine.kernels.cpu import build


def available(device: torch.device | str) -> bool:
    """On a CPU whose kernel build is there (logs once why not, otherwise)."""
    return torch.device(device).type == "cpu" and build.load()


class CpuBackend(WithDecode):
    """A decode-only step's layer is one operator call (decode_layer: K/V write and paged decode); at batch 1
    the dozen torch calls it replaces cost more than the attention itself. Mixed steps compose as WithDecode."""

    def layer(self, index, q, k, v, kv_cache, meta, scale):
        if meta.prefills:
            return super().layer(index, q, k, v, kv_cache, meta, scale)
        decode = self._decode
        work = decode.work(meta, kv_cache.shape[3])
        return torch.ops.kvloop_cpu.decode_layer(q, k, v, kv_cache, index, meta.slot_mapping, work.blocks,
                                                 work.block_start, work.tokens, work.rows_ptr, work.rows,
                                                 float(scale), decode.split_tokens)


def create(device: torch.device | str) -> AttentionBackend:
    from kvloop.engine.kernels.cpu.paged_decode import CpuDecode

    if not build.load():
        raise ValueError(f"the CPU attention kernel is not available: {build.unavailable_reason()}")
    return CpuBackend("cpu", CpuDecode(), get_backend("torch", device))
