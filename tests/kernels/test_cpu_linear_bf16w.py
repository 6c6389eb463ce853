"""The bf16-weight linear kernel (kernels/cpu/csrc/linear_bf16w.cpp): fp32 arithmetic over bf16 weights.

Against a float64 product of the same bf16-rounded weights every output is within the error bound of a
K-term fp32 sum (|error| <= K * 2^-24 * sum |x_k w_k|), for row counts on and off the register tiles and
N, K that are not multiples of 16. Bitwise equality with torch's fp32 matmul is not a property either
has: both sum the K products in fp32, in different orders. What the kernel does guarantee, and is checked
bitwise, is that a row's result does not depend on the batch around it. The model with bf16 weights is
compared with the fp32 model over the same bf16-rounded weights: logits within that rounding, the same
greedy tokens."""

from __future__ import annotations

import kernel_ref
import pytest
import torch

from kvloop.engine.kernels.cpu import linear_bf16w
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

ROUNDED_SUFFIXES = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")  # what the bf16 format stores


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    kernel_ref.load_linear_kernel(linear_bf16w)


def fp32_error_bound(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Bound on |fp32 FMA chain - exact| for each output: K rounding steps of at most 2^-24 of the running
    sum, which never exceeds sum |x_k w_k|; plus the bias addition's own rounding."""
    k = x.shape[1]
    bound = k * 2.0**-24 * (x.double().abs() @ w.double().abs().T)
    return bound if bias is None else bound + 2.0**-24 * (bound + bias.double().abs())


@pytest.mark.parametrize("m", [1, 3, 16, 33])
@pytest.mark.parametrize("n,k", [(37, 53), (100, 129), (16, 8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_within_fp32_rounding(m, n, k, with_bias):
    w, x, bias = kernel_ref.linear_case(m, n, k, with_bias)
    wb = w.to(torch.bfloat16).float()  # the weights the kernel multiplies by
    y = linear_bf16w.linear(x, linear_bf16w.pack(w), n, bias)
    exact = x.double() @ wb.double().T + (0 if bias is None else bias.double())
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert ((y.double() - exact).abs() <= fp32_error_bound(x, wb, bias)).all()


def test_a_row_gives_the_same_bits_in_any_batch():
    w, x, bias = kernel_ref.linear_case(33, 70, 300, True, seed=1)
    packed = linear_bf16w.pack(w)
    kernel_ref.assert_batch_invariant(lambda rows: linear_bf16w.linear(rows, packed, 70, bias), x)


def test_rows_read_the_packed_matrix_back():
    w = torch.randn(50, 24)
    ids = torch.tensor([0, 49, 17, 16, 15, 17])
    assert torch.equal(linear_bf16w.rows(linear_bf16w.pack(w), ids), w.to(torch.bfloat16)[ids])


def test_layer_falls_back_to_dense_weights_without_the_kernel(monkeypatch):
    monkeypatch.setattr(linear_bf16w, "available", lambda: False)
    layer = Linear(torch.randn(20, 32), None, torch.float32, torch.device("cpu"), "bf16")
    assert layer.fmt == "none" and layer.weight.dtype == torch.float32


def test_auto_picks_bf16_weights_only_under_dtype_auto_without_native_bf16():
    from kvloop.engine.engine_core import cpu_has_native_bf16, resolve_quantization

    assert resolve_quantization("auto", "auto", "cpu") == ("none" if cpu_has_native_bf16() else "bf16")
    assert resolve_quantization("auto", "float32", "cpu") == "none"  # an explicit fp32 stays the exact path
    assert resolve_quantization("int8", "auto", "cpu") == "int8"


# ---- the model ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(checkpoint) -> tuple[LlamaModel, LlamaModel]:
    """The bf16-weight model, and the fp32 model over the same weights rounded to bf16 (and back)."""
    ours, reference = kernel_ref.stored_weight_models(checkpoint, "bf16", ROUNDED_SUFFIXES,
                                                      lambda t: t.to(torch.bfloat16).float())
    assert ours.lm_head.fmt == "bf16" and ours.layers[0].qkv.fmt == "bf16"
    return ours, reference


def test_model_logits_match_fp32_over_the_same_rounded_weights(models):
    kernel_ref.assert_logits_match(*models)


def test_model_greedy_tokens_match_fp32_over_the_same_rounded_weights(models, checkpoint):
    kernel_ref.assert_greedy_tokens_match(*models, checkpoint)
