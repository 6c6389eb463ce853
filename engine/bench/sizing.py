"""Pool and batch sizes of a benchmark run, and the scheduler + KV configs each mode means (pure Python).

One definition for the real engine (bench.systems) and the simulator (sim.modes), so a mode is the same
configuration in both: `static` is the scheduler's static mode over the no-cache KV manager; the host and
disk tiers exist only in `codesign`; decode cascade covers nested shared prefixes in `codesign` and only
the prefix common to every decode row in `continuous+lru` (scheduler.config.resolve_cascade_groups)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.config import SchedulerConfig, resolve_cascade_groups

ENGINE_MODES = ("static", "continuous", "continuous+lru", "codesign")


@dataclass
class Sizing:
    """WORKLOADS.md's "under pressure" values; `scaled` multiplies the pools."""

    kv_cache_tokens: int = 24576
    host_cache_tokens: int = 65536
    disk_cache_tokens: int = 262144
    static_batch: int = 16
    fill_timeout_s: float = 0.5
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_context: int = 4096  # longest prompt + output of the workload (llama.cpp per-slot context)
    cascade_cap_factor: float = 2.0  # codesign: rows past the batch cap within its priced budget, at most x cap
    disk_dir: str | None = None  # the disk tier is off unless a directory is given

    def scaled(self, f: float) -> Sizing:
        def s(x: int) -> int:
            return max(256, int(x * f) // 16 * 16)

        return dataclasses.replace(self, kv_cache_tokens=s(self.kv_cache_tokens),
                                   host_cache_tokens=s(self.host_cache_tokens),
                                   disk_cache_tokens=s(self.disk_cache_tokens))


def mode_configs(mode: str, sizing: Sizing, kv_overrides: dict | None = None) -> tuple[SchedulerConfig, KVConfig]:
    if mode not in ENGINE_MODES:
        raise ValueError(f"mode must be one of {ENGINE_MODES}")
    sched_kw: dict = {"max_num_seqs": sizing.max_num_seqs, "max_num_batched_tokens": sizing.max_num_batched_tokens,
                      "cascade_groups": resolve_cascade_groups("auto", mode),
                      "cascade_cap_factor": sizing.cascade_cap_factor}
    if mode == "static":
        sched_kw.update(mode="static", static_batch_size=sizing.static_batch,
                        static_fill_timeout_s=sizing.fill_timeout_s)
    codesign = mode == "codesign"
    kv = KVConfig(mode="continuous" if mode == "static" else mode,
                  host_cache_tokens=sizing.host_cache_tokens if codesign else 0,
                  disk_dir=sizing.disk_dir if codesign else None,
                  disk_cache_tokens=sizing.disk_cache_tokens, **(kv_overrides or {}))
    return SchedulerConfig(**sched_kw), kv
