"""GGUF → Checkpoint. Reads the header with gguf_file.py (the gguf package's reader took ~10 s of a start-up
on SmolLM2's tokenizer arrays), dequantizes every supported type with the `gguf` package and undoes
llama.cpp's per-head row permutation of the q/k projections (it interleaves rotary
pairs; we use rotate-half)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from gguf.quants import dequantize
from tqdm import tqdm

from kvloop.engine.model.checkpoint import Checkpoint, LazyWeights
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.gguf_file import GGUFFile
from kvloop.engine.model.registry import architectures

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
SUPPORTED_ARCHS = architectures("gguf")  # engine/model/registry.py


def field_value(reader: GGUFFile, key: str, default=None):
    """One metadata value as a Python object (str, int, float, bool or list)."""
    return reader.fields.get(key, default)


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _config(reader: GGUFFile) -> ModelConfig:
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {SUPPORTED_ARCHS}")

    def get(key: str, default=None):
        return field_value(reader, f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = get("vocab_size") or len(field_value(reader, "tokenizer.ggml.tokens", []))
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        max_position=int(get("context_length", 4096)),
        attention_bias="blk.0.attn_q.bias" in names,
        architecture=arch,
    )


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    _, layer, kind, suffix = gguf_name.split(".")
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"


def _read_tensor(t, config: ModelConfig) -> torch.Tensor:
    """One GGUF tensor as HF-layout float32 (dequantized; q/k rows un-permuted for llama/mistral)."""
    llama_permuted = config.architecture in ("llama", "mistral")  # llama.cpp permutes q/k only for these
    w = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
    if llama_permuted and ".attn_q." in t.name:
        w = (unpermute_rotary(w, config.num_heads) if w.ndim == 2
             else unpermute_rotary(w[:, None], config.num_heads)[:, 0])
    elif llama_permuted and ".attn_k." in t.name:
        w = (unpermute_rotary(w, config.num_kv_heads) if w.ndim == 2
             else unpermute_rotary(w[:, None], config.num_kv_heads)[:, 0])
    return torch.from_numpy(np.array(w, dtype=np.float32, order="C"))


def load_gguf(path: Path, progress: bool = True) -> Checkpoint:
    reader = GGUFFile(path)  # memory-maps the file: tensors are read when the model asks
    config = _config(reader)
    digest = hashlib.sha256()
    by_name = {}
    for t in tqdm(reader.tensors, desc=f"hashing {path.name}", unit="tensor", disable=not progress,
                  leave=False):
        digest.update(f"{t.name}:{t.tensor_type.name}:{list(t.shape)}".encode())
        digest.update(np.asarray(t.data).tobytes())
        by_name[_hf_name(t.name)] = t
    weights = LazyWeights(list(by_name), lambda name: _read_tensor(by_name[name], config))
    tokenizer_source = {
        "kind": "gguf",
        "model": field_value(reader, "tokenizer.ggml.model"),
        "pre": field_value(reader, "tokenizer.ggml.pre"),
        "tokens": field_value(reader, "tokenizer.ggml.tokens"),
        "token_types": field_value(reader, "tokenizer.ggml.token_type"),
        "merges": field_value(reader, "tokenizer.ggml.merges"),
        "bos_token_id": field_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field_value(reader, "tokenizer.ggml.eos_token_id"),
        "add_bos_token": field_value(reader, "tokenizer.ggml.add_bos_token", False),
        "chat_template": field_value(reader, "tokenizer.chat_template"),
    }
    name = field_value(reader, "general.name") or path.stem
    return Checkpoint(config, weights, digest.hexdigest()[:32], path, name, tokenizer_source)
