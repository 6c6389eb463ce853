"""kvloop_cpu::linear_onednn (kernels/cpu/linear_onednn): F.linear bit for bit over bf16 weights packed once
for oneDNN; the packed copy follows its weight (a freed weight's copy goes, a new weight at the same address
gets its own); its fake gives torch.compile the output's shape; and a bf16 model's dense layers take it behind
a key (no second dense copy), also when read back from the weight cache."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
import torch.nn.functional as F
from kernel_ref import linear_case, load_linear_kernel

from kvloop.engine.core.cpu import cpu_capabilities
from kvloop.engine.kernels.cpu import linear_onednn
from kvloop.engine.model.linear import Linear, bf16_needs_dense


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch without oneDNN")
    if not cpu_capabilities().onednn_bf16:
        pytest.skip("oneDNN has no bf16 path on this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT)")
    load_linear_kernel(linear_onednn)


def bf16_case(m: int, n: int, k: int, with_bias: bool):
    w, x, b = linear_case(m, n, k, with_bias)
    return w.bfloat16(), x.bfloat16(), None if b is None else b.bfloat16()


@pytest.mark.parametrize("m", [1, 7, 16, 300])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (3072, 576)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_equals_f_linear_bit_for_bit(m, n, k, with_bias):
    w, x, b = bf16_case(m, n, k, with_bias)
    y = linear_onednn.linear(x, w, b)
    assert y.dtype == torch.bfloat16 and torch.equal(y, F.linear(x, w, b))
    assert torch.equal(linear_onednn.linear(x, w, b), y)  # the packed copy, reused


def test_leading_dims_and_a_strided_input():
    w, x, _ = bf16_case(12, 64, 96, False)
    x3 = x.view(3, 4, 96)
    assert torch.equal(linear_onednn.linear(x3, w, None), F.linear(x3, w))
    wide = torch.randn(12, 200).bfloat16()[:, 10:106]
    assert torch.equal(linear_onednn.linear(wide, w, None), F.linear(wide, w))


def test_the_packed_copy_follows_its_weight():
    gc.collect()
    before = linear_onednn.packed_copies()
    x = torch.ones(4, 64).bfloat16()
    for i in range(4):  # freed and reallocated: the allocator often returns the same address
        w = torch.full((32, 64), float(i + 1)).bfloat16()
        assert torch.equal(linear_onednn.linear(x, w, None), F.linear(x, w))
        assert linear_onednn.packed_copies() == before + 1
        del w
        gc.collect()
    assert linear_onednn.packed_copies() == before


def test_wrong_inputs_are_refused():
    w, x, _ = bf16_case(4, 32, 64, False)
    with pytest.raises(RuntimeError, match="bfloat16"):
        linear_onednn.linear(x.float(), w, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        linear_onednn.linear(x, w.t().contiguous().t(), None)


def test_its_fake_gives_the_output_shape_compiled_graphs_trace():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = torch.ops.kvloop_cpu.linear_onednn(torch.empty(4, 5, 64, dtype=torch.bfloat16),
                                               torch.empty(48, 64, dtype=torch.bfloat16), None)
        assert y.shape == (4, 5, 48) and y.dtype == torch.bfloat16


def test_a_bf16_layers_dense_weights_live_only_in_onednns_copy_also_from_the_cache(monkeypatch):
    w, x, b = linear_case(9, 64, 96, True)
    layer = Linear(w, b, torch.bfloat16, torch.device("cpu"), "bf16")
    if not bf16_needs_dense(torch.bfloat16):
        assert not layer.onednn  # no dense copy here: the bf16 kernel serves every step
        return
    assert layer.onednn and linear_onednn.is_key(layer.weight)  # no dense copy besides oneDNN's packed one
    dense = w.to(torch.bfloat16)
    assert torch.equal(layer.dense_weight(), dense)  # read back out of the kernel's packed weights, same bits
    ids = torch.tensor([3, 0, 63])
    assert torch.equal(layer[ids], dense[ids])
    rows = layer.dense_above + 1
    xb = x.bfloat16().repeat(rows // x.shape[0] + 1, 1)[:rows]
    want = F.linear(xb, dense, layer.dense_bias)
    assert torch.equal(layer(xb), want)
    # read back (a new key tensor, as in a fresh process): its packed copy is made anew
    # from the kernel's weights
    again = pickle.loads(pickle.dumps(layer))
    assert again.weight.data_ptr() != layer.weight.data_ptr() and linear_onednn.is_key(again.weight)
    assert torch.equal(again(xb), want)
    # a cache file written where the operator served, read where it does not: the dense copy comes back
    monkeypatch.setattr(linear_onednn, "available", lambda: False)
    plain = pickle.loads(pickle.dumps(layer))
    assert not plain.onednn and torch.equal(plain.weight, dense) and torch.equal(plain(xb), want)


def test_an_unregistered_key_is_refused():
    key = torch.zeros(1, dtype=torch.bfloat16).expand(8, 16)
    with pytest.raises(RuntimeError, match="no packed weights"):
        linear_onednn.linear(torch.ones(2, 16, dtype=torch.bfloat16), key, None)
