"""Cost-model arithmetic against hand-computed rooflines."""

import pytest

from kvloop.engine.cascade.cost import cost_for
from kvloop.engine.sim.cost import (
    CostModel,
    Efficiency,
    Hardware,
    decode_contexts,
    roofline_attention,
    step_shape,
)
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
    # one decode at context 1000: reads weights, writes its token's K/V, and attends over 1001 tokens
    # (the step-cost function's roofline form: K/V streamed at the same achieved bandwidth)
    c = cm.step_for([(1000, 1, True)])
    assert c.memory_bound
    assert c.seconds == pytest.approx((w + kv) / 0.5e12 + 1001 * kv / 0.5e12 + 1e-3 + 1e-5)
    # a 4096-token prefill from scratch: matmul FLOPs dominate
    c = cm.step_for([(0, 4096, True)])
    assert not c.memory_bound
    flops = (2 * LLAMA3_8B.matmul_params * 4096 + 2 * LLAMA3_8B.head_params
             + 4 * 32 * 32 * 128 * (4096 * 4097 / 2))
    assert c.flops == pytest.approx(flops)
    assert c.seconds == pytest.approx(flops / 0.5e15 + 1e-3 + 1e-5)


def test_step_for_sums_items():
    cm = get_profile("h200").cost_model()
    a = cm.step_for([(100, 1, True), (0, 64, False), (500, 1, True)])
    b = cm.step(66, 3, 2, 0, 64 * 65 / 2, 1, decode_us=cm.decode.decode_us([101, 501]))
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
    assert w == m.weight_bytes_per_step and kv == m.kv_bytes_per_token * 201  # the decode's reads are apart
    decode = 1e-6 * serial.decode.decode_us([301])
    expect = max(w / 0.5e10, mm / 0.5e11) + kv / 0.1e10 + attn / 0.2e11 + decode
    assert serial.step_for(items).seconds == pytest.approx(expect)
    # the totals the step reports do not depend on the form; only its time does
    assert serial.step_for(items).bytes == roof.step_for(items).bytes
    assert serial.step_for(items).flops == roof.step_for(items).flops
    assert serial.step_for(items).seconds > roof.step_for(items).seconds


def test_decode_rows_are_priced_by_the_step_cost_function():
    """Decode rows read nothing in the roofline terms; their attention is the shared function's, plain or
    with the groups given; the CPU profile uses the measured model, a GPU one the roofline's."""
    items = [(100, 1, True), (900, 1, True), (50, 30, True)]
    tokens, seqs, samples, ctx, pairs, chunks = step_shape(items)
    assert (tokens, seqs, samples, ctx, chunks) == (32, 3, 3, 50, 1)
    assert pairs == 30 * 50 + 30 * 31 / 2
    assert decode_contexts(items) == [101, 901]
    cpu = get_profile("cpu", calibration="/nonexistent")
    assert cpu.cost_model().attention == cost_for("bfloat16")
    for prof in (cpu, get_profile("h200")):
        cm = prof.cost_model()
        d = [(2000, 1, True)] * 16
        plain = cm.step_for(d).seconds
        assert cm.step_for(d, [(16, 1904)]).seconds < plain
        assert plain - cm.step_for(d, [(16, 1904)]).seconds == pytest.approx(
            1e-6 * prof.model.layers * cm.attention.group_gain_us(16, 1904))


def test_gpu_attention_from_the_roofline():
    prof = get_profile("h200")
    a = roofline_attention(prof.model, prof.hw, prof.eff)
    bw = prof.hw.mem_bw * prof.eff.bw
    # K and V of 8 heads x 128 in bf16, per layer
    assert a.token_us == pytest.approx(1e6 * 8 * 128 * 2 * 2 / bw)
    assert a.call_us == a.row_us == 0.0
    # reading a 2,000-token document once for 16 rows instead of 16 times: nearly 16x fewer K/V bytes
    assert a.group_gain_us(16, 2000) == pytest.approx(15 * 2000 * a.token_us, rel=0.01)
