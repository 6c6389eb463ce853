"""bf16 weights, fp32 sums: the linear kernel (csrc/linear_bf16w.cpp) for CPUs without native bf16 (fp32
activations, `linear`), and for bf16 models on CPUs with it (bf16 activations, `linear_bf16`).

Decode at small batch is bound by the bytes of weights a step reads. Stored as bf16 they are half of fp32's,
and widening bf16 to fp32 is exact, so `linear`'s products and sums stay fp32 (no emulated bf16 arithmetic).
`linear_bf16`, built for AVX512-BF16 (`native`), multiplies pairs of bf16 into fp32 sums with one instruction
per 16 pairs (csrc/linear_dpbf16.h), faster than oneDNN's bf16 GEMM at every row count, so a bf16 model keeps
no dense copy of its weights. Built without AVX512-BF16 it widens x and runs `linear`'s fp32 tiles, faster
than oneDNN only up to `DENSE_ABOVE_ROWS` rows; a bf16 model then keeps a dense copy for larger steps
(model/linear.py, runner/compiled_step.py). So does one on a CPU with AMX tiles, where oneDNN's bf16 GEMM
beats the pairs past AMX_DENSE_ABOVE_ROWS rows; there the kernel multiplies in the tiles itself (`tiles`,
csrc/linear_amx.h) and oneDNN takes only the steps past TILES_DENSE_ABOVE_ROWS rows (`dense_above_rows`).
The measurements behind these bounds: docs/engine_history.md.

The kernel reads weights packed by `pack`: [ceil(N/16), K, 16], 16 output columns per block, each k's 16
values one 32-byte load, in the slot order the kernel's unpacking expects. `rows` reads rows of the original
[N, K] matrix back out of a packed one, so a tied embedding is looked up from the head's
weights (no second copy).

Loading goes through build.load, which never compiles: without a build the caller keeps dense weights."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.cpu import amx, build

KERNEL = "linear_bf16w"  # csrc/linear_bf16w.cpp
BLOCK = 16
# Column c of a block is stored at slot SLOT_OF_COL[c]: the kernel widens a 16-value load with
# per-128-bit-lane interleaves, which take slots 0-3 and 8-11 into one register and 4-7
# and 12-15 into the other.
SLOT_OF_COL = (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)
_SLOTS = torch.tensor(SLOT_OF_COL)
# without bf16 pairs, a bf16 model's larger steps take torch's GEMM (crossover 8-12 rows)
DENSE_ABOVE_ROWS = 12
# With AMX tiles oneDNN's bf16 GEMM outruns the bf16 pairs past this many rows (docs/engine_history.md).
AMX_DENSE_ABOVE_ROWS = 6
# The kernel's own AMX tile path (csrc/linear_amx.h) keeps up with oneDNN's GEMM up to this many rows, which
# then serves only the larger steps (prefill chunks; docs/engine_history.md).
TILES_DENSE_ABOVE_ROWS = 64


def available() -> bool:
    """Whether the built kernel is loaded (loads it on first call; never compiles)."""
    return build.load(KERNEL)


def on_load() -> None:
    """build.load's hook once the library is loaded: the operators' fakes, and the tile path switched on where
    this process holds AMX's tile state (amx.available asks the OS for it)."""
    register_fakes()
    set_tiles(amx.available())


def set_tiles(on: bool) -> bool:
    """Whether linear_bf16 multiplies in AMX tiles (csrc/linear_amx.h); returns the setting, which stays off
    where the kernel was built without them. Process-wide: the tests switch it to compare both paths."""
    return bool(torch.ops.kvloop_cpu.linear_bf16w_set_tiles(on))


def tiles() -> bool:
    """Whether the loaded kernel multiplies bf16 activations in AMX tiles (the operator's own setting)."""
    return available() and bool(torch.ops.kvloop_cpu.linear_bf16w_tiles())


def register_fakes() -> None:
    """The operator's output shape for torch.compile's tracing, so a compiled step keeps the op in its graph;
    build.load calls this once the library is loaded."""
    torch.library.register_fake("kvloop_cpu::linear_bf16w")(_linear_shape)
    torch.library.register_fake("kvloop_cpu::linear_bf16w_bf16")(_linear_shape)


def _linear_shape(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], n))  # in x's dtype: float32 for linear, bfloat16 for linear_bf16


def native() -> bool:
    """Whether `linear_bf16` multiplies bf16 pairs natively (the kernel built for AVX512-BF16)."""
    return available() and torch.ops.kvloop_cpu.linear_bf16w_native()


def dense_above_rows() -> int | None:
    """Steps of more rows than this take oneDNN's bf16 GEMM over a dense copy of a bf16 model's weights (the
    kernel serves the smaller ones); None: the kernel serves every step and no dense copy is kept. Without
    bf16 pairs the kernel multiplies in fp32 and oneDNN wins past DENSE_ABOVE_ROWS rows; with them it beats
    oneDNN at every row count on an AVX512-BF16 CPU without AMX, and loses past AMX_DENSE_ABOVE_ROWS rows to
    oneDNN's AMX tiles (docs/engine_history.md)."""
    if not native():
        return DENSE_ABOVE_ROWS
    if not amx.available():
        return None
    return TILES_DENSE_ABOVE_ROWS if tiles() else AMX_DENSE_ABOVE_ROWS


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] weight of any float dtype → [ceil(N/16), K, 16] bf16 (rounded to nearest even), zero-padded."""
    n, k = weight.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k, dtype=torch.bfloat16)
    padded[:n] = weight.to(torch.bfloat16)
    packed = torch.empty(blocks, k, BLOCK, dtype=torch.bfloat16)
    packed[:, :, _SLOTS] = padded.view(blocks, BLOCK, k).transpose(1, 2)
    return packed


def rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the [N, K] matrix that `pack` packed, as [len(ids), K] bf16 (an embedding lookup)."""
    return packed[ids // BLOCK, :, _SLOTS[ids % BLOCK]]


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 @ W[N, K]^T + bias → [M, N] float32; each output one fp32 FMA chain over k in order,
    so a row's result is the same in any batch and with any thread count."""
    return torch.ops.kvloop_cpu.linear_bf16w(x, packed, n, bias)


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, n: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] bfloat16 @ W[N, K]^T + bias (fp32) → [M, N] bfloat16, rounded once from the fp32 result; each
    output one fp32 chain over k in order (k pairs with AVX512-BF16), so a row's result is
    the same in any batch."""
    return torch.ops.kvloop_cpu.linear_bf16w_bf16(x, packed, n, bias)
