"""The benchmark's systems as scheduler + KV configs, mirroring engine.bench.systems.engine_target:
`static` is the scheduler's static mode over the no-cache KV manager; host (and disk) tiers only in
codesign."""

from __future__ import annotations

from dataclasses import dataclass

from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.scheduler import SchedulerConfig

MODES = ("static", "continuous", "continuous+lru", "codesign")
SIM_DISK_DIR = "<simulated>"  # the disk tier exists when a directory is set; the sim's NullMover never touches it


@dataclass
class Sizing:
    """Pools and limits (bench.systems.Sizing's fields and defaults: WORKLOADS.md's CPU-scale values)."""

    kv_cache_tokens: int = 24576
    host_cache_tokens: int = 65536
    disk_cache_tokens: int = 262144
    static_batch: int = 16
    fill_timeout_s: float = 0.5
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    disk: bool = False  # the bench leaves the disk tier off unless a directory is given


def build_configs(mode: str, sizing: Sizing, kv_overrides: dict | None = None) -> tuple[SchedulerConfig, KVConfig]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    sched_kw: dict = {"max_num_seqs": sizing.max_num_seqs, "max_num_batched_tokens": sizing.max_num_batched_tokens}
    if mode == "static":
        sched_kw.update(mode="static", static_batch_size=sizing.static_batch, static_fill_timeout_s=sizing.fill_timeout_s)
    codesign = mode == "codesign"
    kv = KVConfig(mode="continuous" if mode == "static" else mode,
                  host_cache_tokens=sizing.host_cache_tokens if codesign else 0,
                  disk_dir=SIM_DISK_DIR if codesign and sizing.disk else None,
                  disk_cache_tokens=sizing.disk_cache_tokens, **(kv_overrides or {}))
    return SchedulerConfig(**sched_kw), kv
