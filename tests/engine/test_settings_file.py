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
