"""The engine's settings file: the `engine.yaml` the operator renders into the pod's ConfigMap.

`kvloop serve --config FILE` reads it in place of the engine flags (server flags such as --host and
--port still apply). Unknown keys are an error (a typo should not be silently ignored); every key is
optional."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.config_options import ConfigOption, build_config, config_options

# Keys that are not config fields: the model's source (an embedded model ignores model.path), its served
# name and the log level (the server's), chunked_prefill (below), and keys kept for people reading the file.
_OTHER_KEYS = ("model.source", "model.served_name", "model.format", "scheduler.chunked_prefill", "log_level",
               "instance")


class SettingsFileError(ValueError):
    pass


def _setting_options() -> list[ConfigOption]:
    """The config fields the file may set: those declared with a `setting` key."""
    return [o for o in config_options(EngineConfig) if o.option.setting]


def _allowed_keys(options: list[ConfigOption]) -> dict[str, set[str]]:
    """Top-level key -> the keys allowed in its section (empty: a plain value)."""
    allowed: dict[str, set[str]] = {}
    for key in [o.option.setting for o in options] + list(_OTHER_KEYS):
        top, _, sub = key.partition(".")
        allowed.setdefault(top, set()).update([sub] if sub else [])
    return allowed


def _section(raw: dict, key: str, allowed: set[str]) -> dict:
    section = raw.get(key) or {}
    if not isinstance(section, dict):
        raise SettingsFileError(f"{key}: expected a mapping")
    unknown = set(section) - allowed
    if unknown:
        raise SettingsFileError(f"{key}: unknown keys {sorted(unknown)}")
    return section


def load_engine_settings(path: str | Path) -> tuple[EngineConfig, dict[str, Any]]:
    """Returns the engine configuration and the server-level extras (served model name, log level)."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise SettingsFileError(f"{path}: expected a mapping at the top level")
    options = _setting_options()
    allowed = _allowed_keys(options)
    unknown = set(raw) - set(allowed)
    if unknown:
        raise SettingsFileError(f"{path}: unknown keys {sorted(unknown)}")
    sections = {top: _section(raw, top, keys) for top, keys in allowed.items() if keys}
    values: dict[str, Any] = {}
    for opt in options:
        top, _, key = opt.option.setting.partition(".")
        value = sections[top].get(key) if key else raw.get(top)
        if value is None:  # absent or null: the field's default
            continue
        try:
            values[opt.path] = opt.coerce(value)
        except (TypeError, ValueError) as exc:
            raise SettingsFileError(f"{opt.option.setting}: {exc}") from exc
    if sections["model"].get("source", "embedded") == "embedded":
        values.pop("model", None)
    if values.get("mode") == "auto":  # the scheduler follows the KV manager's (default) mode
        del values["mode"]
    if not values.get("kv.disk_dir"):  # the operator writes a size of 0 for a disabled disk tier
        values.pop("disk_pool_gib", None)
    try:
        config = build_config(EngineConfig, {**values, "progress": False})
    except (TypeError, ValueError) as exc:
        raise SettingsFileError(f"{path}: {exc}") from exc
    sched = config.scheduler
    if sections["scheduler"].get("chunked_prefill") is False:  # no chunking: a whole prompt fits one step
        sched.max_num_batched_tokens = max(sched.max_num_batched_tokens, sched.max_model_len)
    extras = {"served_name": sections["model"].get("served_name"), "log_level": raw.get("log_level")}
    return config, extras
