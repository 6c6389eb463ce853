"""The bf16-weight linear kernel (kernels/cpu/csrc/linear_bf16w.cpp): fp32 arithmetic over bf16 weights.

Against a float64 product of the same bf16-rounded weights every output is within the error bound of a
K-term fp32 sum (|error| <= K * 2^-24 * sum |x_k w_k|), for row counts on and off the register tiles and
N, K that are not multiples of 16. Bitwise equality with torch's fp32 matmul is not a property either
has: both sum the K products in fp32, in different orders. What the kernel does guarantee, and is checked
bitwise, is that a row's result does not depend on the batch around it. The model with bf16 weights is
compared with the fp32 model over the same bf16-rounded weights: logits within that rounding, the same
greedy tokens."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.kernels.cpu import build, linear_bf16w
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

ROUNDED_SUFFIXES = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")  # what the bf16 format stores


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    if not build.load(linear_bf16w.KERNEL, build=True):
        pytest.skip(f"bf16-weight CPU kernel unavailable: {build.unavailable_reason(linear_bf16w.KERNEL)}")
    assert linear_bf16w.available()
    torch.set_num_threads(1)


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
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    wb = w.to(torch.bfloat16).float()  # the weights the kernel multiplies by
    y = linear_bf16w.linear(x, linear_bf16w.pack(w), n, bias)
    exact = x.double() @ wb.double().T + (0 if bias is None else bias.double())
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert ((y.double() - exact).abs() <= fp32_error_bound(x, wb, bias)).all()


def test_a_row_gives_the_same_bits_in_any_batch():
    gen = torch.Generator().manual_seed(1)
    w, x, bias = torch.randn(70, 300, generator=gen), torch.randn(33, 300, generator=gen), torch.randn(70, generator=gen)
    packed = linear_bf16w.pack(w)
    whole = linear_bf16w.linear(x, packed, 70, bias)
    for i in range(33):
        assert torch.equal(linear_bf16w.linear(x[i : i + 1], packed, 70, bias)[0], whole[i])
    assert torch.equal(linear_bf16w.linear(x[5:12], packed, 70, bias), whole[5:12])


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


class Rounded(Mapping):
    """The checkpoint with the weights the bf16 format stores rounded to bf16 (and back to fp32)."""

    def __init__(self, weights: Mapping[str, torch.Tensor]):
        self.weights = weights

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.weights[name]
        return t.to(torch.bfloat16).float() if name.endswith(ROUNDED_SUFFIXES) else t

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


@pytest.fixture(scope="module")
def models(checkpoint) -> tuple[LlamaModel, LlamaModel]:
    ours = LlamaModel(checkpoint.config, checkpoint.weights, torch.float32, quantization="bf16")
    reference = LlamaModel(checkpoint.config, Rounded(checkpoint.weights), torch.float32)
    assert ours.lm_head.fmt == "bf16" and ours.layers[0].qkv.fmt == "bf16"
    return ours, reference


PROMPT = [1, 504, 3458, 282, 4649, 314, 1345, 253, 2214, 30, 378, 3112]


def prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    kv = model.new_kv_cache(4, 16)
    meta = AttentionMetadata(torch.arange(len(ids)), 0, torch.zeros(0, 1, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), [PrefillChunk(0, len(ids), len(ids), torch.arange(1))])
    return model.logits(model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, kv))


def test_model_logits_match_fp32_over_the_same_rounded_weights(models):
    ours, reference = models
    ids = torch.tensor(PROMPT)
    if ours.cfg.tie_embeddings:  # looked up in the packed head: the same rounded values, bitwise
        assert isinstance(ours.embed, Linear)
    assert torch.equal(ours.embed[ids], reference.embed[ids])
    a, b = prompt_logits(ours, PROMPT), prompt_logits(reference, PROMPT)
    # 30 layers of fp32 sums taken in another order: measured 9e-5 on logits of magnitude up to 31
    assert (a - b).abs().max().item() <= 1e-3
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_model_greedy_tokens_match_fp32_over_the_same_rounded_weights(models, checkpoint):
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
