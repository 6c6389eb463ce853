"""What a loader hands to the model: the config, HF-named float32 weights, and the weights' identity."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from kvloop.engine.model.config import ModelConfig


@dataclass
class Checkpoint:
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # Hugging Face Llama names, float32, q/k in HF (rotate-half) layout
    fingerprint: str  # stable hash of the weights' identity; part of every KV cache key
    path: Path
    name: str
    tokenizer_source: dict = field(default_factory=dict)  # what the tokenizer module needs


def load_checkpoint(path: Path, progress: bool = True) -> Checkpoint:
    """A `.gguf` file or a Hugging Face directory (config.json + *.safetensors). No pickle checkpoints."""
    if path.is_dir():
        from kvloop.engine.model.hf_loader import load_hf_dir

        return load_hf_dir(path, progress=progress)
    if path.suffix == ".gguf":
        from kvloop.engine.model.gguf_loader import load_gguf

        return load_gguf(path, progress=progress)
    raise ValueError(f"unsupported model file {path}: expected a .gguf file or a Hugging Face directory")
