"""The engine reads the engine.yaml the operator renders: every key maps, and typos are errors."""

from __future__ import annotations

import pytest
import yaml

from kvloop.engine.engine_core import apply_pool_sizes
from kvloop.engine.settings_file import SettingsFileError, load_engine_settings
from kvloop.operator.render import engine_config
from kvloop.operator.spec import with_defaults

SAMPLE = {"model": {"source": "embedded"}, "replicas": 1,
          "engine": {"kvCache": {"devicePoolMiB": 64, "hostPoolMiB": 32,
                                 "disk": {"enabled": True, "sizeGiB": 1}}}}


def test_operator_rendered_file_maps_to_the_engine_config(tmp_path):
    spec = with_defaults(SAMPLE)
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(engine_config("demo", spec)))
    config, extras = load_engine_settings(path)
    assert config.model is None  # embedded
    assert config.control_file and config.control_file.endswith("control.bin")
    assert config.kv.disk_dir is not None and config.device_pool_mib == 64
    assert extras["served_name"]
    apply_pool_sizes(config, kv_bytes_per_token=46080)  # SmolLM2 in fp32
    assert config.kv_cache_tokens == 64 * 2**20 // 46080 // 16 * 16
    assert config.kv.host_cache_tokens == 32 * 2**20 // 46080 // 16 * 16


def test_unknown_keys_are_errors(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"scheduler": {"max_num_seqz": 3}}))
    with pytest.raises(SettingsFileError, match="max_num_seqz"):
        load_engine_settings(path)


def test_the_same_settings_as_flags_or_file_make_the_same_config(tmp_path):
    """The compiled step's cache key comes from the configuration the engine is built with, so settings
    given as flags and the same settings in engine.yaml must make the same configuration (a start with
    --config then loads the step a start with flags compiled)."""
    import argparse
    import dataclasses

    from kvloop.engine.cli import add_engine_args, engine_config_from_args

    settings = {"dtype": "float32", "block_size": 32, "kv_dtype": "bfloat16", "quantization": "none",
                "compile": "off", "max_model_len": 4096,
                "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "mode": "continuous+lru"}}
    flags = ["--dtype", "float32", "--block-size", "32", "--kv-dtype", "bfloat16", "--quantization", "none",
             "--compile", "off", "--max-model-len", "4096", "--max-num-seqs", "16",
             "--max-num-batched-tokens", "1024", "--mode", "continuous+lru"]
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    from_flags = engine_config_from_args(parser.parse_args(flags))
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(settings))
    from_file, _ = load_engine_settings(path)
    assert dataclasses.replace(from_file, progress=from_flags.progress) == from_flags
