"""The compiled step over the "cpu" attention backend (runner/compiled_step.py,
engine/kernels/cpu/backend.py):
a decode-only step's attention runs in the kernel's C++ kernel for kvloop_step::attention, never calling
into Python, with the bits of the Python path, under inductor's Python wrapper and its C++ one (cpp_wrapper);
a prefill step still calls the Python kernel; nothing stays bound after a step, one that raises included."""

from __future__ import annotations

import pytest
import torch
from test_compiled_step import TINY, compiles, prefill_then_decode

from kvloop.engine.kernels.cpu import build
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.runner import compiled_step

pytestmark = [compiles, pytest.mark.skipif(not build.load(), reason="the CPU attention kernel is not built")]


def recording(model: LlamaModel, native: bool) -> list[int]:
    """Makes the model's bound attention record the layers the Python kernel runs (into the list returned);
    native=False drops the backend's native step, so that every layer goes through Python."""
    layers: list[int] = []
    bind = LlamaModel.bind_attention.__get__(model)  # the model's own, not an earlier recording one

    def bind_recording(meta, kv_cache):
        attend = bind(meta, kv_cache)

        def attend_recording(layer, q, k, v):
            layers.append(layer)
            return attend(layer, q, k, v)

        if native and hasattr(attend, "native_step"):
            attend_recording.native_step = attend.native_step
        return attend_recording

    model.bind_attention = bind_recording
    return layers


def nothing_bound() -> bool:
    """Whether the operator's CPU kernel calls the Python one (no decode step bound in C++)."""
    ran: list[int] = []
    compiled_step._bound.attend = lambda layer, q, k, v: ran.append(layer) or q.clone()
    try:
        q = torch.zeros(1, TINY.num_heads, TINY.head_dim)
        torch.ops.kvloop_step.attention(q, q[:, :TINY.num_kv_heads], q[:, :TINY.num_kv_heads], 0)
    finally:
        compiled_step._bound.attend = None
    return ran == [0]


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp_wrapper", "python_wrapper"])
@torch._dynamo.config.patch(disable=False)
def test_decode_steps_attend_in_cpp_with_the_python_paths_bits(cpp_wrapper, monkeypatch):
    monkeypatch.setitem(compiled_step.INDUCTOR_OPTIONS, "cpp_wrapper", cpp_wrapper)
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.2), torch.float32, attention_backend="cpu")
    step = compiled_step.CompiledStep(model)
    step.warm_up(16, torch.float32)
    step.stance_when_warm = "fail_on_recompile"
    layers = recording(model, native=True)
    prefill, decode = prefill_then_decode(step, model)
    assert layers == list(range(TINY.num_layers)), ("the prefill step's layers should run the Python kernel "
                                                    "once each")
    assert nothing_bound()

    python_layers = recording(model, native=False)
    python_prefill, python_decode = prefill_then_decode(step, model)
    assert python_layers == 2 * list(range(TINY.num_layers))  # both steps through Python
    assert torch.equal(prefill, python_prefill) and torch.equal(decode, python_decode)

    traced = step._traced

    def decode_fails(input_ids, positions):
        if input_ids.shape[0] > 1:  # the prefill
            return traced(input_ids, positions)
        assert not nothing_bound()  # the decode step is bound while it runs
        raise RuntimeError("a step that fails")

    recording(model, native=True)
    monkeypatch.setattr(step, "_traced", decode_fails)
    with pytest.raises(RuntimeError, match="a step that fails"):
        prefill_then_decode(step, model)
    assert nothing_bound()
