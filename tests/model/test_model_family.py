"""Llama, Mistral and Qwen2 (q/k/v bias) Hugging Face directories: the model registry builds each from its
architecture name, and our logits equal transformers' in fp32."""

from __future__ import annotations

import pytest
import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.model.checkpoint import load_checkpoint
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.model.registry import architectures, build_model, model_class

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)


def logits_of(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    kv = model.new_kv_cache(8, 4)
    table = torch.tensor([5, 1, 7, 2, 0, 3])  # non-contiguous blocks
    slots = torch.tensor([int(table[i // 4]) * 4 + i % 4 for i in range(len(ids))])
    meta = AttentionMetadata(slots, 0, torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                             [PrefillChunk(0, len(ids), len(ids), table[: (len(ids) + 3) // 4])])
    return model.logits(model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, kv))


@pytest.mark.parametrize("arch", ["Llama", "Mistral", "Qwen2"])
def test_hf_family_matches_transformers(tmp_path, arch):
    torch.manual_seed(0)
    config = getattr(transformers, f"{arch}Config")(**TINY, rope_theta=5000.0,
                                                    tie_word_embeddings=arch == "Qwen2")
    reference = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    reference.save_pretrained(tmp_path, safe_serialization=True)
    checkpoint = load_checkpoint(tmp_path, progress=False)
    assert checkpoint.config.attention_bias == (arch == "Qwen2")
    assert checkpoint.config.architecture == f"{arch}ForCausalLM"
    ours = build_model(checkpoint.config, checkpoint.weights, torch.float32)
    assert isinstance(ours, LlamaModel)
    ids = [3, 17, 99, 4, 250, 7, 7, 31, 64, 128, 5, 9, 11, 200, 1, 2, 3, 4, 5, 6, 8]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    assert (logits_of(ours, ids) - expected).abs().max().item() <= 1e-4


def test_registry_knows_both_formats_names():
    assert {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"} <= set(architectures("hf"))
    assert {"llama", "mistral", "qwen2"} <= set(architectures("gguf"))
    assert model_class("llama") is model_class("Qwen2ForCausalLM") is LlamaModel


def test_unknown_architecture_is_a_clear_error():
    cfg = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, architecture="GemmaForCausalLM")
    with pytest.raises(ValueError,
                       match=r"unknown model architecture 'GemmaForCausalLM'; known: LlamaForCausalLM"):
        build_model(cfg, random_weights(cfg, 0), torch.float32)
