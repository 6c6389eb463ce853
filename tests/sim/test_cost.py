"""Cost-model arithmetic against hand-computed rooflines."""

import pytest
from kvloop.engine.sim.cost import CostModel, Efficiency, Hardware, step_shape
from kvloop.engine.sim.profiles import LLAMA3_8B, SMOLLM2_135M, get_profile


def test_llama3_8b_shape():
    assert LLAMA3_8B.kv_bytes_per_token == 128 * 1024
    # 32 layers x 218.1M + the 128256 x 4096 output head, bf16
    assert LLAMA3_8B.weight_bytes_per_step == pytest.approx(2 * (32 * 218_103_808 + 128256 * 4096))
    assert SMOLLM2_135M.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2


def test_decode_is_memory_bound_and_prefill_compute_bound():
    hw = Hardware("x", mem_bw=1e12, peak_flops=1e15, mem_bytes=1e11)
    cm = CostModel(LLAMA3_8B, hw, Efficiency(bw=0.5, flops=0.5, step_overhead_s=1e-3, seq_overhead_s=1e-5))
    w = LLAMA3_8B.weight_bytes_per_step
    kv = LLAMA3_8B.kv_bytes_per_token
    # one decode at context 1000: reads weights + 1000 tokens of KV, writes one
    c = cm.step_for([(1000, 1, True)])
    assert c.memory_bound
    assert c.seconds == pytest.approx((w + 1001 * kv) / 0.5e12 + 1e-3 + 1e-5)
    # a 4096-token prefill from scratch: matmul FLOPs dominate
    c = cm.step_for([(0, 4096, True)])
    assert not c.memory_bound
    flops = 2 * LLAMA3_8B.matmul_params * 4096 + 2 * LLAMA3_8B.head_params + 4 * 32 * 32 * 128 * (4096 * 4097 / 2)
    assert c.flops == pytest.approx(flops)
    assert c.seconds == pytest.approx(flops / 0.5e15 + 1e-3 + 1e-5)


def test_step_for_sums_items():
    cm = get_profile("h200").cost_model()
    a = cm.step_for([(100, 1, True), (0, 64, False), (500, 1, True)])
    b = cm.step(66, 3, 2, 600, (101) + (64 * 65 / 2) + 501)
    assert a.seconds == pytest.approx(b.seconds)


def test_transfer_and_pool_sizing():
    prof = get_profile("h200")
    cm = prof.cost_model()
    assert cm.transfer_seconds(10, 0, 16) == pytest.approx(10 * 16 * 131072 / 50e9)
    # 141 GB x 0.9 - 16 GB weights - 2 GB activations, in 128 KiB tokens
    assert 800_000 < prof.kv_pool_tokens < 860_000
    assert get_profile("h100").kv_pool_tokens < prof.kv_pool_tokens


def test_serial_kv_and_attention_terms():
    """The CPU form: weights/matmul roofline, then KV traffic and attention at their own efficiencies."""
    hw = Hardware("x", mem_bw=1e10, peak_flops=1e11, mem_bytes=1e10)
    m = SMOLLM2_135M
    roof = CostModel(m, hw, Efficiency(bw=0.5, flops=0.5))
    serial = CostModel(m, hw, Efficiency(bw=0.5, flops=0.5, kv_bw=0.1, attn_flops=0.2))
    items = [(300, 1, True), (0, 200, True)]
    tokens, _, samples, ctx, pairs, chunks = step_shape(items)
    assert chunks == 1
    w, kv, mm, attn = serial.components(tokens, samples, ctx, pairs)
    assert w == m.weight_bytes_per_step and kv == m.kv_bytes_per_token * (300 + 201)
    expect = max(w / 0.5e10, mm / 0.5e11) + kv / 0.1e10 + attn / 0.2e11
    assert serial.step_for(items).seconds == pytest.approx(expect)
    # the totals the step reports do not depend on the form; only its time does
    assert serial.step_for(items).bytes == roof.step_for(items).bytes
    assert serial.step_for(items).flops == roof.step_for(items).flops
    assert serial.step_for(items).seconds > roof.step_for(items).seconds


def test_padded_decodes_read_the_longest_context():
    """The CPU decode path runs every row over the batch's longest context; prefill chunks are not padded."""
    items = [(100, 1, True), (900, 1, True), (50, 30, True)]
    plain = step_shape(items)
    padded = step_shape(items, pad_decodes=True)
    assert plain[3] == 100 + 900 + 50 and padded[3] == 2 * 900 + 50
    assert padded[4] == 2 * 901 + (30 * 50 + 30 * 31 / 2)
    hw = Hardware("x", mem_bw=1e10, peak_flops=1e11, mem_bytes=1e10)
    eff = Efficiency(bw=0.5, flops=0.5, kv_bw=0.1, attn_flops=0.2)
    pad = CostModel(SMOLLM2_135M, hw, Efficiency(**{**eff.__dict__, "pad_decodes": True}))
    assert pad.decode_context(2, 1000, 900) == 1800
    assert CostModel(SMOLLM2_135M, hw, eff).decode_context(2, 1000, 900) == 1000
    assert pad.step_for(items).seconds > CostModel(SMOLLM2_135M, hw, eff).step_for(items).seconds
