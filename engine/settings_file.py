"""The engine's settings file: the `engine.yaml` the operator renders into the pod's ConfigMap.

`kvloop serve --config FILE` reads it in place of the engine flags (server flags such as --host and
--port still apply). Unknown keys are an error (a typo should not be silently ignored); every key is
optional."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kvloop.engine.config import EngineConfig
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.config import SchedulerConfig

_TOP = {"model", "device", "dtype", "block_size", "max_model_len", "scheduler", "kv_cache", "control", "log_level",
        "instance", "quantization", "kv_dtype"}


class SettingsFileError(ValueError):
    pass


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
    unknown = set(raw) - _TOP
    if unknown:
        raise SettingsFileError(f"{path}: unknown keys {sorted(unknown)}")
    model = _section(raw, "model", {"source", "path", "served_name", "format"})
    sched = _section(raw, "scheduler", {"mode", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill"})
    kv = _section(raw, "kv_cache", {"device_pool_mib", "host_pool_mib", "disk_dir", "disk_size_gib",
                                    "admit_min_requests", "host_admit_min_requests", "min_prefix_tokens",
                                    "retention_watermark"})
    control = _section(raw, "control", {"path", "targets_stale_after_s"})
    mode = sched.get("mode")
    sched_cfg = SchedulerConfig(
        max_num_seqs=int(sched.get("max_num_seqs", 64)),
        max_num_batched_tokens=int(sched.get("max_num_batched_tokens", 512)),
        max_model_len=int(raw.get("max_model_len", 8192)),
    )
    if sched.get("chunked_prefill") is False:  # no chunking: a whole prompt must fit one step's budget
        sched_cfg.max_num_batched_tokens = max(sched_cfg.max_num_batched_tokens, sched_cfg.max_model_len)
    kv_cfg = KVConfig(
        admit_min_requests=int(kv.get("admit_min_requests", 3)),
        host_admit_min_requests=int(kv.get("host_admit_min_requests", 1)),
        min_prefix_tokens=int(kv.get("min_prefix_tokens", 64)),
        watermark=float(kv.get("retention_watermark", 0.1)),
        disk_dir=kv.get("disk_dir"),
    )
    source = model.get("source", "embedded")
    config = EngineConfig(
        model=None if source == "embedded" else model.get("path"),
        dtype=raw.get("dtype", "auto"),
        kv_dtype=raw.get("kv_dtype", "auto"),
        device=raw.get("device", "cpu"),
        block_size=int(raw.get("block_size", 16)),
        quantization=raw.get("quantization", "none"),
        scheduler=sched_cfg,
        kv=kv_cfg,
        mode=None if mode in (None, "auto") else mode,
        device_pool_mib=kv.get("device_pool_mib"),
        host_pool_mib=kv.get("host_pool_mib"),
        disk_pool_gib=kv.get("disk_size_gib") if kv.get("disk_dir") else None,
        control_file=control.get("path"),
        control_stale_after_s=float(control.get("targets_stale_after_s", 120.0)),
        progress=False,
    )
    extras = {"served_name": model.get("served_name"), "log_level": raw.get("log_level")}
    return config, extras
