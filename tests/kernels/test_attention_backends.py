"""The attention backends behind one interface (engine/kernels/backend.py): each registered backend computes
a whole mixed step (decode rows, some in cascade groups, beside prefill chunks over a cached prefix) as the
float64 reference does; a backend that brings only its decode composes with another; and the registry
refuses what cannot run instead of falling back (Triton on a CPU without the interpreter, unknown names)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_ref import DTYPES, TOL, new_generator

from kvloop.engine.cascade.plan import build_plan
from kvloop.engine.kernels import reference
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.kernels.backend import (
    WithDecode,
    available_backends,
    backend_choices,
    get_backend,
    register_backend,
    resolve_backend_name,
)

BS, N_KV, HEADS, HD = 16, 2, 6, 32
SCALE = HD**-0.5
# (query dtype, KV cache dtype): the model's dtype, and 16-bit KV under an fp32 model
DTYPE_CASES = {"fp32": ("fp32", "fp32"), "bf16_kv": ("fp32", "bf16"), "bf16": ("bf16", "bf16")}


class Step:
    """A mixed step over a paged cache: four decode rows (three share a two-block document, two of those
    one more block), then a chunk of 9 new tokens over a 20-token cached prefix and a fresh 17-token one."""

    def __init__(self, gen: torch.Generator, q_dtype: torch.dtype, kv_dtype: torch.dtype, cascade: bool):
        shape = (40, BS, N_KV, HD)
        self.k_cache = torch.randn(shape, generator=gen, dtype=torch.float64).to(kv_dtype)
        self.v_cache = torch.randn(shape, generator=gen, dtype=torch.float64).to(kv_dtype)
        free = iter((torch.randperm(39, generator=gen) + 1).tolist())  # block 0: table padding only

        def take(n: int) -> list[int]:
            return [next(free) for _ in range(n)]

        doc, more = take(2), take(1)
        self.tables = [doc + more + take(1), doc + more + take(1), doc + take(1), take(3)]
        self.lens = [50, 61, 40, 37]
        self.chunks = [(20, 9, take(2)), (0, 17, take(2))]  # (cached tokens, new tokens, blocks)
        self.plan = build_plan(self.tables, self.lens, BS, lambda members,
                               tokens: members > 1) if cascade else None
        if cascade:
            assert self.plan is not None and sorted(len(g.rows) for g in self.plan.groups) == [2, 3]
        rows = len(self.lens) + sum(n for _, n, _ in self.chunks)
        self.q = torch.randn(rows, HEADS, HD, generator=gen).to(q_dtype)

    def meta(self) -> AttentionMetadata:
        """A fresh one per call: backends cache per-step work inside it."""
        width = max(len(t) for t in self.tables)
        prefills, start = [], len(self.lens)
        for cached, new, blocks in self.chunks:
            prefills.append(PrefillChunk(start, new, cached + new, torch.tensor(blocks)))
            start += new
        return AttentionMetadata(
            slot_mapping=torch.zeros(start, dtype=torch.long), num_decode=len(self.lens),
            decode_block_tables=torch.tensor([t + [0] * (width - len(t)) for t in self.tables]),
            decode_context_lens=torch.tensor(self.lens), prefills=prefills, max_decode_context=max(self.lens),
            cascade=self.plan,
        )


@pytest.mark.parametrize("cascade", [False, True], ids=["plain", "cascade"])
@pytest.mark.parametrize("dtypes", sorted(DTYPE_CASES))
@pytest.mark.parametrize("name", ["torch", "triton"])
def test_backend_forward_matches_reference(name, dtypes, cascade, launches):
    q_dtype, kv_dtype = (DTYPES[d] for d in DTYPE_CASES[dtypes])
    gen, seed = new_generator()
    step = Step(gen, q_dtype, kv_dtype, cascade)
    out = get_backend(name, "cpu").forward(step.q, step.k_cache, step.v_cache, step.meta(), SCALE)
    ref = reference.paged_step(step.q, step.k_cache, step.v_cache, step.meta(), SCALE)
    assert out.dtype == q_dtype and out.shape == step.q.shape
    atol, rtol = TOL[q_dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol, msg=lambda m: f"seed {seed}: {m}")
    if name == "triton":  # the kernels really ran: cascade for the decode rows beside extend, or one extend
        launches("cascade_shared", times=int(cascade))
        launches("extend")


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_backend_write_kv_matches_reference(name, launches):
    gen, _ = new_generator()
    k = torch.randn(7, N_KV, HD, generator=gen)
    v = torch.randn(7, N_KV, HD, generator=gen)
    slots = torch.tensor([17, 3, 0, 63, 40, 18, 5])
    meta = AttentionMetadata(slots, 0, torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    caches = [torch.zeros(4, BS, N_KV, HD, dtype=torch.bfloat16) for _ in range(4)]
    get_backend(name, "cpu").write_kv(k, v, caches[0], caches[1], meta)
    reference.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    launches("write_kv", times=int(name == "triton"))


def test_a_decode_only_backend_composes_with_torch():
    """What a backend with only its own decode kernel registers: its decode serves the decode rows of a
    mixed step, the torch backend's extend and K/V writes the rest."""
    gen, seed = new_generator()
    step = Step(gen, torch.float32, torch.float32, cascade=True)
    calls = []

    def decode(q, k_cache, v_cache, meta, scale):
        calls.append(q.shape[0])
        return reference.paged_decode(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                                      scale).to(q.dtype)

    backend = WithDecode("decode-only", decode, get_backend("torch", "cpu"))
    out = backend.forward(step.q, step.k_cache, step.v_cache, step.meta(), SCALE)
    assert calls == [len(step.lens)]
    ref = reference.paged_step(step.q, step.k_cache, step.v_cache, step.meta(), SCALE)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def cpu_kernel_built() -> bool:
    from kvloop.engine.kernels.cpu import build

    return build.load()


