"""Hugging Face directory → Checkpoint: config.json, *.safetensors, tokenizer.json, tokenizer_config.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from kvloop.engine.model.checkpoint import Checkpoint, LazyWeights
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.registry import architectures

SUPPORTED_ARCHS = architectures("hf")  # engine/model/registry.py
_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def load_hf_dir(path: Path, progress: bool = True) -> Checkpoint:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    raw_cfg = json.loads(cfg_file.read_text())
    if not raw_cfg.get("architectures") and raw_cfg.get("model_type") in _BY_MODEL_TYPE:
        raw_cfg["architectures"] = [_BY_MODEL_TYPE[raw_cfg["model_type"]]]
    arch = (raw_cfg.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHS}")
    config = ModelConfig.from_hf_config(raw_cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors files (pickle checkpoints are not loaded)")
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
    where: dict[str, Path] = {}
    for file in tqdm(files, desc=f"hashing {path.name}", unit="file", disable=not progress, leave=False):
        with safe_open(str(file), framework="pt") as f:
            for key in sorted(f.keys()):
                t = f.get_tensor(key)  # one tensor at a time, in its stored dtype
                digest.update(f"{key}:{t.dtype}:{list(t.shape)}".encode())
                digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
                where[key] = file
    tok_cfg_file = path / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_file.read_text()) if tok_cfg_file.is_file() else {}
    gen_cfg_file = path / "generation_config.json"
    gen_cfg = json.loads(gen_cfg_file.read_text()) if gen_cfg_file.is_file() else {}
    eos = gen_cfg.get("eos_token_id", raw_cfg.get("eos_token_id"))
    tokenizer_source = {
        "kind": "hf",
        "tokenizer_json": str(path / "tokenizer.json"),
        "chat_template": tok_cfg.get("chat_template") or _chat_template_file(path),
        "eos_token": tok_cfg.get("eos_token"),
        "eos_token_id": eos,
        "bos_token": tok_cfg.get("bos_token"),
        "add_bos_token": bool(tok_cfg.get("add_bos_token", False)),
    }
    if config.tie_embeddings:
        where.pop("lm_head.weight", None)
    weights = LazyWeights(list(where), lambda key: _read_tensor(where[key], key))
    return Checkpoint(config, weights, digest.hexdigest()[:32], path, path.name, tokenizer_source)


def _read_tensor(file: Path, key: str) -> torch.Tensor:
    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor(key).float()


def _chat_template_file(path: Path) -> str | None:
    jinja = path / "chat_template.jinja"
    return jinja.read_text() if jinja.is_file() else None
