"""The config dataclasses are the one source of each default: the `kvloop` engine flags and the settings
file's keys are generated from their option fields, and neither writes a default of its own."""

from __future__ import annotations

import argparse

import pytest
import yaml

from kvloop.engine.cli import add_engine_args, engine_config_from_args
from kvloop.engine.config import EngineConfig
from kvloop.engine.core.config_options import config_options
from kvloop.engine.settings_file import SettingsFileError, load_engine_settings


def parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(list(argv)))


def test_no_flags_and_an_empty_file_give_the_dataclass_defaults(tmp_path):
    assert parse() == EngineConfig()
    path = tmp_path / "engine.yaml"
    path.write_text("")
    assert load_engine_settings(path)[0] == EngineConfig(progress=False)


def test_flags_reach_nested_fields_under_their_existing_names():
    config = parse("--max-num-seqs", "3", "--max-num-batched-tokens", "99", "--control-stale-after", "5",
                   "--mode", "static", "--dtype", "float32", "--threads", "2", "--idle-step-tokens", "0")
    assert config.scheduler.max_num_seqs == 3 and config.scheduler.max_num_batched_tokens == 99
    assert config.scheduler.idle_step_tokens == 0
    assert config.control_stale_after_s == 5.0 and config.threads == 2 and config.dtype == "float32"
    assert config.scheduler.mode == "static" and config.kv.mode == "continuous"  # the policy sets both


def test_mode_choices_are_the_policy_registry():
    from kvloop.engine.core.policy import policy_names

    mode = next(o for o in config_options(EngineConfig) if o.path == "mode")
    assert mode.option.choice_list() == list(policy_names())
    with pytest.raises(SystemExit):
        parse("--mode", "no-such-policy")


def test_settings_keys_map_to_fields_and_values_take_the_field_type(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"max_model_len": "4096", "scheduler": {"mode": "auto", "max_num_seqs": 8},
                                    "kv_cache": {"retention_watermark": 0.25, "host_pool_mib": 32},
                                    "control": {"path": "/c.bin"}}))
    config, _ = load_engine_settings(path)
    assert config.scheduler.max_model_len == 4096 and config.scheduler.max_num_seqs == 8
    assert config.kv.watermark == 0.25 and config.host_pool_mib == 32.0 and config.control_file == "/c.bin"
    assert config.mode is None and config.kv.mode == "codesign"  # auto: the default policy


def test_bad_values_name_their_key(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"scheduler": {"max_num_seqs": "many"}}))
    with pytest.raises(SettingsFileError, match="scheduler.max_num_seqs"):
        load_engine_settings(path)
