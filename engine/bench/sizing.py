"""Pool and batch sizes of a benchmark run, and the scheduler + KV configs each mode means (pure Python).

One definition for the real engine (bench.systems) and the simulator (sim.modes), so a mode is the same
configuration in both, read from its policy (scheduler.policy): `static` is the scheduler's static mode
over the no-cache KV manager; the host and disk tiers are sized only for cache policies with lower tiers
(`codesign`); the decode cascade scope is the policy's (nested shared prefixes in `codesign`, only the
prefix common to every decode row in `continuous+lru`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvloop.engine.core import defaults as D
from kvloop.engine.core.policy import get_policy
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.config import SchedulerConfig


@dataclass
class Sizing:
    """WORKLOADS.md's "under pressure" pools and static batches, the engine's default batch cap and the
    benchmarks' step budget (engine/core/defaults.py says why it is not the engine's); `scaled` multiplies
    the pools."""

    kv_cache_tokens: int = 24576
    host_cache_tokens: int = 65536
    disk_cache_tokens: int = 262144
    static_batch: int = 16
    fill_timeout_s: float = 0.5
    max_num_seqs: int = D.BATCH_CAP.value
    max_num_batched_tokens: int = D.BENCH_STEP_TOKEN_BUDGET.value
    max_context: int = 4096  # longest prompt + output of the workload (llama.cpp per-slot context)
    # codesign: rows past the batch cap within its priced budget, at most x cap
    cascade_cap_factor: float = 2.0
    # admission holds the decode step time near this (scheduler/tpot_gate.py)
    tpot_target_ms: float | None = None
    # a step's budget while nothing decodes (None: the scheduler's default)
    idle_step_tokens: int | None = None
    disk_dir: str | None = None  # the disk tier is off unless a directory is given
    queue_order: str | None = None  # the scheduler's waiting-queue order (None: its default)

    def scaled(self, f: float) -> Sizing:
        def s(x: int) -> int:
            return max(256, int(x * f) // 16 * 16)

        return dataclasses.replace(self, kv_cache_tokens=s(self.kv_cache_tokens),
                                   host_cache_tokens=s(self.host_cache_tokens),
                                   disk_cache_tokens=s(self.disk_cache_tokens))


def mode_configs(mode: str, sizing: Sizing, kv_overrides: dict | None = None) -> tuple[SchedulerConfig,
                                                                                       KVConfig]:
    policy = get_policy(mode)
    sched_kw: dict = {"max_num_seqs": sizing.max_num_seqs,
                      "max_num_batched_tokens": sizing.max_num_batched_tokens,
                      "cascade_groups": policy.cascade_groups,
                      "cascade_cap_factor": sizing.cascade_cap_factor,
                      "tpot_target_ms": sizing.tpot_target_ms}
    if sizing.idle_step_tokens is not None:
        sched_kw["idle_step_tokens"] = sizing.idle_step_tokens
    if sizing.queue_order is not None:
        sched_kw["queue_order"] = sizing.queue_order
    if policy.static_batching:  # else the scheduler follows the KV manager's mode (auto)
        sched_kw.update(mode=policy.name, static_batch_size=sizing.static_batch,
                        static_fill_timeout_s=sizing.fill_timeout_s)
    lower = policy.cache.lower_tiers
    kv_kw: dict = {"mode": policy.cache.name, "host_cache_tokens": sizing.host_cache_tokens if lower else 0,
                   "disk_dir": sizing.disk_dir if lower else None,
                   "disk_cache_tokens": sizing.disk_cache_tokens}
    kv = KVConfig(**{**kv_kw, **(kv_overrides or {})})  # an override may also resize or switch off a tier
    return SchedulerConfig(**sched_kw), kv
