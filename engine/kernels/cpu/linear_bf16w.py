"""bf16 weights, fp32 arithmetic: the linear kernel (csrc/linear_bf16w.cpp) for CPUs without native bf16, and
for decode-sized steps of a bf16 model on CPUs with it.

Decode at small batch is bound by the bytes of weights a step reads. Stored as bf16 they are half of fp32's,
and widening bf16 to fp32 is exact, so the products and sums stay fp32 (no emulated bf16 arithmetic). The
kernel reads weights packed by `pack`: [ceil(N/16), K, 16], 16 output columns per block, each k's 16 values
one 32-byte load, in the slot order the kernel's unpacking expects. `rows` reads rows of the original [N, K]
matrix back out of a packed one, so a tied embedding is looked up from the head's weights (no second copy).

On a CPU with native bf16 torch's bf16 GEMM (oneDNN) is the fast choice for prefill-sized steps, but not for
the few rows of a decode step. Measured on an AMD EPYC with AVX512-BF16 (2 threads, the embedded model's
linears, one pass, bf16 activations widened and rounded back): 3.6 against 9.8 ms at 1 row, 7.5 against 11.3
at 4, even at 8, 1.1x torch's time at 12 and 1.3x at 16 (1.4-1.8x at 512); whole engine steps at 12 rows
(1,300-token contexts) were no slower with the kernel, within this VM's noise. So a bf16 model's layer
(model/linear.py) takes the kernel up to `DENSE_ABOVE_ROWS` rows and torch's GEMM over a dense copy of the same
weights above; a compiled step holds a graph for each (runner/compiled_step.py), so that inductor prepacks the
GEMM for oneDNN (an earlier single operator that called the GEMM inside made steps of 8 rows and more slower
than oneDNN alone: nothing prepacks a GEMM called from our operator).

Loading goes through build.load, which never compiles: without a build the caller keeps dense weights."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.cpu import build

KERNEL = "linear_bf16w"  # csrc/linear_bf16w.cpp
BLOCK = 16
# Column c of a block is stored at slot SLOT_OF_COL[c]: the kernel widens a 16-value load with per-128-bit-lane
# interleaves, which take slots 0-3 and 8-11 into one register and 4-7 and 12-15 into the other.
SLOT_OF_COL = (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)
_SLOTS = torch.tensor(SLOT_OF_COL)
DENSE_ABOVE_ROWS = 12  # a bf16 model's steps with more rows take torch's GEMM (crossover 8-12 rows, above)


def available() -> bool:
    """Whether the built kernel is loaded (loads it on first call; never compiles)."""
    return build.load(KERNEL)


def register_fakes() -> None:
    """The operator's output shape for torch.compile's tracing, so a compiled step keeps the op in its graph;
    build.load calls this once the library is loaded."""
    torch.library.register_fake("kvloop_cpu::linear_bf16w")(_linear_shape)


def _linear_shape(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], n))


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
