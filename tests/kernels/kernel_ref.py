"""Paged-cache builders, tolerances and checks for the kernel tests. The attention they are checked
against is the one torch reference, engine/kernels/reference.py (float64, over the unpaged K/V kept here).

Tolerances (atol, rtol), per dtype. Under the interpreter the kernels compute in fp32 from the same
dtype-rounded inputs the reference sees, so what remains is fp32 reassociation (online softmax, exp2,
split merge: ~1e-6) plus rounding the output to the dtype once: half an ulp is 2^-11 relative for fp16
and 2^-8 for bf16. Outputs are convex combinations of N(0, 1) values (|out| < ~4), so allowing about
two output ulps at the largest magnitudes gives the numbers below; a real indexing or masking error
is off by O(1).

The CPU linear kernels' tests (test_cpu_linear_*.py) share the helpers at the end: loading the kernel,
seeded inputs, the batch-invariance check, and the comparison of a model with stored weights against the
fp32 model over the same stored values.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

from kvloop.engine.kernels import reference
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.llama import LlamaModel

TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def new_generator() -> tuple[torch.Generator, int]:
    """Fresh inputs for every case; the seed is printed in failures (set KVLOOP_TEST_SEED to replay)."""
    seed = int(os.environ.get("KVLOOP_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    return torch.Generator().manual_seed(seed), seed


@contextlib.contextmanager
def poisoned_alloc() -> Iterator[None]:
    """Every torch.empty inside (the kernels' outputs and split-K workspaces) comes back NaN-filled, so
    an element a kernel forgets to write cannot pass by holding a stale correct value."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def bf16_probs_atol(kv_dtype: torch.dtype, values: torch.Tensor | list[torch.Tensor]) -> float | None:
    """The absolute tolerance of CPU attention outputs whose probabilities the blocked bf16 routine rounds to
    bf16 for the value product (prefill, and items stacking several rows' queries): each weight off by at most
    2^-9 relative, so the output by at most 2^-9 of the largest |value|, twice that allowed (NaN, a test
    cache's unwritten slots, is no value). None where that routine does not run (K/V
    not bf16, or not built)."""
    from kvloop.engine.kernels.cpu import build

    if kv_dtype != torch.bfloat16 or not build.blocked_bf16():
        return None
    parts = values if isinstance(values, list) else [values]
    return 2.0**-8 * max(v.float().nan_to_num(0.0).abs().max().item() for v in parts)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, seed: int) -> None:
    atol, rtol = TOL[dtype]
    assert out.dtype == dtype
    assert not out.isnan().any(), f"NaN in output (seed {seed})"
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=rtol,
                               msg=lambda m: f"seed {seed}: {m}")


@dataclass
class Paged:
    k_cache: torch.Tensor  # [num_blocks, block_size, n_kv, hd], unwritten slots NaN
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [S, max_blocks + 1], shuffled ids, padded with 0 (a NaN block)
    keys: list[torch.Tensor]  # per sequence [n, n_kv, hd] fp32, holding the dtype-rounded values
    values: list[torch.Tensor]


