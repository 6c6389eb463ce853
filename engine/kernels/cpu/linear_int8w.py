"""Weight-only int8, fp32 arithmetic: the linear kernel (csrc/linear_int8w.cpp), llama.cpp's Q8_0 counterpart.

Decode at small batch is bound by the bytes of weights a step reads; int8 weights are a quarter of fp32's.
Each output channel has one symmetric fp32 scale (`quantize`). The kernel widens int8 to fp32 (exact), sums
x_k * q_k as one fp32 FMA chain and multiplies by the scale once, so the arithmetic is fp32 throughout and a
row's result is the same in any batch. It reads weights packed by `pack`: [ceil(N/16), K, 16] int8, 16 output
columns per block, each k's 16 values contiguous. `rows` dequantizes rows of the original [N, K] matrix from a
packed one, so a tied embedding is looked up from the head's weights (no second copy).

Loading goes through build.load, which never compiles: without a build the caller uses torch's int8 path."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.cpu import build

KERNEL = "linear_int8w"  # csrc/linear_int8w.cpp
BLOCK = 16


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
    """int8 [N, K] → [ceil(N/16), K, 16] int8, zero-padded to whole blocks."""
    n, k = q.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k, dtype=torch.int8)
    padded[:n] = q
    return padded.view(blocks, BLOCK, k).transpose(1, 2).contiguous()


def rows(packed: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the [N, K] matrix that `pack` packed, dequantized to fp32 [len(ids), K] (an embedding
    lookup)."""
    return packed[ids // BLOCK, :, ids % BLOCK].float() * scale[ids, None]


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, n: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 @ (Q[N, K] * scale[N, None])^T + bias → [M, N] float32; each output one fp32 FMA chain
    over k in order, times its scale, plus its bias, so a row's result is the same in any batch and with any
    thread count."""
    return torch.ops.kvloop_cpu.linear_int8w(x, packed, scale, n, bias)
