"""The "cpu" attention backend: decode rows, cascade groups included, through the CPU paged decode kernel
(paged_decode.py); K/V writes from the torch backend, by composition (backend.WithDecode), and prefill too,
except over bf16 K/V where the kernel has its blocked bf16 path (AVX512-BF16) and the CPU no AMX tiles: there
a step's prefill chunks are the kernel's causal segments, read in place (CpuBackend.extend). A decode-only
step's layer is one operator call. Under the compiled step, that call is made from C++: bind's LayerFn carries
`native_step`, (bind, unbind) of the step's arguments in the kernel's library, whose CPU kernel for
kvloop_step::attention then runs decode_layer without calling back into Python (and calls the operator's
Python kernel, as without this backend, when no step is bound: prefill and mixed steps).

It runs where the kernel's build is there (compiled at install time); it never compiles on a request.
Registered in backend.py with

    register_backend("cpu", "kvloop.engine.kernels.cpu.backend:create",
                     available="kvloop.engine.kernels.cpu.backend:available",
                     requires="a CPU and the CPU kernel built (python -m kvloop.engine.kernels.cpu.build)")
"""

from __future__ import annotations

from functools import cache, partial

import torch

from kvloop.engine.cascade.cost import AMX_TILES, BLOCKED_BF16
from kvloop.engine.kernels.backend import AttentionBackend, WithDecode, get_backend
from kvloop.engine.kernels.cpu import amx, build


@cache
def _tiles_shape(head_dim: int, block_size: int) -> bool:
    """Whether the tile routine takes this head_dim and block size at the kernel's split
    (asked once per shape)."""
    from kvloop.engine.kernels.cpu.paged_decode import SPLIT_TOKENS

    return bool(torch.ops.kvloop_cpu.stacked_tiles_shape(head_dim, block_size, SPLIT_TOKENS))


def available(device: torch.device | str) -> bool:
    """On a CPU whose kernel build is there (logs once why not, otherwise)."""
    return torch.device(device).type == "cpu" and build.load()


class CpuBackend(WithDecode):
    """A decode-only step's layer is one operator call (decode_layer: K/V write and paged decode); at batch 1
    the dozen torch calls it replaces cost more than the attention itself. Mixed steps
    compose as WithDecode."""

    def __init__(self, name, decode, base, prefill=None, blocked_bf16: bool = False, tiles: bool = False):
        super().__init__(name, decode, base)
        self._prefill = prefill  # the kernel's prefill (CpuPrefill), or None: the base backend's SDPA
        self._blocked_bf16 = blocked_bf16  # the blocked bf16 routine is built: bf16 K/V decode through it
        # AMX tiles: a group's stacked rows and prefill chunks over bf16 K/V through their routine
        self._tiles = tiles

    def cost_name(self, head_dim: int, query_dtype: torch.dtype, block_size: int) -> str:
        """Each decode path with its own measured trade-off for bf16 K/V: "cpu/amx" where the blocked bf16
        routine is built and a group's stacked rows take the AMX tile routine (bf16 queries, its shapes),
        "cpu/avx512bf16" where plain rows take the blocked routine but stacked ones not
        the tiles, else "cpu"."""
        if not self._blocked_bf16:
            return self.name
        path = AMX_TILES if self._tiles_take(head_dim, query_dtype, block_size) else BLOCKED_BF16
        return f"{self.name}/{path}"

    def _tiles_take(self, head_dim: int, query_dtype: torch.dtype, block_size: int) -> bool:
        """Whether the AMX tile routine takes stacked rows (and causal chunks) of this head_dim and query
        dtype over bf16 K/V in blocks of this size (the kernel's own rule: csrc/tile_amx.h,
        stacked_tiles_shape)."""
        return self._tiles and query_dtype == torch.bfloat16 and _tiles_shape(head_dim, block_size)

    def extend(self, q, k_cache, v_cache, meta, scale):
        """Over bf16 K/V with the kernel's blocked bf16 path, the chunks' attention is one kernel call reading
        the cache in place, its probabilities rounded to bf16 for the value product as SDPA's bf16 path rounds
        them: faster than SDPA with its gather. With AMX tiles, only where the tile routine takes the chunks'
        runs of rows (bf16 queries, head_dim 64); elsewhere there SDPA's bf16 path is the faster one. The
        kernel's AVX2 routine scores one query at a time (not measured against SDPA). The numbers:
        docs/engine_history.md."""
        if (self._prefill is not None and k_cache.dtype == torch.bfloat16
                and (not self._tiles or self._tiles_take(q.shape[-1], q.dtype, k_cache.shape[1]))):
            return self._prefill(q, k_cache, v_cache, meta, scale)
        return super().extend(q, k_cache, v_cache, meta, scale)

    def layer(self, index, q, k, v, kv_cache, meta, scale):
        if meta.prefills:
            return super().layer(index, q, k, v, kv_cache, meta, scale)
        return self.bind(kv_cache, meta, scale)(index, q, k, v)

    def bind(self, kv_cache, meta, scale):
        """A decode-only step's layers call the operator directly, with the step's work list and arguments
        made once. Between memory-bound linears (caches cold) each Python call per layer costs far more than
        in a warm loop (docs/engine_history.md, per-step overhead)."""
        if meta.prefills:
            return super().bind(kv_cache, meta, scale)
        work = self._decode.work(meta, kv_cache.shape[3])
        step = (meta.slot_mapping, work.blocks, work.block_start, work.tokens, work.rows_ptr, work.rows,
                float(scale),
                self._decode.split_tokens)
        op = torch.ops.kvloop_cpu.decode_layer.default  # the overload itself: no overload resolution per call

        def attend(index, q, k, v):
            return op(q, k, v, kv_cache, index, *step)

        # For the compiled step: while bound, kvloop_step::attention's CPU kernel runs decode_layer with these
        # arguments itself, without calling back into Python per layer
        # (CompiledStep.__call__ binds and unbinds).
        attend.native_step = (partial(torch.ops.kvloop_cpu.bind_decode_step.default, kv_cache, *step),
                              torch.ops.kvloop_cpu.unbind_decode_step.default)
        return attend


def create(device: torch.device | str) -> AttentionBackend:
    from kvloop.engine.kernels.cpu.paged_decode import CpuDecode, CpuPrefill

    if not build.load():
        raise ValueError(f"the CPU attention kernel is not available: {build.unavailable_reason()}")
    blocked = build.blocked_bf16()  # decided once, not per layer
    # With AMX tiles, a cascade group's shared prefix and a prefill chunk's rows (bf16) go through the
    # kernel's tile routine (head_dim 64: csrc/tile_amx.h), or where that does not apply, a large group's
    # prefix through ATen's flash attention, whose oneDNN GEMMs outrun the kernel's dot
    # products there (measured:
    # docs/engine_history.md). The tiles stay off where the OS refuses this process their state.
    amx_tiles = amx.available()
    tiles = torch.ops.kvloop_cpu.set_stacked_tiles(amx_tiles)
    torch.ops.kvloop_cpu.set_stacked_flash(amx_tiles)
    prefill = CpuPrefill() if blocked else None
    return CpuBackend("cpu", CpuDecode(), get_backend("torch", device), prefill, blocked, tiles)
