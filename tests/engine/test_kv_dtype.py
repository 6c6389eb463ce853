"""16-bit KV storage under an fp32 model: half the bytes per token, its own prefix-cache keys, the same
greedy answer as fp32 KV on a short prompt; auto keeps fp32 KV when fp32 was asked for explicitly."""

from __future__ import annotations

import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.runner.model_runner import resolve_kv_dtype


def test_resolution_rules():
    assert resolve_kv_dtype("auto", "float32", torch.float32) == torch.float32  # the exact path stays exact
    assert resolve_kv_dtype("auto", "auto", torch.float32) == torch.bfloat16  # fp32 for speed: KV in 16 bits
    assert resolve_kv_dtype("auto", "auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_dtype("float16", "float32", torch.float32) == torch.float16
    with pytest.raises(ValueError, match="kv_dtype"):
        EngineConfig(kv_dtype="int8")
    with pytest.raises(ValueError, match="cascade"):
        EngineConfig(cascade="sometimes")


def test_bf16_kv_under_fp32_model(make_engine, tokenizer):
    prompt = tokenizer.encode("The capital of France is")
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    answers, keys = {}, {}
    for kv_dtype in ("float32", "bfloat16"):
        engine = make_engine(kv_dtype=kv_dtype, kv_cache_tokens=512)
        assert engine.runner.kv_cache.dtype == getattr(torch, kv_dtype)
        engine.add_request("r", prompt, params)
        answers[kv_dtype] = engine.drain(max_steps=50)["r"].token_ids
        keys[kv_dtype] = engine.kv._extra
        engine.scheduler.check_integrity()
    assert keys["float32"] != keys["bfloat16"]  # cached K/V of one never serves the other
    assert answers["bfloat16"] == answers["float32"]
