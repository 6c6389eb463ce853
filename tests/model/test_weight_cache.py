"""The converted-weights cache (model/weight_cache.py): a cached model's weights are bit-identical to freshly
converted ones, and a truncated or garbled cache file is converted again (logged), never used."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import torch

from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.model.registry import build_model
from kvloop.engine.model.weight_cache import ENV, UNUSED_DAYS

CFG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2,
                  head_dim=16, tie_embeddings=True, max_position=64, attention_bias=True)
FINGERPRINT = "test-weights-0"


def flat(value, name: str = "") -> dict[str, object]:
    """Every tensor and scalar setting under the converted parts, by path."""
    if isinstance(value, torch.Tensor):
        return {name: value}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{name}[{i}]").items()}
    if hasattr(value, "__dict__"):
        return {k: v for key, item in vars(value).items() for k, v in flat(item, f"{name}.{key}").items()}
    return {name: value}


def converted(model: LlamaModel) -> dict[str, object]:
    return flat([getattr(model, name) for name in LlamaModel.CONVERTED])


def assert_identical(cached: LlamaModel, fresh: LlamaModel) -> None:
    a, b = converted(cached), converted(fresh)
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key  # bits, NaNs included
        else:
            assert a[key] == b[key], key
    assert (cached.embed is cached.lm_head) == (fresh.embed is fresh.lm_head)  # a tied head stays one copy


def build(quantization: str) -> LlamaModel:
    return build_model(CFG, random_weights(CFG, 0), torch.float32, "cpu", "auto", quantization,
                       cache_fingerprint=FINGERPRINT)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv(ENV, str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("quantization", ["none", "bf16", "int8"])
def test_cached_weights_are_bit_identical_to_converted_ones(cache: Path, quantization: str, caplog):
    fresh = build_model(CFG, random_weights(CFG, 0), torch.float32, "cpu", "auto", quantization)
    first = build(quantization)  # converts and writes the cache
    assert len(list(cache.glob("*.pt"))) == 1
    with caplog.at_level(logging.INFO, logger="kvloop.engine"):
        cached = build(quantization)
    assert "read the converted weights from the cache" in caplog.text
    assert_identical(first, fresh)
    assert_identical(cached, fresh)
    ids = torch.tensor([1, 5, 7])
    assert torch.equal(cached.lm_head(cached.embed[ids].float()), fresh.lm_head(fresh.embed[ids].float()))


@pytest.mark.parametrize("damage", ["truncate", "garble", "no checksum"])
def test_a_damaged_cache_file_is_converted_again(cache: Path, damage: str, caplog):
    fresh = build("bf16")
    (path,) = cache.glob("*.pt")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garble":  # one byte in the middle (tensor data), the file's size unchanged
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    else:
        path.with_name(path.name + ".sha256").unlink()
    with caplog.at_level(logging.INFO, logger="kvloop.engine"):
        rebuilt = build("bf16")
    assert "are unusable" in caplog.text and "converted in" in caplog.text
    assert_identical(rebuilt, fresh)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvloop.engine"):
        assert_identical(build("bf16"), fresh)  # the rewritten file is good again
    assert "read the converted weights from the cache" in caplog.text


def test_a_different_weight_format_or_fingerprint_is_another_file(cache: Path):
    build("bf16")
    build("none")
    build_model(CFG, random_weights(CFG, 1), torch.float32, "cpu", "auto", "bf16", cache_fingerprint="other")
    assert len(list(cache.glob("*.pt"))) == 3


def test_off_converts_without_a_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(ENV, "off")
    monkeypatch.chdir(tmp_path)
    build("bf16")
    assert not list(tmp_path.rglob("*.pt"))


def test_files_unused_for_long_are_pruned_on_a_write(cache: Path):
    stale = cache / "0123.pt"
    stale.write_bytes(b"old")
    old = time.time() - (UNUSED_DAYS + 1) * 86400
    os.utime(stale, (old, old))
    build("bf16")  # reads nothing, writes its file and prunes
    assert not stale.exists()
    assert len(list(cache.glob("*.pt"))) == 1
