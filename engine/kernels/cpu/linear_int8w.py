"""Weight-only int8: the linear kernel (csrc/linear_int8w.cpp), computed the way llama.cpp's Q8_0 is.

Decode at small batch is bound by the bytes of weights a step reads; int8 weights are a quarter of fp32's.
Each output channel has one symmetric fp32 scale (`quantize`). The kernel quantizes each row of x to int8 in
blocks of 32 k's (symmetric, one fp32 scale per block: Q8_0's activations), takes each block's dot product
with the weights in exact int32 arithmetic, and sums the blocks in fp32 (one FMA each with the block's scale)
before the channel's scale and the bias. So "int8" quantizes activations too (relative error ~0.5% per output
on random data): an option, not the exact path. A row's result is the same in any batch and with any thread
count, and the portable path (`linear_scalar`) gives the AVX2 path's bits. K must be a multiple of 32
(`QK`): `pack` refuses others, and model/linear.py keeps such layers dense.

It reads weights packed by `pack`: [ceil(N/4), K/32, 4, 32] int8, 4 output channels per group, each block
of a group's 4 channels 128 contiguous bytes. `rows` dequantizes rows of the original [N, K] matrix from a
packed one, so a tied embedding is looked up from the head's weights (no second copy).

Loading goes through build.load, which never compiles: without a build the caller uses torch's int8 path."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.cpu import build

KERNEL = "linear_int8w"  # csrc/linear_int8w.cpp
QK = 32  # k's per activation block (one fp32 scale each); K must be a multiple
COLS = 4  # output channels per packed group


def available() -> bool:
    """Whether the built kernel is loaded (loads it on first call; never compiles)."""
    return build.load(KERNEL)


def register_fakes() -> None:
    """The operator's output shape for torch.compile's tracing, so a compiled step keeps the op in its graph;
    build.load calls this once the library is loaded."""
    torch.library.register_fake("kvloop_cpu::linear_int8w")(_linear_shape)


def _linear_shape(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, n: int,
                  bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], n))


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] weight of any float dtype → (int8 [N, K], fp32 scale [N]): symmetric per output channel,
    q = round(w / scale) in [-127, 127] with scale = max |w| / 127."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] (K a multiple of QK) → [ceil(N/4), K/32, 4, 32] int8, zero-padded to whole groups."""
    n, k = q.shape
    if k % QK:
        raise ValueError(f"the int8 kernel needs K a multiple of {QK}, not {k}")
    groups = -(-n // COLS)
    padded = torch.zeros(groups * COLS, k, dtype=torch.int8)
    padded[:n] = q
    return padded.view(groups, COLS, k // QK, QK).transpose(1, 2).contiguous()


def rows(packed: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the [N, K] matrix that `pack` packed, dequantized to fp32 [len(ids), K] (an embedding
    lookup)."""
    return packed[ids // COLS, :, ids % COLS].reshape(len(ids), -1).float() * scale[ids, None]


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, n: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 @ (Q[N, K] * scale[N, None])^T + bias → [M, N] float32, x quantized per 32 k's:
    each output sum_b xscale_b * (int32 dot of block b) in a fixed order, times its scale, plus its bias, so
    a row's result is the same in any batch and with any thread count."""
    return torch.ops.kvloop_cpu.linear_int8w(x, packed, scale, n, bias)


def linear_scalar(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, n: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` through the kernel's portable path, whatever the build targets (the tests: the same bits)."""
    return torch.ops.kvloop_cpu.linear_int8w_scalar(x, packed, scale, n, bias)
