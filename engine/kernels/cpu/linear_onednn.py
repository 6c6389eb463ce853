"""A bf16 linear through oneDNN with its weights packed once (csrc/linear_onednn.cpp): F.linear's arithmetic
and outputs, without F.linear's reorder of the weight into oneDNN's layout on every call (about 40% of a
decode step's linear time at 8-32 rows here). model/linear.py takes it for a bf16 layer's dense copy, which it
keeps only as oneDNN's packed copy (behind a key: `keyed`).

Loading goes through build.load, which never compiles: without a build the caller keeps F.linear."""

from __future__ import annotations

import torch

from kvloop.engine.core.cpu import cpu_capabilities
from kvloop.engine.kernels.cpu import build

KERNEL = "linear_onednn"


def available() -> bool:
    """Whether the built operator is loaded (loads it on first call; never compiles), torch has oneDNN and
    oneDNN has a bf16 path on this CPU (elsewhere its reorder refuses bf16 weights)."""
    return torch.backends.mkldnn.is_available() and cpu_capabilities().onednn_bf16 and build.load(KERNEL)


def register_fakes() -> None:
    """The operator's output shape for torch.compile's tracing; build.load calls this once
    the library is loaded."""
    torch.library.register_fake("kvloop_cpu::linear_onednn")(_linear_shape)


def _linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) for bf16 x and a contiguous bf16 weight that lives on (its packed copy is
    kept), or a key from `keyed` (its weight's packed copy)."""
    return torch.ops.kvloop_cpu.linear_onednn(x, weight, bias)


def keyed(weight: torch.Tensor) -> torch.Tensor:
    """A key standing in for a contiguous bf16 `weight` (its shape and dtype, a stride-0 view of one element):
    `linear` over the key multiplies by the weight's packed copy, made here, so the
    caller can drop the weight."""
    key = weight.new_zeros(1).expand(weight.shape)
    torch.ops.kvloop_cpu.linear_onednn_register(key, weight)
    return key


def is_key(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride() == (0, 0)


def packed_copies() -> int:
    """How many packed weights are held (for tests: a freed weight's copy is dropped)."""
    return torch.ops.kvloop_cpu.linear_onednn_packed()
