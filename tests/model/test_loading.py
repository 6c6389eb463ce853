"""Loaders: GGUF metadata and fingerprint; a Hugging Face directory gives the same model as the GGUF."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import one_prompt_logits

from kvloop.engine.model.checkpoint import load_checkpoint
from kvloop.engine.model.gguf_loader import unpermute_rotary
from kvloop.engine.model.llama import LlamaModel


def test_embedded_config(checkpoint):
    cfg = checkpoint.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3,
                                                                                                64)
    assert cfg.vocab_size == 49152 and cfg.rope_theta == 100000.0 and cfg.tie_embeddings
    assert len(checkpoint.fingerprint) == 32


def test_fingerprint_is_stable(checkpoint):
    again = load_checkpoint(checkpoint.path, progress=False)
    assert again.fingerprint == checkpoint.fingerprint


def test_unpermute_inverts_llama_cpp_permutation():
    n_head, rows, cols = 3, 12, 5
    w = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    # llama.cpp's
    permuted = w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    assert np.array_equal(unpermute_rotary(permuted, n_head), w)


def test_hf_directory_loads_the_same_model(tmp_path, hf_model, checkpoint, fp32_model, tokenizer):
    # transformers refuses save_pretrained on a GGUF-loaded model, so write the directory by hand from its
    # own (independently un-permuted) state dict and config.
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    hf_model.config.to_json_file(str(tmp_path / "config.json"))
    (tmp_path / "tokenizer.json").write_text(tokenizer.backend.to_str())
    loaded = load_checkpoint(tmp_path, progress=False)
    assert loaded.config.num_layers == 30 and loaded.config.tie_embeddings
    assert not list(tmp_path.glob("*.bin"))
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    from_json = Tokenizer.from_source(loaded.tokenizer_source)
    text = "Tokenizers from tokenizer.json: 42 ünïcode"
    assert from_json.encode(text) == tokenizer.encode(text)
    model = LlamaModel(loaded.config, loaded.weights, torch.float32)
    ids = tokenizer.encode("Paris is the capital of")
    assert (one_prompt_logits(model, ids) - one_prompt_logits(fp32_model, ids)).abs().max().item() <= 1e-5


def test_unsupported_inputs_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path, progress=False)  # no config.json
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="unsupported"):
        load_checkpoint(bad, progress=False)
