"""The benchmark's systems as scheduler + KV configs: the same `mode_configs` the real engine runs use
(engine.bench.sizing), with the disk tier, when asked for, pointed at a name the sim's NullMover never
touches. The modes themselves are the policy registry's (`scheduler.policy.policy_names()`), read when
needed, so that a policy registered after import is simulated too."""

from __future__ import annotations

from dataclasses import replace

from kvloop.engine.bench.sizing import Sizing, mode_configs
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.config import SchedulerConfig

SIM_DISK_DIR = "<simulated>"

__all__ = ["SIM_DISK_DIR", "Sizing", "build_configs"]


def build_configs(mode: str, sizing: Sizing, kv_overrides: dict | None = None) -> tuple[SchedulerConfig,
                                                                                        KVConfig]:
    return mode_configs(mode, replace(sizing, disk_dir=SIM_DISK_DIR if sizing.disk_dir else None),
                        kv_overrides)
