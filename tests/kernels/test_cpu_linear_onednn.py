"""kvloop_cpu::linear_onednn (kernels/cpu/linear_onednn): F.linear bit for bit over bf16 weights packed once for
oneDNN; the packed copy follows its weight (a freed weight's copy goes, a new weight at the same address gets its
own); its fake gives torch.compile the output's shape; and a bf16 model's dense layers take it, also when read back from
the weight cache."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
import torch.nn.functional as F
from kernel_ref import linear_case, load_linear_kernel

from kvloop.engine.kernels.cpu import linear_onednn
from kvloop.engine.model.linear import Linear, bf16_needs_dense


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    load_linear_kernel(linear_onednn)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch without oneDNN")


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


def test_a_bf16_models_dense_layers_take_it_also_from_the_weight_cache():
    w, x, b = linear_case(9, 64, 96, True)
    layer = Linear(w, b, torch.bfloat16, torch.device("cpu"), "bf16")
    if not bf16_needs_dense(torch.bfloat16):
        assert not layer.onednn  # no dense copy here: the bf16 kernel serves every step
        return
    assert layer.onednn
    restored = pickle.loads(pickle.dumps(layer))
    restored.onednn = None  # what a cache file from another machine might say; __setstate__ decides anew
    again = pickle.loads(pickle.dumps(restored))
    assert again.onednn is True
    xb = x.bfloat16()
    rows = layer.dense_above + 1
    xb = xb.repeat(rows // xb.shape[0] + 1, 1)[:rows]
    assert torch.equal(again(xb), F.linear(xb, layer.weight, layer.dense_bias))
