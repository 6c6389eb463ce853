"""Writes a synthetic Llama checkpoint (GGUF in float16 or a safetensors directory in bfloat16) and
loads it into a bfloat16 model, reporting peak host memory. Run as a separate process by
test_streamed_loading.py, so the peak is this load's alone:

    python peak_load.py write gguf|hf DIR     writes DIR/m.gguf or DIR/hf (in its own process)
    python peak_load.py load PATH [eager]     one JSON line with the byte counts; `eager` first reads
                                              every tensor into a dict, as the loaders did before
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 1024, 4096, 4, 16, 4, 8192


def shapes() -> dict[str, tuple[int, ...]]:
    """HF names and shapes (tied embeddings)."""
    kv = HIDDEN // HEADS * KV_HEADS
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        out |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (kv, HIDDEN),
                p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
                p + "mlp.down_proj.weight": (HIDDEN, INTER), p + "input_layernorm.weight": (HIDDEN,),
                p + "post_attention_layernorm.weight": (HIDDEN,)}
    return out


_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm"}


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    kind, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_NAMES[kind]}.{suffix}"


def write_gguf(path: Path) -> None:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_name("synthetic")
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_context_length(256)
    w.add_vocab_size(VOCAB)
    for name, shape in shapes().items():
        w.add_tensor(_gguf_name(name),
                     np.full(shape, 0.01, dtype=np.float16 if len(shape) == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_hf(path: Path) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({n: torch.full(s, 0.01, dtype=torch.bfloat16) for n, s in shapes().items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "tie_word_embeddings": True, "max_position_embeddings": 256}))


def _status_bytes(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # reported in kB


def reset_peak() -> int:
    """Resets the peak RSS (VmHWM) to the current RSS (Linux: clear_refs 5) and returns it."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def peak_rss() -> int:
    return _status_bytes("VmHWM")


def target(kind: str, where: Path) -> Path:
    return where / "m.gguf" if kind == "gguf" else where / "hf"


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1] == "write":
        kind, where = sys.argv[2], Path(sys.argv[3])
        (write_gguf if kind == "gguf" else write_hf)(target(kind, where))
        return
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.llama import LlamaModel

    path, eager = Path(sys.argv[2]), sys.argv[3:] == ["eager"]
    before = reset_peak()
    ckpt = load_checkpoint(path, progress=False)
    weights = {k: ckpt.weights[k] for k in ckpt.weights} if eager else ckpt.weights
    model = LlamaModel(ckpt.config, weights, torch.bfloat16)
    numel = [int(np.prod(s)) for s in shapes().values()]
    files = [path] if path.is_file() else list(path.iterdir())
    print(json.dumps({"before": before, "after": peak_rss(),
                      "file_bytes": sum(f.stat().st_size for f in files),
                      "model_bytes": sum(numel) * 2, "largest_fp32_bytes": max(numel) * 4,
                      "all_fp32_bytes": sum(numel) * 4, "dtype": str(model.embed.dtype)}))


if __name__ == "__main__":
    main()
