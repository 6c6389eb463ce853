"""The benchmark's modes as scheduler + KV configs. The KV side has its own mode names; `static`
needs the scheduler's static mode (issue 4) and is refused until the scheduler has one."""

from __future__ import annotations

import dataclasses

from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.scheduler import SchedulerConfig

MODES = ("static", "continuous", "continuous+lru", "codesign")


def scheduler_supports(field: str) -> bool:
    return any(f.name == field for f in dataclasses.fields(SchedulerConfig))


def build_configs(mode: str, sched: dict | None = None, kv: dict | None = None) -> tuple[SchedulerConfig, KVConfig]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    sched = dict(sched or {})
    kv = dict(kv or {})
    if scheduler_supports("mode"):
        sched.setdefault("mode", mode)
    elif mode == "static":
        raise ValueError("the scheduler has no static mode yet (issue 4)")
    kv.setdefault("mode", "continuous" if mode == "static" else mode)
    sched = {k: v for k, v in sched.items() if scheduler_supports(k)}  # options a newer scheduler takes
    return SchedulerConfig(**sched), KVConfig(**kv)
