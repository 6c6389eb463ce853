"""kvloop_step::attention's C++ kernel for CPU tensors (engine/kernels/cpu/csrc/paged_decode.cpp): with a
decode-only step bound (the "cpu" backend's LayerFn.native_step) it runs decode_layer itself, bit for bit as
the Python kernel's path does, without calling into Python; with none bound it calls the Python kernel
(step_attention, whatever the backend bound). The operator's Python definition and the kernel's library may be
loaded in either order."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from kernel_ref import new_generator
from test_cpu_paged_decode import BS, kernel, meta_for  # noqa: F401 - kernel: its autouse build-or-skip fixture

from kvloop.engine.cascade.plan import build_plan
from kvloop.engine.kernels.cpu import backend
from kvloop.engine.runner import compiled_step


class Recording:
    """A bound attention that records its calls (and then runs `attend`, or refuses: None)."""

    def __init__(self, attend=None):
        self.attend, self.layers = attend, []

    def __call__(self, layer, q, k, v):
        self.layers.append(layer)
        if self.attend is None:
            raise AssertionError("the Python kernel ran")
        return self.attend(layer, q, k, v)


def decode_step(gen: torch.Generator, kv_dtype: torch.dtype, cascade: bool):
    """A 5-row decode step over a 3-layer cache (rows 2-4 sharing 2 blocks) and one layer's q, k, v as the
    model hands them over (strided views)."""
    layers, heads, kv_heads, hd = 3, 6, 2, 64
    kv_cache = torch.randn(layers, 2, 120, BS, kv_heads, hd, generator=gen).to(kv_dtype)
    free = (torch.randperm(119, generator=gen) + 1).tolist()
    shared = [free.pop() for _ in range(2)]
    lens = [1, 16, 40, 57, 700]
    tables = [[free.pop() for _ in range(-(-n // BS))] for n in lens[:2]]
    tables += [shared + [free.pop() for _ in range(-(-n // BS) - 2)] for n in lens[2:]]
    plan = build_plan(tables, lens, BS, lambda members, tokens: members > 1) if cascade else None
    meta = meta_for(tables, lens, plan)
    meta.slot_mapping = torch.tensor([t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens,
                                                                                           strict=True)])
    qk = torch.randn(len(lens), heads + kv_heads, hd, generator=gen)
    wide = torch.randn(len(lens), 3 * kv_heads, hd, generator=gen)
    return kv_cache, meta, qk[:, :heads], qk[:, heads:], wide[:, kv_heads: 2 * kv_heads]


def attention(attend, q, k, v, layer: int) -> torch.Tensor:
    """The operator as the compiled step calls it, with `attend` as the step's bound Python attention."""
    compiled_step._bound.attend = attend
    try:
        return torch.ops.kvloop_step.attention(q, k, v, layer)
    finally:
        compiled_step._bound.attend = None


def test_the_dispatcher_has_a_cpu_kernel_for_the_operator():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("kvloop_step::attention", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("kvloop_step::attention",
                                                          "CompositeExplicitAutograd")


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cascade", [False, True])
def test_a_bound_decode_step_runs_in_cpp_with_the_python_paths_bits(kv_dtype, cascade):
    gen, seed = new_generator()
    kv_cache, meta, q, k, v = decode_step(gen, kv_dtype, cascade)
    cpu = backend.create("cpu")
    python_cache, native_cache = kv_cache.clone(), kv_cache.clone()

    through_python = Recording(cpu.bind(python_cache, meta, 0.125))
    via_python = attention(through_python, q, k, v, 1)
    assert through_python.layers == [1]  # nothing bound: the C++ kernel called the Python one

    bind, unbind = cpu.bind(native_cache, meta, 0.125).native_step
    bind()
    try:
        native = attention(Recording(), q, k, v, 1)  # Python must not run
    finally:
        unbind()
    assert torch.equal(native_cache, python_cache), f"seed {seed}: the caches differ"
    assert not torch.equal(native_cache, kv_cache)  # the step's K/V were written
    assert native.is_contiguous() and torch.equal(native, via_python), f"seed {seed}: the outputs differ"

    after = Recording(lambda layer, q, k, v: q.clone())
    attention(after, q, k, v, 2)
    assert after.layers == [2]  # unbound again: the Python kernel serves


def test_steps_that_bind_nothing_go_through_python():
    """A prefill or mixed step of the "cpu" backend and every step of the torch backend
    carry no native step."""
    gen, _ = new_generator()
    kv_cache, meta, q, k, v = decode_step(gen, torch.float32, False)
    meta.prefills = [object()]  # only its truth is read here
    assert not hasattr(backend.create("cpu").bind(kv_cache, meta, 0.125), "native_step")
    meta.prefills = []
    assert not hasattr(backend.get_backend("torch", "cpu").bind(kv_cache, meta, 0.125), "native_step")


LOAD_ORDER = """
import torch
from kvloop.engine.kernels.cpu import build
{first}
{second}
assert build.load()
from kvloop.engine.runner import compiled_step
q = torch.randn(1, 4, 8)
compiled_step._bound.attend = lambda layer, q, k, v: q * layer
assert torch.equal(torch.ops.kvloop_step.attention(q, q[:, :2], q[:, :2], 3), q * 3)
cache = torch.zeros(1, 2, 1, 4, 2, 8)
ids = torch.tensor([0])
torch.ops.kvloop_cpu.bind_decode_step(cache, ids, ids, ids, torch.tensor([1]), torch.tensor([0, 1]), ids,
                                      0.5, 512)
compiled_step._bound.attend = None
out = torch.ops.kvloop_step.attention(q, q[:, :2], q[:, :2], 0)
torch.ops.kvloop_cpu.unbind_decode_step()
# one token: every query head gets its KV head's V (heads 0-1 of KV head 0, 2-3 of 1)
assert torch.equal(out, q[:, :2].repeat_interleave(2, dim=1)) and torch.equal(cache[0, 1, 0, 0], q[0, :2])
print("ok")
"""


@pytest.mark.parametrize("library_first", [True, False], ids=["library_first", "definition_first"])
def test_either_load_order_serves_both_paths(library_first):
    """The C++ kernel is registered before or after the Python definition, and either
    way serves both paths."""
    load, define = "assert build.load()", "from kvloop.engine.runner import compiled_step"
    first, second = (load, define) if library_first else (define, load)
    script = LOAD_ORDER.format(first=first, second=second)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