def make_paged(
    seq_lens: list[int], block_size: int, n_kv: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> Paged:
    """Contiguous per-sequence K/V scattered into randomly ordered pages. Block 0 is never used, so a
    kernel that follows a padding entry of the table reads NaN and fails loudly."""
    counts = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(counts) + 3
    ids = 1 + torch.randperm(num_blocks - 1, generator=gen)
    shape = (num_blocks, block_size, n_kv, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    tables = torch.zeros(len(seq_lens), max(counts, default=0) + 1, dtype=torch.int32)
    keys, values, used = [], [], 0
    for s, n in enumerate(seq_lens):
        k = torch.randn(n, n_kv, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, n_kv, head_dim, generator=gen).to(dtype)
        for j in range(counts[s]):
            blk = int(ids[used + j])
            tables[s, j] = blk
            chunk = slice(j * block_size, min(n, (j + 1) * block_size))
            k_cache[blk, : chunk.stop - chunk.start] = k[chunk]
            v_cache[blk, : chunk.stop - chunk.start] = v[chunk]
        used += counts[s]
        keys.append(k.float())
        values.append(v.float())
    return Paged(k_cache, v_cache, tables, keys, values)


def strided_rows(n: int, heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """[n, heads, head_dim] as a column slice of a wider fused-projection output (row stride larger than
    heads * head_dim), the way the runner hands q/k/v to the kernels."""
    wide = torch.randn(n, (heads + 5) * head_dim, generator=gen).to(dtype)
    return wide[:, 2 * head_dim : (heads + 2) * head_dim].view(n, heads, head_dim)


def cascade_ref(q: torch.Tensor, paged: Paged, scale: float) -> torch.Tensor:
    """What cascade attention must equal: each row's plain attention over its whole context, in float64."""
    return torch.cat([reference.attention(q[b : b + 1], paged.keys[b], paged.values[b], scale)
                      for b in range(q.shape[0])])


def make_cascade_paged(
    seq_lens: list[int], segments: list, block_size: int, n_kv: int, head_dim: int, dtype: torch.dtype,
    gen: torch.Generator,
) -> Paged:
    """Like make_paged, but the rows of each segment (objects with level, start, end, rows) hold equal K/V
    for its tokens. Pages are shared the way a prefix cache shares them: rows whose tokens in a block all
    come from the same owners (segments, or the row itself) point to one page; a block only partly in a
    segment (a prefix ending mid-block) is a separate page per row holding an equal copy of the shared
    tokens. Every page's unused slots stay NaN."""
    owner: dict[tuple[int, int], object] = {}  # (row, token) -> the deepest segment holding it (hashable)
    for seg in sorted(segments, key=lambda s: s.level):
        for r in seg.rows:
            for t in range(seg.start, seg.end):
                owner[(r, t)] = seg
    values_of: dict[tuple[int, object], tuple[torch.Tensor, torch.Tensor]] = {}

    def kv(r: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (t, owner.get((r, t), ("own", r)))
        if key not in values_of:
            pair = torch.randn(2, n_kv, head_dim, generator=gen).to(dtype)
            values_of[key] = (pair[0], pair[1])
        return values_of[key]

    pages: dict[tuple, int] = {}  # identity of a page's contents -> page id (0 is never used)
    tables = torch.zeros(len(seq_lens), max((-(-n // block_size) for n in seq_lens), default=0) + 1,
                         dtype=torch.int32)
    for r, n in enumerate(seq_lens):
        for j in range(-(-n // block_size)):
            tokens = range(j * block_size, min(n, (j + 1) * block_size))
            ident = (j, tuple(owner.get((r, t), ("own", r)) for t in tokens))
            tables[r, j] = pages.setdefault(ident, len(pages) + 1)
    num_blocks = len(pages) + 4
    ids = torch.cat([torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(num_blocks - 1, generator=gen)])
    tables = ids[tables.long()].to(torch.int32)  # shuffled page order; padding stays 0
    shape = (num_blocks, block_size, n_kv, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    keys, values = [], []
    for r, n in enumerate(seq_lens):
        pairs = [kv(r, t) for t in range(n)]
        k = torch.stack([p[0] for p in pairs]) if pairs else torch.zeros(0, n_kv, head_dim, dtype=dtype)
        v = torch.stack([p[1] for p in pairs]) if pairs else torch.zeros(0, n_kv, head_dim, dtype=dtype)
        for t in range(n):
            k_cache[tables[r, t // block_size], t % block_size] = k[t]
            v_cache[tables[r, t // block_size], t % block_size] = v[t]
        keys.append(k.float())
        values.append(v.float())
    return Paged(k_cache, v_cache, tables, keys, values)


# ---- the CPU linear kernels ------------------------------------------------------------------------------


def load_attention_kernel() -> None:
    """Builds (once) and loads the CPU attention kernel, or skips the calling module's tests where there is no
    C++ toolchain; a build that fails with one is a failure."""
    import shutil

    from kvloop.engine.kernels.cpu import build

    if not build.load(build=True):
        if shutil.which("c++") is None or shutil.which("ninja") is None:
            pytest.skip(f"no C++ toolchain here: {build.unavailable_reason()}")
        pytest.fail(f"the CPU kernel did not build: {build.unavailable_reason()}")


def load_linear_kernel(kernel: ModuleType) -> None:
    """Builds (once) and loads a CPU linear kernel (kvloop.engine.kernels.cpu.linear_*), or skips the calling
    module's tests without one; one torch thread."""
    from kvloop.engine.kernels.cpu import build

    if not build.load(kernel.KERNEL, build=True):
        pytest.skip(f"CPU kernel {kernel.KERNEL} unavailable: {build.unavailable_reason(kernel.KERNEL)}")
    assert kernel.available()
    torch.set_num_threads(1)


def linear_case(m: int, n: int, k: int, with_bias: bool,
                seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """N(0, 1) weights [n, k], inputs [m, k] and, with_bias, a bias [n]; seeded by the shape unless given."""
    gen = torch.Generator().manual_seed(m * 1000 + n + k if seed is None else seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    return w, x, torch.randn(n, generator=gen) if with_bias else None


def assert_batch_invariant(linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Each row of x gives the same bits alone, in a slice of the batch (rows 5-11) and in the whole batch."""
    whole = linear(x)
    for i in range(x.shape[0]):
        assert torch.equal(linear(x[i : i + 1])[0], whole[i])
    assert torch.equal(linear(x[5:12]), whole[5:12])


class StoredWeights(Mapping):
    """A checkpoint's weights with those a weight format stores (names ending in `suffixes`) replaced by the
    values it stores, as fp32 (`stored`): the fp32 reference model over the same weights."""

    def __init__(self, weights: Mapping[str, torch.Tensor], suffixes: tuple[str, ...],
                 stored: Callable[[torch.Tensor], torch.Tensor]):
        self.weights, self.suffixes, self.stored = weights, suffixes, stored

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.weights[name]
        return self.stored(t) if name.endswith(self.suffixes) else t

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def stored_weight_models(checkpoint, quantization: str, suffixes: tuple[str, ...],
                         stored: Callable[[torch.Tensor], torch.Tensor]) -> tuple[LlamaModel, LlamaModel]:
    """The fp32 model with `quantization` weights, and the fp32 model over the same stored values."""
    ours = LlamaModel(checkpoint.config, checkpoint.weights, torch.float32, quantization=quantization)
    reference_model = LlamaModel(checkpoint.config, StoredWeights(checkpoint.weights, suffixes, stored),
                                 torch.float32)
    return ours, reference_model


PROMPT = [1, 504, 3458, 282, 4649, 314, 1345, 253, 2214, 30, 378, 3112]


def prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """The logits of every position of `ids`, prefilled as one chunk."""
    kv = model.new_kv_cache(4, 16)
    chunk = PrefillChunk(0, len(ids), len(ids), torch.arange(1))
    meta = AttentionMetadata(torch.arange(len(ids)), 0, torch.zeros(0, 1, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), [chunk])
    return model.logits(model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, kv))


def assert_logits_match(ours: LlamaModel, reference_model: LlamaModel) -> None:
    """A model with stored weights against the fp32 model over the same stored values: the same embedding rows
    (bitwise), PROMPT's logits within 1e-3, the same argmax."""
    ids = torch.tensor(PROMPT)
    if ours.cfg.tie_embeddings:  # looked up in the packed head: the same stored values, bitwise
        assert isinstance(ours.embed, Linear)
    assert torch.equal(ours.embed[ids], reference_model.embed[ids])
    a, b = prompt_logits(ours, PROMPT), prompt_logits(reference_model, PROMPT)
    # 30 layers of fp32 sums taken in another order (the int8 scale applied after them): measured 9e-5 with
    # bf16 weights on logits of magnitude up to 31
    assert (a - b).abs().max().item() <= 1e-3
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def assert_greedy_tokens_match(ours: LlamaModel, reference_model: LlamaModel, checkpoint) -> None:
    """Engines over the two models generate the same 8 greedy tokens after PROMPT."""
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.core.sampling import SamplingParams
    from kvloop.engine.engine_core import EngineCore

    def greedy(model: LlamaModel) -> list[int]:
        engine = EngineCore(EngineConfig(dtype="float32", progress=False, kv_cache_tokens=256), model=model,
                            fingerprint=checkpoint.fingerprint, model_name=checkpoint.name)
        engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        return engine.drain(max_steps=50)["r"].token_ids

    assert greedy(ours) == greedy(reference_model)
