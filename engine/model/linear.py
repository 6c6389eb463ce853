"""Linear layers in one of four weight formats.

- "none": dense weights in the model dtype (the exact path).
- "bf16": weights rounded to bf16 (half of fp32's bytes) through the CPU kernel kernels/cpu/linear_bf16w, sums
  in fp32. Under a float32 model (a CPU without native bf16, where torch's bf16 matmul is emulated) the kernel
  widens the weights and outruns torch's fp32 GEMM at every batch size, so it serves all steps and no dense
  copy is kept. Under a bf16 model (a CPU with native bf16) built with AVX512-BF16, the kernel multiplies bf16
  pairs in hardware and again serves every step with no dense copy (it outruns oneDNN's bf16 GEMM there). On
  a CPU with AMX tiles oneDNN's bf16 GEMM multiplies in them and beats the pairs past a few rows; the kernel
  then multiplies in AMX tiles itself (kernels/cpu/csrc/linear_amx.h: the weights read at about the memory's
  pace) and oneDNN serves only the steps past linear_bf16w.TILES_DENSE_ABOVE_ROWS rows; and a kernel built
  without AVX512-BF16 (an old compiler) multiplies in fp32, faster than oneDNN only for decode-sized steps
  (the numbers: docs/engine_history.md, weight formats): in both cases the layer keeps a dense bf16 copy
  (twice the weights' memory) for the steps past linear_bf16w.dense_above_rows() rows, through oneDNN with the
  copy packed once and kept only in that packed form, `weight` then being a key for it
  (kernels/cpu/linear_onednn; a plain dense copy through F.linear where that is not built), and the compiled
  step holds two graphs, one per branch (runner/compiled_step.py; `dense_graph` says which one is being
  traced). Eager steps branch on their rows.
  Without a built kernel (or off the CPU) the layer falls back to "none".
- "int4": 4-bit, group-32, asymmetric (min/max) weights through torch's `_weight_int4pack_mm_for_cpu`.
  For weights that came from a Q4_0/Q4_1 GGUF this re-encodes the file's own 4-bit values; only the
  per-group scale and offset are rounded to bf16.
- "int8": per-output-channel symmetric int8 (fp32 scales) through the CPU kernel kernels/cpu/linear_int8w
  (activations quantized per 32 k's as llama.cpp's Q8_0 does, int32 dot products; K a multiple of 32) at
  every row count, keeping no dense copy: faster than torch's fp32 F.linear at decode sizes and about on par
  at prefill sizes (docs/engine_history.md), so prefill does not need a dense copy. Without a
  built kernel (or off the CPU): torch's `_weight_int8pack_mm` (bf16 activations, bf16 scales) for steps of
  up to `quant_max_rows` rows, dense weights above.

For "int4" (and "int8" without its kernel) on this CPU (no native bf16) torch's quantized kernels stream
weights several times faster than dense fp32/bf16 GEMV, but a dense fp32 GEMM wins once enough rows share
the weights. So those layers keep their dense weights too and use them for steps with more than
`quant_max_rows` rows (prefill): their kernel depends on the step's size, which is why they are not compiled
(runner/compiled_step.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from kvloop.engine.kernels.cpu import linear_bf16w, linear_int8w, linear_onednn

FORMATS = ("none", "bf16", "int4", "int8")
GROUP = 32
_dense_graph = False  # read while a compiled step is traced: which of a bf16 model's two graphs this is


@contextmanager
def dense_graph(dense: bool) -> Iterator[None]:
    """While a compiled step is traced (and run): bf16 layers with a dense copy take it (True) or the kernel
    (False). The traced graph keeps the branch it saw; it is no guard (the step's
    guards are on its inputs)."""
    global _dense_graph
    before, _dense_graph = _dense_graph, dense
    try:
        yield
    finally:
        _dense_graph = before


def dense_above_rows(model) -> int | None:
    """Steps with more tokens than this take the model's dense weights (the compiled step's second graph);
    None where the model's linears have one path for every step."""
    head = getattr(model, "lm_head", None)
    dense = isinstance(head, Linear) and head.fmt == "bf16" and head.weight is not None
    return head.dense_above if dense else None


def bf16_needs_dense(dtype: torch.dtype) -> bool:
    """Whether a "bf16" layer of a `dtype` model keeps a dense copy of its weights for oneDNN: under a bf16
    model whose kernel multiplies in fp32 (built without AVX512-BF16), or on a CPU with AMX tiles, where
    oneDNN wins past a few rows. Elsewhere the kernel's bf16 pairs beat oneDNN's bf16 GEMM at every row count
    (docs/engine_history.md), so nothing else is kept."""
    return dtype == torch.bfloat16 and linear_bf16w.dense_above_rows() is not None


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [N, K] → (packed int4 weights, scales_and_zeros [K/32, N, 2] bf16)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-12)
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * scale  # the kernel computes (q - 8) * scale + zero
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2), scales_and_zeros


