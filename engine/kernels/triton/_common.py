"""Shared helpers: interpreter detection, dot dtypes, the device check and a launch counter for tests."""

from __future__ import annotations

import collections
import functools

import torch
import triton
import triton.language as tl

# Incremented by every Triton launch, so tests can prove the Triton path (not the torch one) ran.
LAUNCHES: collections.Counter[str] = collections.Counter()

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@functools.cache  # fixed for the process: triton reads TRITON_INTERPRET when the kernels are decorated
def is_interpreted() -> bool:
    """True when this process's @triton.jit functions are InterpretedFunctions (TRITON_INTERPRET=1
    was set before triton was first imported)."""
    from triton.runtime.interpreter import InterpretedFunction

    from .decode import decode_split_kernel

    return isinstance(decode_split_kernel, InterpretedFunction)


def check_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    if dtype not in _TL_DTYPES:
        raise TypeError(f"unsupported dtype {dtype}; expected float32, float16 or bfloat16")
    for t in tensors[1:]:
        if t.dtype != dtype:
            raise TypeError(f"dtype mismatch: {t.dtype} vs {dtype}")
    return dtype


def check_attention_dtypes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.dtype:
    """The compute dtype of an attention kernel: the caches'. Queries (and outputs) may differ, e.g. an fp32
    model over a 16-bit KV cache: they are converted on load and on store."""
    check_dtype(q)
    return check_dtype(k_cache, v_cache)


def dot_config(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """Operand dtype and precision for tl.dot. The interpreter gets bf16 arithmetic wrong, so there
    everything is computed in fp32; on the GPU 16-bit operands feed the tensor cores natively and fp32
    caches use exact ("ieee") products rather than TF32, so fp32 stays a true reference dtype."""
    if dtype == torch.float32 or is_interpreted():
        return tl.float32, "ieee"
    return _TL_DTYPES[dtype], "tf32"


def require_triton(device: torch.device) -> None:
    """Triton runs on CUDA tensors, and on CPU tensors only when the kernels are interpreted; anything else
    is an error (and the backend registry, engine/kernels/backend.py, refuses "triton"
    where it cannot run)."""
    if device.type != "cuda" and not (device.type == "cpu" and is_interpreted()):
        raise RuntimeError(f"Triton kernels cannot run on {device} tensors: CPU tensors need "
                           "TRITON_INTERPRET=1 set before triton's first import")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors, to size split-K; a small fixed number off-GPU keeps the interpreter fast."""
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
