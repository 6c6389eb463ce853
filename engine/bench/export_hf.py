"""Writes a checkpoint as a Hugging Face Llama directory (config.json, model.safetensors, tokenizer files),
for peers that load only that format (vLLM's CPU backend). The weights come from the project's own
loader, already HF-named and in HF's rotate-half q/k layout, so greedy output matches transformers.

    python -m kvloop.engine.bench.export_hf OUT_DIR [--model PATH]   # default: the embedded SmolLM2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def hf_config(cfg) -> dict:
    """A LlamaConfig-shaped config.json for a ModelConfig."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position,
        "attention_bias": cfg.attention_bias,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def export(out: Path, model: str | None = None) -> Path:
    from safetensors.torch import save_file

    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import resolve_model_path
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    ckpt = load_checkpoint(resolve_model_path(model), progress=False)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(ckpt.config), indent=2))
    save_file({name: ckpt.weights[name].contiguous() for name in ckpt.weights},
              str(out / "model.safetensors"))
    tok = Tokenizer.from_source(ckpt.tokenizer_source)
    tok.backend.save(str(out / "tokenizer.json"))
    eos = [tok.backend.id_to_token(i) for i in sorted(tok.eos_token_ids)]
    bos = tok.backend.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos[0] if eos else None,
        "add_bos_token": tok.add_bos,
        "chat_template": ckpt.tokenizer_source.get("chat_template"),
        "model_max_length": ckpt.config.max_position,
    }, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", default=None, help="a .gguf file or HF directory (default: the embedded model)")
    args = p.parse_args(argv)
    print(export(args.out, args.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
