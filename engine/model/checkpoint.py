"""What a loader hands to the model: the config, HF-named float32 weights, and the weights' identity.

The weights are a lazy mapping: a tensor is read from the file (and dequantized to float32) only when
the model asks for it, and nothing keeps it afterwards. The model converts each one to its dtype and
device as it arrives, so loading holds about one float32 tensor on the host beside the model itself,
never the whole model in float32 (32 GB for an 8B model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvloop.engine.model.config import ModelConfig


class LazyWeights(Mapping[str, torch.Tensor]):
    """Name → float32 tensor, each read from the file on access (a fresh tensor every time)."""

    def __init__(self, names: list[str], read: Callable[[str], torch.Tensor]):
        self._names = list(names)
        self._known = set(self._names)
        self._read = read

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        return self._read(name)

    def __contains__(self, name: object) -> bool:  # Mapping's default would read the tensor
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass
class Checkpoint:
    config: ModelConfig
    weights: Mapping[str, torch.Tensor]  # Hugging Face Llama names, float32, q/k in HF (rotate-half) layout
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