def test_registry_names_and_auto():
    built = cpu_kernel_built()
    assert backend_choices()[:4] == ("auto", "cpu", "torch", "triton")
    # on a CPU "auto" is the C++ kernel where it is built (make install builds it), else the torch path
    assert resolve_backend_name("auto", "cpu") == ("cpu" if built else "torch")
    assert resolve_backend_name("auto", torch.device("cuda")) == "triton"  # by device type; no GPU needed
    assert get_backend("auto", "cpu").name == ("cpu" if built else "torch")
    # triton only because the kernels are interpreted in this process
    assert available_backends("cpu") == (["cpu"] if built else []) + ["torch", "triton"]
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'.*'torch'"):
        get_backend("flash", "cpu")
    with pytest.raises(ValueError, match="already registered"):
        register_backend("torch", lambda device: None)


def test_auto_takes_the_first_default_that_runs(monkeypatch):
    """Several backends may be defaults for one device type: "auto" takes the first registered that can
    run there, so a CPU without the kernel's build gets the torch path, never an error."""
    from kvloop.engine.kernels import backend as registry

    monkeypatch.setattr(registry, "_REGISTRY", {})
    registry.register_backend("fast", lambda device: "fast", available=lambda device: False,
                              default_for=("cpu",))
    registry.register_backend("plain", lambda device: "plain", default_for=("cpu",))
    assert registry.resolve_backend_name("auto", "cpu") == "plain"
    with pytest.raises(ValueError, match=r"'fast' cannot run on cpu.*available there: \['plain'\]"):
        registry.get_backend("fast", "cpu")


NO_INTERPRETER = """
import torch
from kvloop.engine.kernels.backend import available_backends, get_backend
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights

from kvloop.engine.kernels.cpu import build as cpu_build
CPU = ["cpu"] if cpu_build.load() else []
assert available_backends("cpu") == CPU + ["torch"], available_backends("cpu")
assert get_backend("auto", "cpu").name == (CPU + ["torch"])[0]
for build in (lambda: get_backend("triton", "cpu"),
              lambda: LlamaModel(CFG, random_weights(CFG, 0), torch.float32, attention_backend="triton")):
    try:
        build()
    except ValueError as e:
        assert "TRITON_INTERPRET=1" in str(e) and f"available there: {CPU + ['torch']}" in str(e), e
    else:
        raise SystemExit("triton on a CPU without the interpreter did not raise")
from kvloop.engine.kernels import triton as tk
try:
    tk.paged_decode_attention(*[torch.zeros(1, 1, 1, 16)] * 3, torch.zeros(1, 1, dtype=torch.int32),
                              torch.ones(1, dtype=torch.int32), 1.0)
except RuntimeError as e:
    assert "TRITON_INTERPRET=1" in str(e), e
else:
    raise SystemExit("a Triton kernel ran on CPU tensors without the interpreter")
print("refused")
"""


def test_triton_on_cpu_without_interpreter_raises(tmp_path):
    """A fresh process without TRITON_INTERPRET (this one has it set before triton's import): asking for
    triton on the CPU is an error naming what is available, never the torch path in disguise."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cfg = ("CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, "
           "num_heads=2, num_kv_heads=1, head_dim=16)\n")
    code = NO_INTERPRETER.replace("\nassert available", "\n" + cfg + "assert available", 1)
    proc = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
