"""The int8-weight linear kernel (kernels/cpu/csrc/linear_int8w.cpp): int8 weights with a per-output-channel
fp32 scale, x quantized to int8 per 32 k's (llama.cpp's Q8_0 activations), int32 block dot products summed
in fp32.

Against a float64 evaluation of the same quantized-activation math (x quantized here as the kernel does:
fp32 operations, ties to even) every output is within the error bound of its fp32 steps, for row counts on
and off the 2-row tiles and N not a multiple of the 4-channel groups. What is checked bitwise: a row's
result does not depend on the batch around it nor on the thread count, and the portable path gives the AVX2
path's bits. K must be a multiple of 32: refused by the kernel, kept dense by the layer. The model with
int8 weights is compared with the fp32 model over the same dequantized weights: within what quantizing
activations costs, the same greedy tokens."""

from __future__ import annotations

import kernel_ref
import pytest
import torch

from kvloop.engine.kernels.cpu import linear_int8w
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

QUANTIZED_SUFFIXES = ("_proj.weight", "lm_head.weight")  # what the int8 format stores (and a tied embedding)
SHAPES = [(37, 64), (100, 128), (4, 32), (5, 1536), (70, 576)]  # (N, K): N off the groups of 4 too


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    kernel_ref.load_linear_kernel(linear_int8w)


def dequantized(w: torch.Tensor) -> torch.Tensor:
    q, scale = linear_int8w.quantize(w)
    return q.float() * scale[:, None]


def quantized_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] quantized as the kernel does, in fp32: per 32 k's amax = max |x|, scale = amax / 127,
    q = round(x * (127 / amax)) (ties to even; 0 where amax is 0). Returns (q [M, K], scale [M, K/32])."""
    m, k = x.shape
    blocks = x.view(m, k // linear_int8w.QK, linear_int8w.QK)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros(()))
    return torch.round(blocks * inv[..., None]).view(m, k), amax / 127


def quantized_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    """The quantized-activation product in float64, and the bound on |kernel - it| per output: each of the
    8 lanes' fp32 FMA chain over the K/32 blocks (a rounding of at most 2^-24 of the running sum per block,
    never above the sum of the terms' magnitudes), 3 levels of additions, the scale multiply, the bias add."""
    xq, xs = quantized_x(x)
    m, k = x.shape
    blocks = k // linear_int8w.QK
    xb, qb = xq.double().view(m, blocks, -1), q.double().view(q.shape[0], blocks, -1)
    per_block = torch.einsum("mbk,nbk->mnb", xb, qb)
    magnitudes = torch.einsum("mbk,nbk->mnb", xb.abs(), qb.abs())
    s = scale.double()
    exact = (per_block * xs.double()[:, None, :]).sum(-1) * s
    magnitude = (magnitudes * xs.double()[:, None, :]).sum(-1) * s.abs()
    bound = (blocks + 4) * 2.0**-24 * magnitude * (1 + (blocks + 4) * 2.0**-24)
    if bias is None:
        return exact, bound
    return exact + bias.double(), bound + 2.0**-24 * (magnitude + bound + bias.double().abs())


