"""The int8-weight linear kernel (kernels/cpu/csrc/linear_int8w.cpp): fp32 arithmetic over int8 weights with a
per-output-channel fp32 scale.

Against a float64 product of the dequantized weights every output is within the error bound of a K-term fp32
sum followed by the scale multiply and the bias add, for row counts on and off the register tiles and N, K
that are not multiples of 16. What is checked bitwise is that a row's result does not depend on the batch
around it. The model with int8 weights is compared with the fp32 model over the same dequantized weights:
logits within fp32 rounding, the same greedy tokens."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.kernels.cpu import build, linear_int8w
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

QUANTIZED_SUFFIXES = ("_proj.weight", "lm_head.weight")  # what the int8 format stores (and a tied embedding)


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    if not build.load(linear_int8w.KERNEL, build=True):
        pytest.skip(f"int8-weight CPU kernel unavailable: {build.unavailable_reason(linear_int8w.KERNEL)}")
    assert linear_int8w.available()
    torch.set_num_threads(1)


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
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
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
    gen = torch.Generator().manual_seed(1)
    w, x, bias = torch.randn(70, 300, generator=gen), torch.randn(33, 300, generator=gen), torch.randn(70, generator=gen)
    q, scale = linear_int8w.quantize(w)
    packed = linear_int8w.pack(q)
    whole = linear_int8w.linear(x, packed, scale, 70, bias)
    for i in range(33):
        assert torch.equal(linear_int8w.linear(x[i : i + 1], packed, scale, 70, bias)[0], whole[i])
    assert torch.equal(linear_int8w.linear(x[5:12], packed, scale, 70, bias), whole[5:12])


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


class Dequantized(Mapping):
    """The checkpoint with the weights the int8 format stores replaced by their dequantized values (fp32)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], tied: bool):
        self.weights = weights
        self.suffixes = QUANTIZED_SUFFIXES + (("embed_tokens.weight",) if tied else ())

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.weights[name]
        return dequantized(t) if name.endswith(self.suffixes) else t

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


@pytest.fixture(scope="module")
def models(checkpoint) -> tuple[LlamaModel, LlamaModel]:
    """The int8 model, and the fp32 model over dequantized weights. The engine quantizes q/k/v and gate/up
    fused, per output channel: the same scales as quantizing each part alone."""
    ours = LlamaModel(checkpoint.config, checkpoint.weights, torch.float32, quantization="int8")
    reference = LlamaModel(checkpoint.config, Dequantized(checkpoint.weights, checkpoint.config.tie_embeddings),
                           torch.float32)
    assert ours.lm_head.fmt == "int8" and ours.layers[0].qkv.weight is None
    return ours, reference


PROMPT = [1, 504, 3458, 282, 4649, 314, 1345, 253, 2214, 30, 378, 3112]


def prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    kv = model.new_kv_cache(4, 16)
    meta = AttentionMetadata(torch.arange(len(ids)), 0, torch.zeros(0, 1, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), [PrefillChunk(0, len(ids), len(ids), torch.arange(1))])
    return model.logits(model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, kv))


def test_model_logits_match_fp32_over_the_same_dequantized_weights(models):
    ours, reference = models
    ids = torch.tensor(PROMPT)
    if ours.cfg.tie_embeddings:  # looked up in the packed head: the same dequantized values, bitwise
        assert isinstance(ours.embed, Linear)
    assert torch.equal(ours.embed[ids], reference.embed[ids])
    a, b = prompt_logits(ours, PROMPT), prompt_logits(reference, PROMPT)
    assert (a - b).abs().max().item() <= 1e-3  # fp32 sums in another order and the scale applied after
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_model_greedy_tokens_match_fp32_over_the_same_dequantized_weights(models, checkpoint):
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.sampling import SamplingParams

    def greedy(model: LlamaModel) -> list[int]:
        engine = EngineCore(EngineConfig(dtype="float32", progress=False, kv_cache_tokens=256), model=model,
                            fingerprint=checkpoint.fingerprint, model_name=checkpoint.name)
        engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        return engine.drain(max_steps=50)["r"].token_ids

    ours, reference = models
    assert greedy(ours) == greedy(reference)
