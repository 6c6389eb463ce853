"""Random weights of a given shape (benchmarks, kernel checks), named like a Hugging Face checkpoint."""

from __future__ import annotations

import torch

from kvloop.engine.model.config import ModelConfig


def random_weights(cfg: ModelConfig, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    h, i = cfg.hidden_size, cfg.intermediate_size
    w = {"model.embed_tokens.weight": rand(cfg.vocab_size, h), "model.norm.weight": torch.ones(h)}
    if not cfg.tie_embeddings:
        w["lm_head.weight"] = rand(cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        w[p + "self_attn.q_proj.weight"] = rand(cfg.q_size, h)
        w[p + "self_attn.k_proj.weight"] = rand(cfg.kv_size, h)
        w[p + "self_attn.v_proj.weight"] = rand(cfg.kv_size, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, cfg.q_size)
        w[p + "mlp.gate_proj.weight"] = rand(i, h)
        w[p + "mlp.up_proj.weight"] = rand(i, h)
        w[p + "mlp.down_proj.weight"] = rand(h, i)
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        if cfg.attention_bias:
            for name, size in (("q", cfg.q_size), ("k", cfg.kv_size), ("v", cfg.kv_size)):
                w[p + f"self_attn.{name}_proj.bias"] = rand(size)
    return w