def int8_kernel_serves(device: torch.device) -> bool:
    """Whether "int8" layers on `device` run through the int8 kernel at every row count (one kernel whatever
    the step's size, so a compiled step can hold them)."""
    return torch.device(device).type == "cpu" and linear_int8w.available()


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 device: torch.device,
                 fmt: str = "none", quant_max_rows: int = 16):
        if fmt not in FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; choose from {FORMATS}")
        # the int8 kernel takes K a multiple of its block (else dense, below); build.load logged why not built
        int8_kernel = fmt == "int8" and int8_kernel_serves(device) and weight.shape[1] % linear_int8w.QK == 0
        if fmt in ("int4", "int8") and not int8_kernel and (device.type != "cpu" or weight.shape[1] % GROUP):
            fmt = "none"  # torch's packed kernels used here are CPU kernels with K a multiple of the group
        if fmt == "bf16" and (device.type != "cpu" or not linear_bf16w.available()):
            fmt = "none"  # build.load has logged why the kernel is unavailable
        self.fmt = fmt
        self.dtype = dtype
        self.quant_max_rows = quant_max_rows
        self.out_features = weight.shape[0]
        # the packed bf16 weights (and a dense copy where bf16_needs_dense); the bias stays fp32
        if fmt == "bf16":
            self.packed = linear_bf16w.pack(weight)
            self.bias = None if bias is None else bias.float().contiguous()
            dense = bf16_needs_dense(dtype)
            # steps past dense_above rows take the dense copy; the rest the kernel, in
            # bf16 pairs where it has them
            self.dense_above = linear_bf16w.dense_above_rows() if dense else None
            self.pairs = dtype == torch.bfloat16 and linear_bf16w.native()
            self.weight = weight.to(device=device, dtype=dtype).contiguous() if dense else None
            self.dense_bias = None if bias is None or not dense else bias.to(device=device,
                                                                             dtype=dtype).contiguous()
            if self._onednn_serves():  # the dense copy lives on only as oneDNN's packed one, behind a key
                self.weight = linear_onednn.keyed(self.weight)
            return
        if int8_kernel:  # the packed int8 weights and fp32 scales are all that is kept; the bias stays fp32
            self.weight = None
            q, self.scales = linear_int8w.quantize(weight)
            self.packed = linear_int8w.pack(q)
            self.bias = None if bias is None else bias.float().contiguous()
            return
        self.weight = weight.to(device=device, dtype=dtype).contiguous()
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype).contiguous()
        if fmt == "int4":
            self.packed, self.scales = quantize_int4(weight)
        elif fmt == "int8":  # torch's kernel takes bf16 scales
            self.packed, scales = linear_int8w.quantize(weight)
            self.scales = scales.to(torch.bfloat16)

    def _onednn_serves(self) -> bool:
        """Whether the dense bf16 copy goes through oneDNN with its weights packed once (F.linear reorders
        them on every call): decided where the layer runs, so also when it is read back
        from the weight cache."""
        return (self.fmt == "bf16" and self.weight is not None and self.weight.dtype == torch.bfloat16
                and linear_onednn.available())

    @property
    def onednn(self) -> bool:
        """Whether the dense copy goes through linear_onednn: then `weight` is its key."""
        return self.weight is not None and linear_onednn.is_key(self.weight)

    def __setstate__(self, state: dict) -> None:
        """Read back from the weight cache: oneDNN's packed copy is made anew here (it lives in this process
        only), from the dense copy or, behind a key, from the kernel's packed weights; where the operator is
        not built a key turns back into the dense copy F.linear needs."""
        self.__dict__.update(state)
        if self.fmt == "bf16" and self.weight is not None:
            dense = self.dense_weight()
            self.weight = linear_onednn.keyed(dense) if self._onednn_serves() else dense

    def dense_weight(self) -> torch.Tensor | None:
        """The dense weight matrix in the model dtype, if the layer has one: its dense copy, or, where that
        lives only as oneDNN's packed copy, the same values read back out of the kernel's packed weights."""
        if not self.onednn:
            return self.weight
        return linear_bf16w.rows(self.packed, torch.arange(self.out_features)).to(self.dtype).contiguous()

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight matrix in the model dtype: the lookup of an
        embedding tied to this layer."""
        if self.weight is not None and not self.onednn:
            return self.weight[ids]
        if self.fmt == "bf16":
            return linear_bf16w.rows(self.packed, ids).to(self.dtype)
        return linear_int8w.rows(self.packed, self.scales, ids).to(self.dtype)  # int8 through its kernel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fmt == "bf16":
            # a bf16 model with a dense copy: oneDNN over it for steps past the kernel's
            # rows, the kernel below them
            if self.weight is not None and (_dense_graph if torch.compiler.is_compiling()
                                            else x.shape[0] > self.dense_above):
                if self.onednn:
                    return linear_onednn.linear(x, self.weight, self.dense_bias)
                return F.linear(x, self.weight, self.dense_bias)
            if x.dtype == torch.bfloat16 and self.pairs:  # bf16 pairs in hardware
                return linear_bf16w.linear_bf16(x, self.packed, self.out_features, self.bias)
            return linear_bf16w.linear(x.float(), self.packed, self.out_features, self.bias).to(x.dtype)
        if self.fmt == "int8" and self.weight is None:
            return linear_int8w.linear(x.float(), self.packed, self.scales, self.out_features,
                                       self.bias).to(x.dtype)
        if self.fmt == "none" or x.shape[0] > self.quant_max_rows:
            return F.linear(x, self.weight, self.bias)
        xb = x.to(torch.bfloat16)
        if self.fmt == "int4":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, GROUP, self.scales)
        else:
            y = torch.ops.aten._weight_int8pack_mm(xb, self.packed, self.scales)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias
