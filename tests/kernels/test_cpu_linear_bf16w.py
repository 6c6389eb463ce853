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

from kvloop.engine.core.cpu import parse_cpuinfo
from kvloop.engine.kernels.cpu import amx, linear_bf16w
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

ROUNDED_SUFFIXES = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")  # what the bf16 format stores
NATIVE_BF16 = "flags\t: avx2 fma avx512f avx512bw avx512_bf16\n"  # a /proc/cpuinfo with AVX512-BF16


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


@pytest.mark.parametrize("native_bf16", [False, True])
def test_auto_picks_bf16_weights_only_under_dtype_auto(monkeypatch, native_bf16):
    from kvloop.engine import engine_core
    from kvloop.engine.core import host_memory

    monkeypatch.setattr(engine_core, "cpu_capabilities",
                        lambda: parse_cpuinfo(NATIVE_BF16 if native_bf16 else ""))
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**40)
    # with native bf16 too: the kernel for decode-sized steps, oneDNN over a dense copy for the rest
    assert engine_core.resolve_quantization("auto", "auto", "cpu") == "bf16"
    # explicit fp32: the exact path
    assert engine_core.resolve_quantization("auto", "float32", "cpu") == "none"
    assert engine_core.resolve_quantization("auto", "bfloat16", "cpu") == "none"
    assert engine_core.resolve_quantization("int8", "auto", "cpu") == "int8"
    assert engine_core.resolve_quantization("bf16", "auto", "cpu") == "bf16"
    monkeypatch.setattr(linear_bf16w, "available", lambda: False)
    assert engine_core.resolve_quantization("auto", "auto", "cpu") == "none"


@pytest.mark.parametrize("available_gib", [None, 1.01, 0.99])
def test_with_native_bf16_the_second_copy_of_the_weights_must_fit_the_hosts_memory(monkeypatch,
                                                                                   available_gib):
    """A kernel without bf16 pairs keeps a dense copy for oneDNN: packed + dense bf16 copies
    of 134.5M linear weights
    (the embedded model), 0.501 GiB. Kept only while that is at most half of the available memory (1.002 GiB);
    where /proc/meminfo cannot be read, kept. With bf16 pairs there is one copy, and no rule."""
    from kvloop.engine import engine_core
    from kvloop.engine.core import host_memory

    monkeypatch.setattr(engine_core, "cpu_capabilities", lambda: parse_cpuinfo(NATIVE_BF16))
    monkeypatch.setattr(linear_bf16w, "native", lambda: True)
    monkeypatch.setattr(amx, "available", lambda: False)
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**20)
    assert engine_core.resolve_quantization("auto", "auto", "cpu", 134_479_872) == "bf16"
    # AMX tiles: oneDNN's copy is kept, under the same rule
    monkeypatch.setattr(amx, "available", lambda: True)
    assert engine_core.resolve_quantization("auto", "auto", "cpu", 134_479_872) == "none"
    monkeypatch.setattr(amx, "available", lambda: False)
    monkeypatch.setattr(linear_bf16w, "native", lambda: False)
    available = None if available_gib is None else int(available_gib * 2**30)
    monkeypatch.setattr(host_memory, "available_bytes", lambda: available)
    params = 134_479_872
    want = "bf16" if available_gib is None or available_gib > 1.002 else "none"
    assert engine_core.resolve_quantization("auto", "auto", "cpu", params) == want


def test_meminfo_available_is_read_in_bytes():
    from kvloop.engine.core.host_memory import meminfo_available_bytes

    text = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20971520 kB\n"
    assert meminfo_available_bytes(text) == 20 * 2**30
    assert meminfo_available_bytes("MemTotal: 1 kB\n") is None


# ---- a bf16 model, bf16 pairs (AVX512-BF16): the kernel for every step ----------------------------

needs_pairs = pytest.mark.skipif("not linear_bf16w.native()",
                                 reason="the kernel was built without AVX512-BF16")


@pytest.fixture(params=["pairs", "tiles"])
def bf16_path(request) -> str:
    """linear_bf16's routine for the test: the bf16 pairs, or AMX tiles where the kernel has them
    (csrc/linear_amx.h); the process-wide setting is restored after."""
    before = linear_bf16w.tiles()
    want = request.param == "tiles"
    if linear_bf16w.set_tiles(want) != want:
        linear_bf16w.set_tiles(before)
        pytest.skip("the kernel has no AMX tiles on this machine")
    yield request.param
    linear_bf16w.set_tiles(before)


def bf16_output_slack(x: torch.Tensor, wb: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Rounding the output to bf16 (half an ulp, 2^-8 relative) plus the fp32 sums, and a
    little for results near 0."""
    return 2.0**-8 * exact.abs() + 2 * fp32_error_bound(x.float(), wb.float(), None) + 1e-6


def test_the_tiles_are_on_where_amx_is_available():
    """Loading the kernel switches its tile path on where this process holds AMX's tile state (a build for a
    CPU with AMX has the tiles); the tests that switch it restore it."""
    assert linear_bf16w.tiles() == (linear_bf16w.native() and amx.available())


@needs_pairs
# tiles: 16 rows a tile, 64 a pass over the weights, 32 k's a step (54, 130, 8: a partial last step)
@pytest.mark.parametrize("m", [1, 7, 12, 13, 33, 64, 70])
# 53: odd K, the fp32 tiles
@pytest.mark.parametrize("n,k", [(37, 54), (100, 130), (16, 8), (70, 53), (40, 96)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_activations_match_float64_within_bf16_rounding(bf16_path, m, n, k, with_bias):
    w, x32, bias = kernel_ref.linear_case(m, n, k, with_bias)
    x, wb = x32.to(torch.bfloat16), w.to(torch.bfloat16).double()
    y = linear_bf16w.linear_bf16(x, linear_bf16w.pack(w), n, bias)
    exact = x.double() @ wb.T + (0 if bias is None else bias.double())
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert ((y.double() - exact).abs() <= bf16_output_slack(x, wb, exact)).all()


@needs_pairs
def test_bf16_activations_give_a_row_the_same_bits_in_any_batch(bf16_path):
    w, x, bias = kernel_ref.linear_case(70, 70, 300, True, seed=1)  # tiles: a partial tile, a second pass
    packed = linear_bf16w.pack(w)
    kernel_ref.assert_batch_invariant(lambda rows: linear_bf16w.linear_bf16(rows, packed, 70, bias),
                                      x.to(torch.bfloat16))


@needs_pairs
def test_bf16_layer_keeps_no_dense_copy_and_takes_the_kernel_at_every_row_count(monkeypatch):
    monkeypatch.setattr(amx, "available", lambda: False)
    n, k = 70, 130
    w, x32, bias = kernel_ref.linear_case(40, n, k, True)
    layer = Linear(w, bias, torch.bfloat16, torch.device("cpu"), "bf16")
    assert layer.fmt == "bf16" and layer.weight is None and layer.dense_bias is None
    x = x32.to(torch.bfloat16)
    for m in (1, linear_bf16w.DENSE_ABOVE_ROWS + 1, 40):
        assert torch.equal(layer(x[:m]), linear_bf16w.linear_bf16(x[:m], layer.packed, n, layer.bias))


@needs_pairs
@pytest.mark.parametrize("with_bias", [False, True])
def test_with_amx_a_bf16_layer_takes_the_kernel_up_to_its_row_bound_and_onednn_above(monkeypatch, bf16_path,
                                                                                      with_bias):
    """On a CPU with AMX tiles oneDNN's bf16 GEMM outruns the pairs past AMX_DENSE_ABOVE_ROWS rows, and the
    kernel's own tiles past TILES_DENSE_ABOVE_ROWS: the layer keeps a dense copy for it. Each branch gives its
    own routine's bits."""
    monkeypatch.setattr(amx, "available", lambda: True)
    bound = linear_bf16w.TILES_DENSE_ABOVE_ROWS if bf16_path == "tiles" else linear_bf16w.AMX_DENSE_ABOVE_ROWS
    assert linear_bf16w.dense_above_rows() == bound
    n, k = 70, 130
    w, x32, bias = kernel_ref.linear_case(3 * bound, n, k, with_bias)
    layer = Linear(w, bias, torch.bfloat16, torch.device("cpu"), "bf16")
    assert layer.weight.dtype == torch.bfloat16 and layer.packed is not None and layer.dense_above == bound
    x = x32.to(torch.bfloat16)
    for m in (1, bound, bound + 1, x.shape[0]):
        if m <= bound:
            want = linear_bf16w.linear_bf16(x[:m], layer.packed, n, layer.bias)
        else:
            want = torch.nn.functional.linear(x[:m], layer.dense_weight(), layer.dense_bias)
        assert torch.equal(layer(x[:m]), want), m


# ---- a bf16 model, fp32 tiles: the kernel for decode-sized steps, torch's GEMM above -----------------


@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_layer_takes_the_kernel_up_to_its_row_bound_and_torch_above(monkeypatch, with_bias):
    """Where the kernel has no bf16 pairs. Both branches against float64 over the same bf16 operands, within
    rounding the output to bf16 plus the fp32 sums; the kernel's branch is the fp32 kernel's
    bits rounded to bf16."""
    monkeypatch.setattr(linear_bf16w, "native", lambda: False)
    n, k = 70, 130
    w, x32, bias = kernel_ref.linear_case(2 * linear_bf16w.DENSE_ABOVE_ROWS, n, k, with_bias)
    layer = Linear(w, bias, torch.bfloat16, torch.device("cpu"), "bf16")
    assert layer.fmt == "bf16" and layer.weight.dtype == torch.bfloat16 and layer.packed is not None
    x = x32.to(torch.bfloat16)
    wb = w.to(torch.bfloat16).double()
    for m in (1, linear_bf16w.DENSE_ABOVE_ROWS, linear_bf16w.DENSE_ABOVE_ROWS + 1, x.shape[0]):
        y = layer(x[:m])
        kernel_branch = m <= linear_bf16w.DENSE_ABOVE_ROWS
        # the kernel adds the fp32 bias; torch's GEMM the bias rounded to bf16
        b = 0 if bias is None else (bias if kernel_branch else bias.to(torch.bfloat16)).double()
        exact = x[:m].double() @ wb.T + b
        assert y.dtype == torch.bfloat16 and y.shape == (m, n)
        assert ((y.double() - exact).abs() <= bf16_output_slack(x[:m], wb, exact)).all(), m
        if kernel_branch:
            kernel = linear_bf16w.linear(x[:m].float(), layer.packed, n, layer.bias).to(torch.bfloat16)
            assert torch.equal(y, kernel)
        else:
            dense_bias = layer.bias.to(torch.bfloat16) if bias is not None else None
            assert torch.equal(y, torch.nn.functional.linear(x[:m], layer.dense_weight(), dense_bias))


@pytest.mark.parametrize("pairs", [False, True])
def test_bf16_layer_looks_up_rows_from_its_dense_copy_or_packed_weights(monkeypatch, pairs):
    monkeypatch.setattr(linear_bf16w, "native", lambda: pairs)
    monkeypatch.setattr(amx, "available", lambda: False)
    w = torch.randn(50, 24)
    layer = Linear(w, None, torch.bfloat16, torch.device("cpu"), "bf16")
    assert (layer.weight is None) == pairs
    ids = torch.tensor([0, 49, 17, 16])
    assert torch.equal(layer[ids], w.to(torch.bfloat16)[ids])


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


def test_linear_params_counts_the_models_linear_weights():
    """What the memory rule above counts: every linear layer's weights, the head included (untied here)."""
    from kvloop.engine.model.config import ModelConfig
    from kvloop.engine.model.llama import LlamaModel
    from kvloop.engine.model.random_weights import random_weights

    cfg = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=80, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position=64)
    model = LlamaModel(cfg, random_weights(cfg, seed=0), torch.float32)
    layers = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert cfg.linear_params == sum(lin.weight.numel() for lin in (*layers, model.lm_head))