@pytest.mark.parametrize("m", [1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_quantized_activation_math(m, n, k, with_bias):
    w, x, bias = kernel_ref.linear_case(m, n, k, with_bias)
    q, scale = linear_int8w.quantize(w)
    y = linear_int8w.linear(x, linear_int8w.pack(q), scale, n, bias)
    exact, bound = quantized_reference(x, q, scale, bias)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert ((y.double() - exact).abs() <= bound).all()


def test_quantized_activations_are_close_to_fp32_ones():
    """What quantizing x costs on N(0, 1) data (what makes "int8" an option, not the exact path): measured
    ~0.5% relative error of an output row."""
    w, x, _ = kernel_ref.linear_case(8, 256, 576, False)
    q, scale = linear_int8w.quantize(w)
    y = linear_int8w.linear(x, linear_int8w.pack(q), scale, 256)
    fp32 = x.double() @ (q.double() * scale.double()[:, None]).T
    assert ((y.double() - fp32).norm(dim=1) / fp32.norm(dim=1)).max() < 0.01


def test_zero_rows_and_blocks_give_zero_and_the_bias():
    w, x, bias = kernel_ref.linear_case(3, 9, 96, True)
    x[0] = 0
    x[1, 32:64] = 0  # one all-zero block: scale 0, no division by it
    q, scale = linear_int8w.quantize(w)
    y = linear_int8w.linear(x, linear_int8w.pack(q), scale, 9, bias)
    assert torch.equal(y[0], bias)
    exact, bound = quantized_reference(x, q, scale, bias)
    assert ((y.double() - exact).abs() <= bound).all()


def test_full_scale_products_do_not_saturate():
    """|x_q| = |w_q| = 127 everywhere: the int16 pair sums reach 2 * 127^2 = 32258, just inside int16."""
    signs = torch.tensor([1.0, -1.0]).repeat(288)  # alternating, K = 576
    w = torch.stack([signs, -signs, torch.ones(576), -torch.ones(576)])
    x = torch.stack([signs, torch.ones(576)]) * 3.0
    q, scale = linear_int8w.quantize(w)
    y = linear_int8w.linear(x, linear_int8w.pack(q), scale, 4)
    expected = torch.tensor([[1728.0, -1728.0, 0, 0], [0, 0, 1728.0, -1728.0]])  # 576 * 3 * 1
    torch.testing.assert_close(y, expected, rtol=1e-6, atol=0)  # saturating would be off by far more
    assert torch.equal(linear_int8w.linear_scalar(x, linear_int8w.pack(q), scale, 4), y)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_portable_path_gives_the_same_bits(n, k, with_bias):
    """linear_scalar runs the portable code (what a build without AVX2 runs): integer sums are exact and every
    fp32 step is an explicit fma or a lone add/multiply, so its bits are the AVX2 path's."""
    for m in (1, 2, 5):
        w, x, bias = kernel_ref.linear_case(m, n, k, with_bias)
        q, scale = linear_int8w.quantize(w)
        packed = linear_int8w.pack(q)
        x[0, :3] = torch.tensor([0.5, -1.5, 2.5]) * x[0].abs().max() / 127  # halfway values for the rounding
        assert torch.equal(linear_int8w.linear(x, packed, scale, n, bias),
                           linear_int8w.linear_scalar(x, packed, scale, n, bias))


def test_a_row_gives_the_same_bits_with_any_thread_count():
    """40 rows: x quantized on the heap, by threads too; 300 channels split over the threads unevenly."""
    w, x, bias = kernel_ref.linear_case(40, 300, 576, True, seed=2)
    q, scale = linear_int8w.quantize(w)
    packed = linear_int8w.pack(q)
    one = linear_int8w.linear(x, packed, scale, 300, bias)
    try:
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(linear_int8w.linear(x, packed, scale, 300, bias), one)
    finally:
        torch.set_num_threads(1)


def test_k_not_a_multiple_of_32_is_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        linear_int8w.pack(torch.zeros(8, 40, dtype=torch.int8))
    packed = torch.zeros(2, 1, 4, 32, dtype=torch.int8)  # what a 40-wide x would need, if packing allowed it
    with pytest.raises(RuntimeError, match="multiple of 32"):
        linear_int8w.linear(torch.zeros(1, 40), packed, torch.ones(8), 8)
    layer = Linear(torch.randn(8, 40), None, torch.float32, torch.device("cpu"), "int8")
    assert layer.fmt == "none" and layer.weight is not None  # such a layer stays dense


def test_quantize_is_symmetric_per_channel_and_close():
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))
    q, scale = linear_int8w.quantize(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (40,)
    assert (q.abs().amax(dim=1) == 127).all()  # each channel's largest weight maps to +-127
    assert ((dequantized(w) - w).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all()  # within half a step


def test_a_row_gives_the_same_bits_in_any_batch():
    w, x, bias = kernel_ref.linear_case(33, 70, 320, True, seed=1)
    q, scale = linear_int8w.quantize(w)
    packed = linear_int8w.pack(q)
    kernel_ref.assert_batch_invariant(lambda rows: linear_int8w.linear(rows, packed, scale, 70, bias), x)


def test_a_row_of_a_large_batch_gives_its_bits_alone():
    """100 rows of K = 1536: the rows go in several chunks (each chunk's quantized x kept in L2)."""
    w, x, bias = kernel_ref.linear_case(100, 45, 1536, True, seed=4)
    q, scale = linear_int8w.quantize(w)
    packed = linear_int8w.pack(q)
    whole = linear_int8w.linear(x, packed, scale, 45, bias)
    for i in (0, 39, 40, 41, 99):
        assert torch.equal(linear_int8w.linear(x[i : i + 1], packed, scale, 45, bias)[0], whole[i])
    exact, bound = quantized_reference(x, q, scale, bias)
    assert ((whole.double() - exact).abs() <= bound).all()


def test_rows_dequantize_the_packed_matrix():
    w = torch.randn(50, 64)
    q, scale = linear_int8w.quantize(w)
    ids = torch.tensor([0, 49, 17, 16, 15, 17])
    assert torch.equal(linear_int8w.rows(linear_int8w.pack(q), scale, ids), dequantized(w)[ids])


def test_layer_uses_the_kernel_and_keeps_no_dense_weights():
    w = torch.randn(22, 96)
    layer = Linear(w, None, torch.float32, torch.device("cpu"), "int8")
    assert layer.fmt == "int8" and layer.weight is None
    ids = torch.tensor([3, 19])
    assert torch.equal(layer[ids], dequantized(w)[ids])


def test_layer_falls_back_to_torch_int8_without_the_kernel(monkeypatch):
    monkeypatch.setattr(linear_int8w, "available", lambda: False)
    layer = Linear(torch.randn(20, 32), None, torch.float32, torch.device("cpu"), "int8")
    assert layer.fmt == "int8" and layer.weight.dtype == torch.float32
    assert layer.scales.dtype == torch.bfloat16
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


def test_model_logits_are_close_to_fp32_over_the_same_dequantized_weights(models):
    """The same embedding rows (bitwise: the tied embedding is read from the packed head), and PROMPT's logits
    within what 8-bit activations in every linear layer cost: measured max |diff| 1.6 on logits up to 31, a
    relative (L2) error of at most 8.5% per position (fp32 activations gave 1e-4: the kernel's arithmetic is
    not what differs)."""
    ours, reference_model = models
    ids = torch.tensor(kernel_ref.PROMPT)
    assert isinstance(ours.embed, Linear) == ours.cfg.tie_embeddings
    assert torch.equal(ours.embed[ids], reference_model.embed[ids])
    a = kernel_ref.prompt_logits(ours, kernel_ref.PROMPT)
    b = kernel_ref.prompt_logits(reference_model, kernel_ref.PROMPT)
    assert ((a - b).norm(dim=-1) / b.norm(dim=-1)).max() <= 0.15


def test_model_greedy_tokens_match_fp32_over_the_same_dequantized_weights(models, checkpoint):
    kernel_ref.assert_greedy_tokens_match(*models, checkpoint)
