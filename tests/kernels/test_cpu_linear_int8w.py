"""The int8-weight linear kernel (kernels/cpu/csrc/linear_int8w.cpp): fp32 arithmetic over int8 weights with a
per-output-channel fp32 scale.

Against a float64 product of the dequantized weights every output is within the error bound of a K-term fp32
sum followed by the scale multiply and the bias add, for row counts on and off the register tiles and N, K
that are not multiples of 16. What is checked bitwise is that a row's result does not depend on the batch
around it. The model with int8 weights is compared with the fp32 model over the same dequantized weights:
logits within fp32 rounding, the same greedy tokens."""

from __future__ import annotations

import kernel_ref
import pytest
import torch

from kvloop.engine.kernels.cpu import linear_int8w
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

QUANTIZED_SUFFIXES = ("_proj.weight", "lm_head.weight")  # what the int8 format stores (and a tied embedding)


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    kernel_ref.load_linear_kernel(linear_int8w)


def dequantized(w: torch.Tensor) -> torch.Tensor:
    q, scale = linear_int8w.quantize(w)
    return q.float() * scale[:, None]


def error_bound(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Bound on |kernel - exact| per output: the fp32 chain over x_k q_k (K roundings of at most 2^-24 of the
    running sum, never above sum |x_k q_k|), the scale multiply's rounding, then the bias addition's."""
    k = x.shape[1]
    s = scale.double().abs()
    magnitude = (x.double().abs() @ q.double().abs().T) * s
    bound = (k + 1) * 2.0**-24 * magnitude * (1 + k * 2.0**-24)
    return bound if bias is None else bound + 2.0**-24 * (magnitude + bound + bias.double().abs())


@pytest.mark.parametrize("m", [1, 3, 7, 16, 33])
@pytest.mark.parametrize("n,k", [(37, 53), (100, 129), (16, 8), (70, 576)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_within_fp32_rounding(m, n, k, with_bias):
    w, x, bias = kernel_ref.linear_case(m, n, k, with_bias)
    q, scale = linear_int8w.quantize(w)
    y = linear_int8w.linear(x, linear_int8w.pack(q), scale, n, bias)
    exact = x.double() @ (q.double() * scale.double()[:, None]).T + (0 if bias is None else bias.double())
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert ((y.double() - exact).abs() <= error_bound(x, q, scale, bias)).all()


def test_quantize_is_symmetric_per_channel_and_close():
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))
    q, scale = linear_int8w.quantize(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (40,)
    assert (q.abs().amax(dim=1) == 127).all()  # each channel's largest weight maps to +-127
    assert ((dequantized(w) - w).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all()  # within half a step


def test_a_row_gives_the_same_bits_in_any_batch():
    w, x, bias = kernel_ref.linear_case(33, 70, 300, True, seed=1)
    q, scale = linear_int8w.quantize(w)
    packed = linear_int8w.pack(q)
    kernel_ref.assert_batch_invariant(lambda rows: linear_int8w.linear(rows, packed, scale, 70, bias), x)


def test_rows_dequantize_the_packed_matrix():
    w = torch.randn(50, 24)
    q, scale = linear_int8w.quantize(w)
    ids = torch.tensor([0, 49, 17, 16, 15, 17])
    assert torch.equal(linear_int8w.rows(linear_int8w.pack(q), scale, ids), dequantized(w)[ids])


def test_layer_uses_the_kernel_and_keeps_no_dense_weights():
    w = torch.randn(20, 40)
    layer = Linear(w, None, torch.float32, torch.device("cpu"), "int8")
    assert layer.fmt == "int8" and layer.weight is None
    ids = torch.tensor([3, 19])
    assert torch.equal(layer[ids], dequantized(w)[ids])


def test_layer_falls_back_to_torch_int8_without_the_kernel(monkeypatch):
    monkeypatch.setattr(linear_int8w, "available", lambda: False)
    layer = Linear(torch.randn(20, 32), None, torch.float32, torch.device("cpu"), "int8")
    assert layer.fmt == "int8" and layer.weight.dtype == torch.float32 and layer.scales.dtype == torch.bfloat16
    assert layer(torch.randn(2, 32)).shape == (2, 20)


# torch's config.patch, not monkeypatch: undoing a monkeypatch of a config key deletes it, which hides the key
@torch._dynamo.config.patch(disable=False)  # the tests' environment disables compiling
def test_int8_compiles_only_with_the_kernel(monkeypatch):
    from kvloop.engine.runner.compiled_step import cannot_compile

    class Model:
        device = torch.device("cpu")
        quantization = "int8"

        def layers_forward(self):
            pass

    model = Model()
    assert "int8" not in (cannot_compile(model) or "")
    monkeypatch.setattr(linear_int8w, "available", lambda: False)
    assert "int8 weights choose their kernel" in cannot_compile(model)
    model.quantization = "int4"
    assert "int4 weights choose their kernel" in cannot_compile(model)


# ---- the model ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(checkpoint) -> tuple[LlamaModel, LlamaModel]:
    """The int8 model, and the fp32 model over dequantized weights (a tied embedding is the head's:
    dequantized too). The engine quantizes q/k/v and gate/up fused, per output channel: the same scales as
    quantizing each part alone."""
    tied = ("embed_tokens.weight",) if checkpoint.config.tie_embeddings else ()
    ours, reference = kernel_ref.stored_weight_models(checkpoint, "int8", QUANTIZED_SUFFIXES + tied,
                                                      dequantized)
    assert ours.lm_head.fmt == "int8" and ours.layers[0].qkv.weight is None
    return ours, reference


def test_model_logits_match_fp32_over_the_same_dequantized_weights(models):
    kernel_ref.assert_logits_match(*models)


def test_model_greedy_tokens_match_fp32_over_the_same_dequantized_weights(models, checkpoint):
    kernel_ref.assert_greedy_tokens_match(*models, checkpoint)
