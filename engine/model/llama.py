"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2) in plain torch over a paged KV cache; the model
registry (registry.py) maps those architectures' names here. Attention goes through the backend the
registry in engine/kernels/backend.py hands out (write_kv and forward per layer).

Weights are fused where it saves ops per step (q/k/v into one matrix, gate/up into one). The model is a
plain object rather than nn.Module: a step is a straight sequence of tensor ops with no hooks."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from kvloop.engine.kernels.attention_meta import AttentionMetadata
from kvloop.engine.kernels.backend import LayerFn, get_backend
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.linear import Linear
from kvloop.engine.model.zeroed import zeros


class Layer:
    def __init__(self, w: Mapping[str, torch.Tensor], prefix: str, cfg: ModelConfig, dtype, device,
                 quant: str):
        def get(name: str) -> torch.Tensor:
            # Dense weights go to the model's dtype and device as they are read, so fusing q/k/v and
            # gate/up never holds more than one float32 tensor (a cast is elementwise: converting the
            # parts or their concatenation gives the same bits). Quantized formats quantize from float32.
            t = w[prefix + name]
            return t.to(device=device, dtype=dtype) if quant == "none" else t

        def linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
            return Linear(weight, bias, dtype, device, quant)

        attn = "self_attn."
        qkv_bias = None
        if cfg.attention_bias and prefix + attn + "q_proj.bias" in w:
            qkv_bias = torch.cat([get(attn + "q_proj.bias"), get(attn + "k_proj.bias"),
                                  get(attn + "v_proj.bias")])
        self.qkv = linear(torch.cat([get(attn + "q_proj.weight"), get(attn + "k_proj.weight"),
                                     get(attn + "v_proj.weight")]), qkv_bias)
        self.o = linear(get(attn + "o_proj.weight"))
        self.gate_up = linear(torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]))
        self.down = linear(get("mlp.down_proj.weight"))
        self.attn_norm = get("input_layernorm.weight").to(device=device, dtype=dtype)
        self.ffn_norm = get("post_attention_layernorm.weight").to(device=device, dtype=dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op; same result in fp32
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class LlamaModel:
    # What loading converts from the checkpoint (dequantized, fused, packed): all a weight cache keeps and
    # hands back as `converted` (model/weight_cache.py); everything else is rebuilt from the config.
    CONVERTED = ("embed", "lm_head", "norm", "layers")
    CONVERTED_TYPES = (Layer, Linear)  # the classes those hold besides tensors

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", attention_backend: str = "auto",
                 quantization: str = "none",
                 converted: Mapping[str, object] | None = None):
        self.cfg, self.dtype, self.device = cfg, dtype, torch.device(device)
        self.attention = get_backend(attention_backend, self.device)  # raises if it cannot run on the device
        self.quantization = quantization
        if converted is None:
            self._convert(weights)
        else:
            for name in self.CONVERTED:
                setattr(self, name, converted[name])
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2,
                                                          dtype=torch.float32) / cfg.head_dim))
        freqs = torch.arange(cfg.max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.rope_cos = freqs.cos().to(self.device)  # [max_pos, hd/2], fp32
        self.rope_sin = freqs.sin().to(self.device)
        self.scale = cfg.head_dim ** -0.5

    def _convert(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Sets the CONVERTED attributes from the checkpoint's float32 weights."""
        cfg, dtype, quantization = self.cfg, self.dtype, self.quantization
        embed = weights["model.embed_tokens.weight"]
        self.embed = embed.to(device=self.device, dtype=dtype).contiguous()
        lm_head = None if cfg.tie_embeddings else weights.get("lm_head.weight")
        # Tied and dense: the head shares the converted embedding (no second copy, same values).
        head = lm_head if lm_head is not None else (self.embed if quantization == "none" else embed)
        self.lm_head = Linear(head, None, dtype, self.device, quantization)
        # packed-only weights (bf16, int8): look the embedding
        if lm_head is None and self.lm_head.weight is None:
            self.embed = self.lm_head  # up in the packed head it is tied to (Linear[ids]), no second copy
        del embed, lm_head, head  # the float32 originals are not kept while the layers load
        self.norm = weights["model.norm.weight"].to(self.device, dtype)
        self.layers = [Layer(weights, f"model.layers.{i}.", cfg, dtype, self.device, quantization)
                       for i in range(cfg.num_layers)]

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE on [N, heads, hd], computed in fp32 and cast back."""
        half = x.shape[-1] // 2
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor) -> torch.Tensor:
        """One flattened step: input_ids/positions [N] → final hidden states [N, hidden]."""
        return self.layers_forward(input_ids, positions, self.bind_attention(meta, kv_cache))

    def bind_attention(self, meta: AttentionMetadata, kv_cache: torch.Tensor) -> LayerFn:
        """The step's attention, attend(layer, q, k, v): the step's new K/V into the layer's pages, then q
        over them → [N, heads, hd]. Bound once per step, so the backend prepares what
        every layer shares once."""
        return self.attention.bind(kv_cache, meta, self.scale)

    def layers_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       attend: LayerFn) -> torch.Tensor:
        """The step's tensor ops, with each layer's attention delegated to attend(layer, q, k, v): no metadata
        in here, so the compiled step (runner/compiled_step.py) traces this with
        attention as one opaque op."""
        cfg = self.cfg
        n = input_ids.shape[0]
        cos = self.rope_cos[positions][:, None, :]
        sin = self.rope_sin[positions][:, None, :]
        x = self.embed[input_ids]
        q_size, kv_size = cfg.q_size, cfg.kv_size
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
            qkv = layer.qkv(h)
            # q and k heads sit side by side in the fused projection: rotate them in one go
            qk = self.rotary(qkv[:, : q_size + kv_size].view(n, cfg.num_heads + cfg.num_kv_heads,
                                                             cfg.head_dim),
                             cos, sin)
            q, k = qk[:, : cfg.num_heads], qk[:, cfg.num_heads :]
            v = qkv[:, q_size + kv_size :].view(n, cfg.num_kv_heads, cfg.head_dim)
            attn = attend(i, q, k, v)
            x = x + layer.o(attn.reshape(n, q_size))
            h = rms_norm(x, layer.ffn_norm, cfg.rms_eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return rms_norm(x, self.norm, cfg.rms_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def new_kv_cache(self, num_blocks: int, block_size: int,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
        """dtype: the KV storage dtype (default: the model's); a narrower one is converted on read."""
        cfg = self.cfg
        shape = (cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        return zeros(shape, dtype or self.dtype, self.device)  # KV pages start zeroed, never with stale data
