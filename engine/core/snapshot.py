"""The engine's state at one moment, typed: what Prometheus, the control block, the benchmark harness and
the simulator's results read. scheduler/snapshot.py's `build_snapshot` is the one place it is made, for
EngineCore and the Simulator alike (pure Python, no torch).

Counters are cumulative since the engine started; gauges are the value now. Prefix queries and hits are
in prompt tokens, per tier as engine.core.kv_stats defines them (a lower tier is asked only for what the
tiers above it did not serve)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvloop.engine.core.kv_stats import TIERS, KVStats


@dataclass(frozen=True)
class EngineSnapshot:
    # scheduler
    num_waiting: int = 0
    num_running: int = 0
    num_decoding: int = 0  # running requests past their prefill (each decodes one token a step)
    batch_cap: int = 0  # the live cap on running requests (static mode: the batch size)
    step_token_budget: int = 0  # tokens one step may schedule (the prefill chunk size), now
    step_token_budget_max: int = 0  # the configured budget: the live knob's ceiling
    max_model_len: int = 0  # longest request (prompt + output) the engine accepts
    scheduler_mode: str = ""
    num_preemptions: int = 0
    num_preemptions_by_kind: Mapping[str, int] = field(default_factory=dict)  # "swap" / "recompute"
    num_rejections: int = 0  # requests refused at add (too long, queue full, ...)
    num_oom_events: int = 0  # static mode's reservations that did not fit the pool
    tpot_target_s: float = 0.0  # the TPOT target admission holds (0: none; scheduler/tpot_gate.py)
    decode_step_s: float = 0.0  # the gate's recent decode step time (0: no target, or no step yet)
    tpot_holds: int = 0  # admission attempts the TPOT target held back
    requests_finished: int = 0  # any finish reason: stop, length, abort, error
    tokens_generated: int = 0  # output tokens of the finished requests
    slo_good: int = 0  # finished requests that met the SLO (core/slo.py; aborts are not judged)
    slo_missed: Mapping[str, int] = field(default_factory=dict)  # MISS_REASONS -> requests that missed
    slo_slack_sum: float = 0.0  # sum of the judged requests' SLO slack (Slo.slack): the low-traffic proxy
    slo_slack_count: int = 0
    # engine
    num_steps: int = 0  # model steps run
    step_failures: int = 0  # steps whose model forward raised (their requests failed)
    request_failures: Mapping[str, int] = field(default_factory=dict)  # stage -> requests failed alone
    # prompt-lookup speculation (engine/scheduler/speculation.py): its mode, the live cap on proposals per
    # row and step, and vLLM's spec_decode counters (steps a row verified proposals in, proposed tokens,
    # accepted ones, accepted ones by position 0..)
    speculation: str = "off"
    speculation_max_tokens: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()
    # KV cache
    kv_mode: str = ""  # the cache policy
    prefix_cache: bool = False
    watermark: float = 0.0  # retention watermark, share of the device pool
    kv_usage: float = 0.0  # share of the device pool held by running requests
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0  # not referenced: free plus cached
    kv_blocks_pending: int = 0  # blocks the running requests' prompts still need (the rest of their prefill)
    block_size: int = 0  # tokens per block
    kv_cached_blocks: int = 0  # cached, unreferenced (evictable)
    kv_host_blocks_used: int = 0
    kv_host_blocks_total: int = 0  # 0: no host tier
    kv_disk_blocks_used: int = 0
    kv_disk_blocks_total: int = 0  # 0: no disk tier
    kv_ghost_entries: int = 0
    kv_stats: KVStats = field(default_factory=KVStats)  # a copy of the KV manager's counters

    def prefix_queries(self, tier: str) -> int:
        return self.kv_stats.queries(tier)

    def prefix_hits(self, tier: str) -> int:
        return self.kv_stats.hits(tier)

    def kv_use(self, tier: str) -> float | None:
        """Share of a tier in use, 0..1 (the device: held by running requests); None: no such tier."""
        if tier == "device":
            return self.kv_usage
        total = self.kv_host_blocks_total if tier == "host" else self.kv_disk_blocks_total
        used = self.kv_host_blocks_used if tier == "host" else self.kv_disk_blocks_used
        return used / total if total else None

    def kv_use_by_tier(self) -> dict[str, float]:
        """The tiers this engine has, with their use."""
        return {t: u for t in TIERS if (u := self.kv_use(t)) is not None}
