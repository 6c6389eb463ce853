"""One interface for attention over the paged KV cache, and the registry that picks a backend by name.

Per layer the model calls `write_kv` (the step's new K/V into the pages) and `forward` (the step's
attention, decode rows first, then the prefill chunks, as AttentionMetadata lays them out). A backend
implements `decode` and `extend`; `forward` composes them unless the backend has a whole-step path.

A new backend is one module (an AttentionBackend subclass, or a factory) and one `register_backend`
line at the bottom of this file. The module is imported only when its backend is asked for, so the
names (the CLI's choices) are known without importing torch or triton. A backend that brings only a
decode kernel takes the rest from another by composition:

    # engine/kernels/mine.py
    def create(device): return WithDecode("mine", my_decode, get_backend("torch", device))
    # here
    register_backend("mine", "kvloop.engine.kernels.mine:create", available="kvloop.engine.kernels.mine:ok")

Asking for an unknown backend, or one that cannot run on the device, is an error naming those that can:
never a silent fallback. "auto" is the device type's default (triton on CUDA; on a CPU the C++ kernel where it
is built, else torch). This module imports neither torch nor triton (the CLI and the
config read the names)."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kvloop.engine.kernels.attention_meta import AttentionMetadata

AUTO = "auto"


class AttentionBackend(ABC):
    """Attention over a paged cache: k_cache / v_cache [num_blocks, block_size, kv_heads, head_dim] for one
    layer; q [rows, heads, head_dim] with heads a multiple of kv_heads (grouped-query attention). Outputs
    have q's dtype; the caches may be narrower (16-bit KV under an fp32 model)."""

    name: str = ""

    def cost_name(self, head_dim: int, query_dtype: torch.dtype, block_size: int) -> str:
        """The name its decode trade-off is measured under (cascade/cost.py) for a model of this head_dim
        computing in query_dtype over blocks of block_size tokens: the backend's, or a variant of it where its
        kernel takes another code path on this CPU."""
        return self.name

    @abstractmethod
    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """k, v [N, kv_heads, head_dim]: the step's new K/V, stored in place at meta.slot_mapping."""

    @abstractmethod
    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        """The decode rows, q [num_decode, heads, hd] → the same shape, each over its
        meta.decode_context_lens tokens through meta.decode_block_tables. meta.cascade, when set, groups
        rows that share a prefix; a backend may ignore it (same result, more bytes read)."""

    @abstractmethod
    def extend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        """The prefill rows, q [N - num_decode, heads, hd] (meta.prefills in order; a chunk's q_start counts
        from the step's first row, decode rows included) → the same shape: each chunk's queries are the
        last q_len of its seq_len tokens, causal over its cached prefix and themselves."""

    def layer(self, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
              meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Layer `index` of a step over the whole cache, kv_cache [layers, 2, blocks, block_size, kv_heads,
        head_dim]: the step's new K/V into the layer's pages, then forward. A backend may do both at once."""
        k_cache, v_cache = kv_cache[index, 0], kv_cache[index, 1]
        self.write_kv(k, v.contiguous(), k_cache, v_cache, meta)
        return self.forward(q, k_cache, v_cache, meta, scale)

    def bind(self, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> LayerFn:
        """One step's layer(index, q, k, v) = self.layer(index, q, k, v, kv_cache, meta, scale); the model
        binds once per step, so a backend may prepare here what every layer of the step shares."""
        return lambda index, q, k, v: self.layer(index, q, k, v, kv_cache, meta, scale)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
        """The whole step, q [N, heads, hd] → [N, heads, hd]: decode rows, then prefill rows."""
        n = meta.num_decode
        if not meta.prefills:
            return self.decode(q, k_cache, v_cache, meta, scale)
        if not n:
            return self.extend(q, k_cache, v_cache, meta, scale)
        out = q.new_empty(q.shape)
        out[:n] = self.decode(q[:n], k_cache, v_cache, meta, scale)
        out[n:] = self.extend(q[n:], k_cache, v_cache, meta, scale)
        return out


DecodeFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor", "AttentionMetadata", float],
                    "torch.Tensor"]
# a bound step's layer
LayerFn = Callable[[int, "torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


class WithDecode(AttentionBackend):
    """`base` with another decode: a backend that brings only a decode kernel (K/V writes and prefill stay
    the base's). forward is the composition, so the new decode serves mixed steps too."""

    def __init__(self, name: str, decode: DecodeFn, base: AttentionBackend):
        self.name, self._decode, self.base = name, decode, base

    def write_kv(self, k, v, k_cache, v_cache, meta) -> None:
        self.base.write_kv(k, v, k_cache, v_cache, meta)

    def decode(self, q, k_cache, v_cache, meta, scale):
        return self._decode(q, k_cache, v_cache, meta, scale)

    def extend(self, q, k_cache, v_cache, meta, scale):
        return self.base.extend(q, k_cache, v_cache, meta, scale)


Factory = Callable[["torch.device"], AttentionBackend]
Available = Callable[["torch.device"], bool]


@dataclass(frozen=True)
class _Entry:
    factory: Factory | str  # a callable, or "module:attribute" imported when first asked for
    available: Available | str | None  # None: runs on every device
    requires: str  # what it needs, said when it cannot run
    default_for: tuple[str, ...]  # device types for which "auto" picks it


_REGISTRY: dict[str, _Entry] = {}


def register_backend(name: str, factory: Factory | str, available: Available | str | None = None,
                     requires: str = "", default_for: tuple[str, ...] = ()) -> None:
    """factory(device) -> AttentionBackend; available(device) -> bool. Either may be a "module:attribute"
    path, imported on first use. default_for: the device types ("cpu", "cuda") for which "auto" may pick
    it; several may claim one type: "auto" takes the first registered that can run there."""
    if name == AUTO or name in _REGISTRY:
        raise ValueError(f"attention backend {name!r} is already registered")
    _REGISTRY[name] = _Entry(factory, available, requires, tuple(default_for))


def backend_choices() -> tuple[str, ...]:
    """What the CLI and the config accept: "auto" and every registered name."""
    return (AUTO, *_REGISTRY)


def _load(target):
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _runs_on(entry: _Entry, device: torch.device) -> bool:
    return entry.available is None or bool(_load(entry.available)(device))


def available_backends(device: torch.device | str) -> list[str]:
    device = _as_device(device)
    return [name for name, entry in _REGISTRY.items() if _runs_on(entry, device)]


def resolve_backend_name(name: str, device: torch.device | str) -> str:
    """The registered name `name` stands for on `device` ("auto": the device type's default)."""
    device = _as_device(device)
    if name == AUTO:
        # in registration order, the first default that can run here (the CPU kernel when it is built)
        defaults = [n for n, e in _REGISTRY.items() if device.type in e.default_for and _runs_on(e, device)]
        if not defaults:
            raise ValueError(f"no default attention backend for {device.type} devices; choose one of "
                             f"{available_backends(device)}")
        return defaults[0]
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; registered: {list(_REGISTRY)}, on {device}: "
                         f"{available_backends(device)}")
    return name


def get_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """The backend `name` ("auto" or a registered name) for tensors on `device`; an error when it cannot
    run there, never another backend in its place."""
    device = _as_device(device)
    resolved = resolve_backend_name(name, device)
    entry = _REGISTRY[resolved]
    if not _runs_on(entry, device):
        need = f" (it needs {entry.requires})" if entry.requires else ""
        raise ValueError(f"attention backend {resolved!r} cannot run on {device}{need}; available there: "
                         f"{available_backends(device)}")
    return _load(entry.factory)(device)


def _as_device(device: torch.device | str) -> torch.device:
    import torch

    return torch.device(device)


# The built-in backends (their modules are imported when asked for). On a CPU, "auto" is the C++ kernel
# where it was built at install time, else the torch path.
register_backend("cpu", "kvloop.engine.kernels.cpu.backend:create",
                 available="kvloop.engine.kernels.cpu.backend:available", default_for=("cpu",),
                 requires="a CPU and the CPU kernel built (python -m kvloop.engine.kernels.cpu.build)")
register_backend("torch", "kvloop.engine.kernels.torch_backend:TorchBackend", default_for=("cpu",))
register_backend("triton", "kvloop.engine.kernels.triton_backend:TritonBackend",
                 available="kvloop.engine.kernels.triton_backend:runnable", default_for=("cuda",),
                 requires="a CUDA device, or TRITON_INTERPRET=1 set before triton is first imported")
