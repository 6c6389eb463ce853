"""Model architectures by name, and the class that runs each.

Names are what a checkpoint says it is: config.json's "architectures" (Hugging Face) or GGUF's
general.architecture; ModelConfig.architecture carries it from the loader to build_model. A new
architecture is its model module and one register_model line at the bottom of this file (plus its
weight names in the loaders, when they differ from Llama's). Model modules are imported only when a
model is built, so the names are known without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    from kvloop.engine.model.config import ModelConfig

# model_class(cfg, weights, dtype, device, attention_backend, quantization) -> a model with the
# LlamaModel surface: cfg, device, dtype, forward(ids, positions, meta, kv_cache), logits, new_kv_cache.
ModelClass = Callable[..., Any]
Format = Literal["hf", "gguf"]

_BY_FORMAT: dict[str, dict[str, ModelClass | str]] = {"hf": {}, "gguf": {}}


def register_model(model_class: ModelClass | str, hf: tuple[str, ...] = (),
                   gguf: tuple[str, ...] = ()) -> None:
    """model_class: the class (or "module:attribute", imported when first built); hf / gguf: the
    architecture names it runs in each checkpoint format."""
    for fmt, names in (("hf", hf), ("gguf", gguf)):
        for name in names:
            if name in _BY_FORMAT[fmt]:
                raise ValueError(f"architecture {name!r} is already registered")
            _BY_FORMAT[fmt][name] = model_class


def architectures(fmt: Format | None = None) -> tuple[str, ...]:
    """The known names, of one checkpoint format or of both."""
    formats = (fmt,) if fmt else ("hf", "gguf")
    return tuple(name for f in formats for name in _BY_FORMAT[f])


def model_class(architecture: str) -> ModelClass:
    for names in _BY_FORMAT.values():
        if architecture in names:
            target = names[architecture]
            if isinstance(target, str):
                module, _, attr = target.partition(":")
                target = getattr(importlib.import_module(module), attr)
            return target
    raise ValueError(f"unknown model architecture {architecture!r}; known: {', '.join(architectures())}")


def build_model(cfg: ModelConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device | str = "cpu", attention_backend: str = "auto",
                quantization: str = "none",
                cache_fingerprint: str | None = None):
    """The model for cfg.architecture, its weights loaded (see LlamaModel for the arguments). With
    cache_fingerprint (the checkpoint's), the converted weights go through the disk cache (weight_cache.py)
    when the model class supports it."""
    cls = model_class(cfg.architecture)
    if cache_fingerprint and hasattr(cls, "CONVERTED"):
        from kvloop.engine.model.weight_cache import build_cached

        return build_cached(cls, cache_fingerprint, cfg, weights, dtype, device, attention_backend,
                            quantization)
    return cls(cfg, weights, dtype, device, attention_backend, quantization)


register_model("kvloop.engine.model.llama:LlamaModel", hf=("LlamaForCausalLM", "MistralForCausalLM",
                                                          "Qwen2ForCausalLM"),
               gguf=("llama", "mistral", "qwen2"))
