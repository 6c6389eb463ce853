"""model/zeroed.py: a large host tensor from an anonymous memory map reads exactly as torch.zeros' does."""

from __future__ import annotations

import gc

import torch

from kvloop.engine.model.zeroed import zeros


def test_large_zeros_are_zero_writable_and_aligned():
    shape = (4, 2, 64, 16, 2, 64)  # 2 MiB of bf16: over the threshold
    t = zeros(shape, torch.bfloat16, torch.device("cpu"))
    gc.collect()  # the tensor alone keeps its memory alive
    assert t.shape == shape and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % 64 == 0
    assert torch.equal(t, torch.zeros(shape, dtype=torch.bfloat16))
    t[1, 0, 3].fill_(2.5)
    assert t.float().sum().item() == 2.5 * 16 * 2 * 64
    assert torch.equal(t[2], torch.zeros(shape[1:], dtype=torch.bfloat16))


def test_small_zeros_are_torch_zeros():
    t = zeros((3, 5), torch.float32, torch.device("cpu"))
    assert torch.equal(t, torch.zeros(3, 5))
