"""Large zero-filled host tensors without writing the zeros.

torch.zeros writes every byte: ~1 s of a start-up for a 1.5 GB KV pool on 2 shared cores. An anonymous
private memory map is zero by the OS's guarantee, page by page as it is first touched, so the pool costs
nothing until its blocks are used, and what it holds is exactly torch.zeros' (no stale data, ever)."""

from __future__ import annotations

import math
import mmap

import torch

_MIN_BYTES = 1 << 20  # below this torch.zeros is as quick, and keeps small tensors in torch's allocator


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < _MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page-aligned
    # the tensor keeps the map alive (frombuffer holds a reference to it)
    return torch.frombuffer(pages, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)
