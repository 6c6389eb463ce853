"""An empty InferenceService runs what `kvloop serve` and `kvloop sidecar` run with no flags (`make serve`):
the engine.yaml the operator renders gives exactly the engine configuration of `kvloop serve`'s defaults,
and the sidecar.yaml exactly `kvloop sidecar`'s default settings. Both sides read engine/core/defaults.py."""

from __future__ import annotations

import dataclasses

import yaml

from kvloop.engine.cli import build_parser, engine_config_from_args
from kvloop.engine.config import EngineConfig
from kvloop.engine.core.config_options import config_options
from kvloop.engine.core.defaults import EMBEDDED_KV_BYTES_PER_TOKEN
from kvloop.engine.core.policy import resolve_policy
from kvloop.engine.engine_core import apply_pool_sizes
from kvloop.engine.settings_file import load_engine_settings
from kvloop.operator.render import engine_config, sidecar_config
from kvloop.operator.spec import with_defaults
from kvloop.sidecar.settings import Settings, parse_settings

# Where a pod differs from a local run by place, not by policy: the control block's path (`make serve`
# passes its own), the model's location (the embedded one in both) and the progress bars.
PLACE = ("control_file", "model", "progress")


def engine_view(config: EngineConfig) -> dict:
    """The configuration as the engine runs it: pools in MiB become tokens of the embedded model's bf16 KV
    (as EngineCore does at start), the policy resolved from the scheduler's and the KV manager's modes."""
    apply_pool_sizes(config, EMBEDDED_KV_BYTES_PER_TOKEN)
    view = dataclasses.asdict(config)
    for key in (*PLACE, "device_pool_mib", "host_pool_mib", "disk_pool_gib", "mode"):
        view.pop(key)
    view["scheduler"]["mode"] = resolve_policy(config.scheduler.mode, config.kv.mode).name
    return view


def rendered_engine(tmp_path) -> EngineConfig:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(engine_config("svc", with_defaults({}))))
    return load_engine_settings(path)[0]


def test_an_empty_inference_service_runs_kvloop_serves_engine(tmp_path):
    serve = engine_config_from_args(build_parser().parse_args(["serve"]))
    pod = rendered_engine(tmp_path)
    assert pod.control_file and pod.device_pool_mib and pod.host_pool_mib  # the operator sets these
    assert engine_view(pod) == engine_view(serve)


def test_every_engine_setting_the_operator_renders_is_a_serve_flag_or_a_pool(tmp_path):
    """So the comparison above covers them: each rendered key is a config option, and where it has a flag
    that flag's default is the value an empty InferenceService renders."""
    rendered = engine_config("svc", with_defaults({}))
    parser = build_parser().parse_args(["serve"])
    by_setting = {o.option.setting: o for o in config_options(EngineConfig) if o.option.setting}
    pod = rendered_engine(tmp_path)
    for section, values in rendered.items():
        for key, value in (values.items() if isinstance(values, dict) else [(None, values)]):
            setting = f"{section}.{key}" if key else section
            opt = by_setting.get(setting)
            # the policy's name is compared resolved (engine_view); the pools are MiB here, tokens as flags
            if opt is None or opt.option.flag is None or opt.path in (*PLACE, "mode") or value is None:
                continue
            assert getattr(parser, opt.dest) == _get(pod, opt.path), setting


def _get(config: EngineConfig, path: str):
    for part in path.split("."):
        config = getattr(config, part)
    return config


def test_an_empty_inference_service_runs_kvloop_sidecars_settings():
    pod = parse_settings(yaml.safe_load(yaml.safe_dump(sidecar_config("svc", with_defaults({})))))
    assert pod.control_path  # the pod's block; `kvloop sidecar --control` names it locally
    assert dataclasses.replace(pod, control_path=None) == Settings()
