"""Loading streams: each tensor is read, converted to the model's dtype and placed as the model asks for
it, so peak host memory is about the model in its dtype plus one float32 tensor (not the model in
float32), and the float32 path gives the very same weights and logits as reading everything first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_helpers import one_prompt_logits

from kvloop.engine.model.checkpoint import LazyWeights
from kvloop.engine.model.llama import Layer, LlamaModel

SCRIPT = Path(__file__).with_name("peak_load.py")


def test_checkpoint_weights_are_read_on_demand(checkpoint):
    w = checkpoint.weights
    assert isinstance(w, LazyWeights) and len(w) == len(list(w))
    assert "model.layers.0.self_attn.q_proj.weight" in w and "lm_head.weight" not in w
    a, b = w["model.norm.weight"], w["model.norm.weight"]
    assert a.dtype == torch.float32 and torch.equal(a, b) and a.data_ptr() != b.data_ptr()  # nothing kept
    with pytest.raises(KeyError):
        w["model.nope"]


def test_fp32_model_is_bit_identical_to_an_eager_load(checkpoint, fp32_model, tokenizer):
    """Everything read into a dict first (the loaders' old behaviour) gives the same model, bit for bit."""
    eager = {name: checkpoint.weights[name] for name in checkpoint.weights}
    model = LlamaModel(checkpoint.config, eager, torch.float32)
    assert torch.equal(model.embed, fp32_model.embed) and torch.equal(model.lm_head.weight,
                                                                      fp32_model.lm_head.weight)
    for ours, theirs in zip(fp32_model.layers, model.layers, strict=True):
        for part in ("qkv", "o", "gate_up", "down"):
            assert torch.equal(getattr(ours, part).weight, getattr(theirs, part).weight), part
    ids = tokenizer.encode("The capital of France is")
    assert torch.equal(one_prompt_logits(model, ids), one_prompt_logits(fp32_model, ids))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_weights_convert_to_the_same_bits(checkpoint, dtype):
    """Parts are converted before they are fused; that equals converting the float32 concatenation."""
    w, cfg = checkpoint.weights, checkpoint.config
    for n in (0, cfg.num_layers - 1):
        layer = Layer(w, f"model.layers.{n}.", cfg, dtype, torch.device("cpu"), "none")
        p = f"model.layers.{n}."
        qkv = torch.cat([w[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]).to(dtype)
        gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]).to(dtype)
        assert layer.qkv.weight.dtype == dtype and torch.equal(layer.qkv.weight, qkv)
        assert torch.equal(layer.gate_up.weight, gate_up)


def _peak(path: Path, eager: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           # Large blocks via mmap: freed memory leaves RSS at once, so the peak is the live memory's.
           "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, str(SCRIPT), "load", str(path), *(["eager"] if eager else [])],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc")
@pytest.mark.parametrize("kind", ["gguf", "hf"])
def test_peak_host_memory_is_the_model_in_its_dtype_plus_one_tensor(tmp_path, kind):
    """A 66M-parameter synthetic model (float16 GGUF / bfloat16 safetensors) loaded in bfloat16.

    Budget: the file (its memory-mapped pages count in RSS) + the model in bfloat16 + two float32
    copies of the largest tensor (dequantize, then make it contiguous). Reading every tensor to
    float32 first (the old loaders) needs 264 MB more and must fail the same budget."""
    subprocess.run([sys.executable, str(SCRIPT), "write", kind, str(tmp_path)], check=True, timeout=300,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    path = tmp_path / ("m.gguf" if kind == "gguf" else "hf")
    streamed, eager = _peak(path, eager=False), _peak(path, eager=True)
    assert streamed["dtype"] == "torch.bfloat16"
    budget = streamed["file_bytes"] + streamed["model_bytes"] + 2 * streamed["largest_fp32_bytes"]
    grown = streamed["after"] - streamed["before"]
    assert grown <= budget, f"streamed load grew RSS by {grown / 2**20:.0f} MiB > {budget / 2**20:.0f} MiB"
    # The check can fail: the eager load (everything in float32 first) exceeds it.
    assert eager["after"] - eager["before"] > budget, f"the budget would not catch a float32 load: {eager}"
