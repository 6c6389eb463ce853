"""Llama, Mistral and Qwen2 (q/k/v bias) Hugging Face directories: our logits equal transformers' in fp32."""

from __future__ import annotations

import pytest
import torch
from kvloop.engine.model.checkpoint import load_checkpoint
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.runner.attention_meta import AttentionMetadata, PrefillChunk

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
    config = getattr(transformers, f"{arch}Config")(**TINY, rope_theta=5000.0, tie_word_embeddings=arch == "Qwen2")
    reference = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    reference.save_pretrained(tmp_path, safe_serialization=True)
    checkpoint = load_checkpoint(tmp_path, progress=False)
    assert checkpoint.config.attention_bias == (arch == "Qwen2")
    ours = LlamaModel(checkpoint.config, checkpoint.weights, torch.float32)
    ids = [3, 17, 99, 4, 250, 7, 7, 31, 64, 128, 5, 9, 11, 200, 1, 2, 3, 4, 5, 6, 8]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    assert (logits_of(ours, ids) - expected).abs().max().item() <= 1e-4
